"""Two served configurations of the default reranker compared from their feature dumps (each
with its own head weights and fusion weight): nDCG@10 of the first stage, the pure reranker and
the fused score per set, and paired randomization tests of the fused score against the first
configuration named.

    python recipes/short/compare.py --config v1=CARD:0.5 --config short=CARD:0.6 \
        --set "NFCorpus dev" v1=DUMP short=DUMP --set "DL19 BM25@100" v1=DUMP short=DUMP

Prints one markdown table.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", action="append", required=True, metavar="NAME=CARD:ALPHA")
    ap.add_argument("--set", nargs="+", action="append", required=True, metavar=("SET", "NAME=DUMP"))
    args = ap.parse_args()

    from heedrank.eval.compare import randomization_test
    from heedrank.eval.study import load_items, ndcg10, variant_run

    configs = {}
    for spec in args.config:
        name, _, rest = spec.partition("=")
        card, _, alpha = rest.rpartition(":")
        pure = {"kind": "linear", "spec": "heads", "weights": json.loads(Path(card).read_text())["weights"],
                "layers": None}
        configs[name] = {"first": {"kind": "first"}, "pure": pure,
                         "fused": {"kind": "interpolate", "alpha": float(alpha), "of": pure}}
    print("| set | configuration | first stage | pure | fused | fused vs the first (W/L, p) |\n|---|---|---|---|---|---|")
    for set_name, *pairs in args.set:
        base = None
        for pair in pairs:
            name, _, path = pair.partition("=")
            meta, items = load_items(path)
            per = {k: ndcg10(items, variant_run(items, v), meta["qrels"]) for k, v in configs[name].items()}
            mean = {k: sum(v.values()) / len(v) for k, v in per.items()}
            if base is None:
                base, versus = per["fused"], ""
            else:
                diffs = [per["fused"][q] - base[q] for q in base]
                wins, losses = sum(d > 1e-9 for d in diffs), sum(d < -1e-9 for d in diffs)
                versus = f"{sum(diffs) / len(diffs):+.2f} ({wins}/{losses}, p {randomization_test(diffs):.3f})"
            print(f"| {set_name} | {name} | {mean['first']:.2f} | {mean['pure']:.2f} | {mean['fused']:.2f} | {versus} |")


if __name__ == "__main__":
    main()

"""Query adapters compared as served: each adapter's feature dumps (``heedrank lab dump
--adapter``) scored with the packaged card's head weights, pure and fused with the first stage
at the card's weight, with paired randomization tests against the first adapter named.

    python recipes/residual/compare.py --set "NFCorpus dev" shipped=DUMP alone=DUMP ... \
        --set "DL19 BM25@100" shipped=DUMP alone=DUMP ...

Prints one markdown table: per set and adapter, nDCG@10 (x100) of the first stage, the pure
reranker and the fused score, and the fused delta (p) against the first adapter.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", nargs="+", action="append", required=True, metavar=("NAME", "ADAPTER=DUMP"))
    ap.add_argument("--card", type=Path, default=ROOT / "reranker" / "data" / "smollm2-135m-instruct.blockrank-cached.json")
    args = ap.parse_args()

    from heedrank.eval.compare import randomization_test
    from heedrank.eval.study import load_items, ndcg10, variant_run

    card = json.loads(args.card.read_text())
    alpha = float(card["fusion"]["alpha"])
    pure = {"kind": "linear", "spec": "heads", "weights": card["weights"], "layers": None}
    variants = {"first": {"kind": "first"}, "pure": pure, "fused": {"kind": "interpolate", "alpha": alpha, "of": pure}}
    print(f"\nQuery adapters as served (head weights and fusion weight {alpha} of {args.card.name})\n")
    print("| set | adapter | first stage | pure | fused | fused vs the first adapter (p) |\n|---|---|---|---|---|---|")
    for name, *pairs in args.set:
        base = None
        for pair in pairs:
            label, _, path = pair.partition("=")
            meta, items = load_items(path)
            per = {k: ndcg10(items, variant_run(items, v), meta["qrels"]) for k, v in variants.items()}
            mean = {k: sum(v.values()) / len(v) for k, v in per.items()}
            if base is None:
                base, versus = per["fused"], ""
            else:
                diffs = [per["fused"][q] - base[q] for q in base]
                versus = f"{sum(diffs) / len(diffs):+.2f} (p {randomization_test(diffs):.3f})"
            print(f"| {name} | {label} | {mean['first']:.2f} | {mean['pure']:.2f} | {mean['fused']:.2f} | {versus} |")


if __name__ == "__main__":
    main()

"""The deciding experiment of issue #23: every candidate-mask variant against today's best
configuration, paired, on the same queries.

Reads feature dumps written by ``heedrank eval study-dump --variant ...`` and weights cards
(``heedrank eval study-fit --features NAME --export CARD``). For each ``--row
LABEL=FEATURES:CARD`` the pure scorer is the card's weights on the dump's
``calibrated@FEATURES`` (its layers when the card names some) and the fused scorer the
interpolation ``alpha z(first stage) + (1 - alpha) z(pure)`` with the alpha chosen on the
dev dump (grid 0, 0.1, ..., 1). The first row is the reference (today's best: the packaged
query adapter's features ``qa`` with the shipped card, alpha from dev); every other row gets
nDCG@10 and the paired randomization test of its difference to the reference, pure and
fused, on each test dump.

    python bench/probe_decide.py --dev runs/probe/nf-dev-hybrid50.npz \\
        --test nf-hybrid50=runs/probe/nf-test-hybrid50.npz --test dl19=runs/probe/dl19-bm25-100.npz \\
        --row "today=qa:reranker/data/smollm2-135m-instruct.blockrank-cached.json" \\
        --row "probe, adapter, refit=qanone:runs/probe/card-qanone.json"
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from heedrank.eval.compare import randomization_test
from heedrank.eval.study import load_items, ndcg10, variant_run, with_features


def pure_variant(card):
    layers = card.get("layers") or list(range(int(card["layer"]) + 1))
    return {"kind": "linear", "spec": "heads", "weights": card["weights"], "layers": layers}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dev", required=True)
    ap.add_argument("--test", action="append", required=True, help="NAME=DUMP")
    ap.add_argument("--row", action="append", required=True, help="LABEL=FEATURES:CARD (the first is the reference)")
    ap.add_argument("--codec-row", action="append", default=[],
                    help="LABEL=TEST:JSONL:POINT:ALPHA: the scores of `bench/probe_codecs.py --out JSONL` at codec POINT "
                         "on test set TEST (fused at ALPHA, chosen on dev), compared with the reference on that set")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dev_meta, dev_items = load_items(args.dev)
    tests = {}
    for t in args.test:
        name, _, path = t.partition("=")
        meta, items = load_items(path)
        tests[name] = (items, meta["qrels"])
    rows = []
    for spec in args.row:
        label, _, rest = spec.partition("=")
        feats, _, card_path = rest.partition(":")
        card = json.loads(Path(card_path).read_text())
        pure = pure_variant(card)
        dev = with_features(dev_items, feats)
        grid = {}
        for a in np.linspace(0.0, 1.0, 11):
            v = {"kind": "interpolate", "alpha": float(a), "of": pure}
            grid[round(float(a), 1)] = float(np.mean(list(ndcg10(dev, variant_run(dev, v), dev_meta["qrels"]).values())))
        alpha = max(grid, key=grid.get)
        fused = {"kind": "interpolate", "alpha": alpha, "of": pure}
        row = {"label": label, "features": feats, "card": card_path, "alpha": alpha,
               "dev": {"pure": float(np.mean(list(ndcg10(dev, variant_run(dev, pure), dev_meta["qrels"]).values()))),
                       "fused": grid[alpha]}, "tests": {}}
        for tname, (items, qrels) in tests.items():
            its = with_features(items, feats)
            row["tests"][tname] = {"pure": ndcg10(its, variant_run(its, pure), qrels),
                                   "fused": ndcg10(its, variant_run(its, fused), qrels)}
        rows.append(row)
    ref = rows[0]
    head = "| variant | alpha (dev) | dev pure / fused | " + " | ".join(f"{t}: pure (vs ref, p) / fused (vs ref, p)"
                                                                        for t in tests) + " |"
    print(head)
    print("|" + "---|" * (3 + len(tests)))
    summary = []
    for row in rows:
        cells = []
        for t in tests:
            parts = []
            for kind in ("pure", "fused"):
                per = row["tests"][t][kind]
                mean = float(np.mean(list(per.values())))
                if row is ref:
                    parts.append(f"{mean:.1f}")
                else:
                    base = ref["tests"][t][kind]
                    diffs = [per[q] - base[q] for q in base]
                    parts.append(f"{mean:.1f} ({np.mean(diffs):+.1f}, p {randomization_test(diffs):.3f})")
            cells.append(" / ".join(parts))
        print(f"| {row['label']} | {row['alpha']} | {row['dev']['pure']:.1f} / {row['dev']['fused']:.1f} | "
              + " | ".join(cells) + " |")
        summary.append({k: v for k, v in row.items() if k != "tests"} | {
            "tests": {t: {k: float(np.mean(list(row["tests"][t][k].values()))) for k in ("pure", "fused")}
                      for t in tests}})
    for spec in args.codec_row:  # a codec point's scores, paired with the reference on its test set
        from heedrank.fusion import fuse

        label, _, rest = spec.partition("=")
        tname, path, point, alpha = rest.split(":")
        recs = [json.loads(x) for x in Path(path).read_text().splitlines()]
        items, qrels = tests[tname]
        pure_run, fused_run = {}, {}
        for rec in recs:
            sc = np.asarray(rec["float32"] if point == "float32" else rec["points"][point]["scores"])
            pure_run[rec["query_id"]] = dict(zip(rec["doc_ids"], sc.tolist()))
            fused_run[rec["query_id"]] = dict(zip(rec["doc_ids"], fuse(np.asarray(rec["first"]), sc, float(alpha)).tolist()))
        cells = []
        for kind, run in (("pure", pure_run), ("fused", fused_run)):
            per = ndcg10([it for it in items if it.query_id in run], run, {q: qrels[q] for q in run if q in qrels})
            base = ref["tests"][tname][kind]
            diffs = [per[q] - base[q] for q in per if q in base]
            ref_mean = float(np.mean([base[q] for q in per if q in base]))
            cells.append(f"{kind} {float(np.mean(list(per.values()))):.1f} vs ref {ref_mean:.1f} "
                         f"({np.mean(diffs):+.2f}, p {randomization_test(diffs):.3f}, {len(diffs)} queries)")
        print(f"| {label} ({tname}, {point}, alpha {alpha}) | " + " | ".join(cells) + " |")
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()

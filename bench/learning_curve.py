"""Issue #24 lever 1: the learned head weights against the number of training queries.

Fits the study's head weights (``bench/probe_layers.py``'s vectorised pairwise fit, L2 chosen
on dev) on seeded subsets of the training dumps' queries (``--sizes``, each subset inside the
next), and prints one row per size: dev nDCG@10 pure and fused (alpha chosen on dev), then
each test set's figures with the paired randomization test against the first stage.

    python bench/learning_curve.py --features qa --train runs/study24/nf-train-all-qa.npz \\
        --extra runs/probe/qa-dl21.npz --dev runs/probe/nf-dev-hybrid50.npz \\
        --test nf-hybrid50=runs/probe/nf-test-hybrid50.npz --sizes 100,400,1000,2590
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe_layers import batched, fit_batched  # noqa: E402

from heedrank.eval.study import load_items, ndcg10, variant_run, with_features  # noqa: E402


def mean(d) -> float:
    return float(np.mean(list(d.values())))


def main() -> None:
    from heedrank.eval.compare import randomization_test

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--features", default="qa")
    ap.add_argument("--train", required=True, help="the dump whose queries are subsampled")
    ap.add_argument("--extra", action="append", default=[], help="dumps always in the training set")
    ap.add_argument("--dev", required=True)
    ap.add_argument("--test", action="append", default=[], help="NAME=DUMP")
    ap.add_argument("--sizes", default="100,400,1000,2590")
    ap.add_argument("--l2", default="0.01,0.1,1.0,3.0")
    ap.add_argument("--loss", default="pairwise")
    ap.add_argument("--epochs", type=int, default=150)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    pool = with_features(load_items(args.train)[1], args.features)
    extra = [it for p in args.extra for it in with_features(load_items(p)[1], args.features)]
    random.Random(args.seed).shuffle(pool)
    dmeta, dev = load_items(args.dev)
    dev = with_features(dev, args.features)
    tests = {}
    for t in args.test:
        name, path = t.split("=", 1)
        meta, items = load_items(path)
        tests[name] = (with_features(items, args.features), meta["qrels"])
    layers = list(range(dev[0].features["calibrated"].shape[1]))
    rows = []
    for n in [int(x) for x in args.sizes.split(",")]:
        train = pool[:n] + extra
        X, G, M = batched(train, layers)
        best = None
        for l2 in [float(x) for x in args.l2.split(",")]:
            w = fit_batched(X, G, M, l2=l2, epochs=args.epochs, loss=args.loss)
            v = {"kind": "linear", "spec": "heads", "weights": w.tolist(), "layers": layers}
            score = mean(ndcg10(dev, variant_run(dev, v), dmeta["qrels"]))
            if best is None or score > best[0]:
                best = (score, l2, v)
        grid = {round(a, 1): mean(ndcg10(dev, variant_run(dev, {"kind": "interpolate", "alpha": a, "of": best[2]}),
                                          dmeta["qrels"])) for a in np.round(np.linspace(0, 1, 11), 1)}
        alpha = max(grid, key=grid.get)
        row = {"queries": len(pool[:n]), "extra": len(extra), "l2": best[1], "dev_pure": best[0],
               "alpha": alpha, "dev_fused": grid[alpha]}
        for name, (items, qrels) in tests.items():
            first = ndcg10(items, variant_run(items, {"kind": "first"}), qrels)
            pure = ndcg10(items, variant_run(items, best[2]), qrels)
            fusedr = ndcg10(items, variant_run(items, {"kind": "interpolate", "alpha": alpha, "of": best[2]}), qrels)
            ks = sorted(first)
            d = np.array([fusedr[k] - first[k] for k in ks])
            row[name] = {"first": mean(first), "pure": mean(pure), "fused": mean(fusedr),
                         "p_fused_vs_first": randomization_test(d)}
        rows.append(row)
        print(json.dumps(row), flush=True)
    names = list(tests)
    print("\n| training queries (+ always) | l2 | dev pure / fused (alpha) | " + " | ".join(
        f"{n}: pure / fused (vs first stage, p)" for n in names) + " |")
    print("|---|---|---|" + "---|" * len(names))
    for r in rows:
        cells = [f"{r[n]['pure']:.1f} / {r[n]['fused']:.1f} ({r[n]['fused'] - r[n]['first']:+.1f}, "
                 f"p {r[n]['p_fused_vs_first']:.3f})" for n in names]
        print(f"| {r['queries']} (+{r['extra']}) | {r['l2']:g} | {r['dev_pure']:.1f} / {r['dev_fused']:.1f} "
              f"({r['alpha']}) | " + " | ".join(cells) + " |")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

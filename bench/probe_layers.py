"""Which layers a probe store must keep (issue #23.2): the learned head weights refitted on
layer subsets of one feature variant, chosen on dev.

Each probe layer costs one layer of keys per document in the store, so the search starts
from single layers, then grows the best sets greedily (forward selection on dev nDCG@10 of
the pure reranker): every fit is ``eval.study.fit_listwise`` on the training dumps'
``calibrated@VARIANT`` features restricted to the layers, the L2 weight chosen on dev.

    python bench/probe_layers.py --variant qanone --train runs/probe/nf-train-hybrid50.npz \\
        --train runs/probe/dl21-bm25-30.npz --dev runs/probe/nf-dev-hybrid50.npz --out runs/probe/layers.json
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import numpy as np

from heedrank.eval.study import load_items, ndcg10, variant_run, with_features

logger = logging.getLogger("bench.probe_layers")


def batched(items, layers):
    """``(X, gain, mask)``: the study's design (``heads``, z-scored per query) of every query
    with a positive and a negative, padded to the longest list: float64 ``(Q, N, F)``,
    ``(Q, N)`` gains ``2^grade - 1``, bool ``(Q, N)``."""
    import torch

    from heedrank.eval.study import design

    keep = [it for it in items if (it.labels > 0).any() and (it.labels <= 0).any()]
    n = max(len(it.labels) for it in keep)
    F = design(keep[0], "heads", layers).shape[1]
    X = torch.zeros(len(keep), n, F, dtype=torch.float64)
    G = torch.zeros(len(keep), n, dtype=torch.float64)
    M = torch.zeros(len(keep), n, dtype=torch.bool)
    for i, it in enumerate(keep):
        k = len(it.labels)
        X[i, :k] = torch.from_numpy(design(it, "heads", layers).astype(np.float64))
        y = torch.from_numpy(it.labels.astype(np.float64))
        G[i, :k] = torch.where(y > 0, 2.0 ** y - 1.0, torch.zeros_like(y))
        M[i, :k] = True
    return X, G, M


def fit_batched(X, G, M, *, l2: float, loss: str, epochs: int = 150, lr: float = 0.05, seed: int = 0) -> np.ndarray:
    """:func:`heedrank.eval.study.fit_listwise`'s objective (mean over queries plus
    ``l2 |w|^2``, full-batch Adam, float64) on padded batches: the same fit, vectorised."""
    import torch

    torch.manual_seed(seed)
    w = torch.zeros(X.shape[2], dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([w], lr=lr)
    neg = torch.tensor(-1e30, dtype=torch.float64)
    better = (G[:, :, None] > G[:, None, :]) & M[:, :, None] & M[:, None, :]
    for _ in range(epochs):
        opt.zero_grad()
        s = X @ w
        if loss == "pairwise":
            per = torch.nn.functional.softplus(-(s[:, :, None] - s[:, None, :]))
            q = (per * better).sum((1, 2)) / better.sum((1, 2)).clamp_min(1)
        else:
            sm = torch.where(M, s, neg)
            q = torch.logsumexp(sm, 1) - torch.logsumexp(torch.where(G > 0, s + torch.log(G.clamp_min(1e-30)), neg), 1)
        total = q.mean() + l2 * (w * w).sum()
        total.backward()
        opt.step()
    return w.detach().numpy()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", required=True)
    ap.add_argument("--train", action="append", required=True)
    ap.add_argument("--dev", required=True)
    ap.add_argument("--loss", default="pairwise")
    ap.add_argument("--epochs", type=int, default=150)
    ap.add_argument("--l2", default="0.001,0.01,0.1,1.0")
    ap.add_argument("--grow", type=int, default=3, help="largest layer set tried")
    ap.add_argument("--beam", type=int, default=3, help="sets kept per size")
    ap.add_argument("--out", required=True)
    ap.add_argument("--export", default=None, help="LAYERS (comma-separated): fit them (--loss), choose l2 and the "
                    "fusion weight on dev and write a probe weights card to --card")
    ap.add_argument("--card", default=None)
    ap.add_argument("--kv-dtype", default="int8", help="the card's store codec (kv_dtype='auto' reads it)")
    ap.add_argument("--attend", default="none", help="the card's attend: 'none' (a probe store), the first "
                    "attending layer m of the variant (a window store) or 'all' (m = 0: the full store cut at the "
                    "deepest layer, design B)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO)
    train = with_features([it for p in args.train for it in load_items(p)[1]], args.variant)
    meta, dev = load_items(args.dev)
    dev = with_features(dev, args.variant)
    qrels = meta["qrels"]
    n_layers = dev[0].features["calibrated"].shape[1]
    l2s = [float(x) for x in args.l2.split(",")]
    results: dict[str, dict] = {}
    out = Path(args.out)
    if out.exists():
        results = json.loads(out.read_text())

    def fit(layers: tuple[int, ...]) -> float:
        key = ",".join(map(str, layers))
        if key in results:
            return results[key]["dev"]
        best = None
        X, G, M = batched(train, list(layers))
        for l2 in l2s:
            w = fit_batched(X, G, M, l2=l2, epochs=args.epochs, loss=args.loss)
            v = {"kind": "linear", "spec": "heads", "weights": w.tolist(), "layers": list(layers)}
            score = float(np.mean(list(ndcg10(dev, variant_run(dev, v), qrels).values())))
            if best is None or score > best[0]:
                best = (score, l2, w.tolist())
        results[key] = {"dev": best[0], "l2": best[1], "weights": best[2]}
        out.write_text(json.dumps(results))
        logger.info("layers %s: dev %.2f (l2 %g)", key, best[0], best[1])
        return best[0]

    if args.export:
        export(args, train, dev, qrels, meta, l2s)
        return
    fit(tuple(range(n_layers)))
    frontier = sorted(((fit((l,)), (l,)) for l in range(n_layers)), reverse=True)[: args.beam]
    for size in range(2, args.grow + 1):
        cand = {tuple(sorted(set(s) | {l})) for _, s in frontier for l in range(n_layers) if l not in s}
        frontier = sorted(((fit(c), c) for c in cand), reverse=True)[: args.beam]
    rows = sorted(((v["dev"], k) for k, v in results.items()), reverse=True)
    print(f"| layers ({args.variant}) | dev nDCG@10 (pure) | l2 |")
    print("|---|---|---|")
    for score, key in rows[:20]:
        print(f"| {key} | {score:.2f} | {results[key]['l2']:g} |")


def export(args, train, dev, qrels, meta, l2s) -> None:
    """Write the probe (or window, ``--attend m``) weights card of ``--export`` layers (the format of
    ``heedrank eval study-fit --export``, plus ``attend``, ``layers`` and ``kv_dtype``)."""
    from heedrank.reranker.doccache import CACHE_TEMPLATE_VERSION

    layers = sorted(int(x) for x in args.export.split(","))
    X, G, M = batched(train, layers)
    best = None
    for l2 in l2s:
        w = fit_batched(X, G, M, l2=l2, epochs=args.epochs, loss=args.loss)
        v = {"kind": "linear", "spec": "heads", "weights": w.tolist(), "layers": layers}
        score = float(np.mean(list(ndcg10(dev, variant_run(dev, v), qrels).values())))
        logger.info("export %s l2=%g: dev %.2f", layers, l2, score)
        if best is None or score > best[0]:
            best = (score, l2, v)
    grid = {}
    for a in np.linspace(0.0, 1.0, 11):
        fv = {"kind": "interpolate", "alpha": float(a), "of": best[2]}
        grid[round(float(a), 1)] = float(np.mean(list(ndcg10(dev, variant_run(dev, fv), qrels).values())))
    alpha = max(grid, key=grid.get)
    model = (meta.get("reranker") or {}).get("model") or {}
    card = {
        "format": 1, "kind": "blockrank-cached-learned-heads", "template": CACHE_TEMPLATE_VERSION,
        "model": model.get("name"), "model_sha256": model.get("sha256"), "layer": meta.get("layer"),
        "max_doc_tokens": meta.get("max_doc_tokens"), "spec": "heads", "weights": best[2]["weights"],
        "attend": args.attend if args.attend in ("none", "all") else int(args.attend), "layers": layers, "kv_dtype": args.kv_dtype, "l2": best[1],
        "train": {"dumps": args.train, "queries": len(train), "features": f"calibrated@{args.variant}",
                  "loss": args.loss, "epochs": args.epochs},
        "dev_ndcg@10": {"learned": best[0]}, "fusion": {"alpha": alpha, "dev_ndcg@10": grid[alpha], "grid": grid},
        "command": "python bench/probe_layers.py " + " ".join(
            [f"--variant {args.variant}"] + [f"--train {t}" for t in args.train]
            + [f"--dev {args.dev}", f"--loss {args.loss}", f"--l2 {args.l2}", f"--export {args.export}",
               f"--kv-dtype {args.kv_dtype}", f"--attend {args.attend}", f"--card {args.card}", f"--out {args.out}"]),
    }
    Path(args.card).write_text(json.dumps(card, indent=1))
    print(json.dumps({"card": args.card, "layers": layers, "dev_pure": best[0], "l2": best[1], "alpha": alpha,
                      "dev_fused": grid[alpha]}))


if __name__ == "__main__":
    main()

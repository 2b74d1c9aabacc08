"""Issue #33's levers on the head-weight fit, from the recipe's feature dumps
(recipes/default: `bash recipes/default/run.sh index dumps adapter eval-dumps`):

- residual: the served fusion ``alpha z(first) + (1 - alpha) z(X w)`` inside the pairwise loss;
- hard negatives: pairs whose worse candidate is in the first stage's top k only;
- CLEAR (Gao et al. 2020): a hinge on ``z(X w)`` with a margin that shrinks where the first stage
  already orders the pair, ``max(0, margin - (z(first)_i - z(first)_j))``;
- L1: ``l1 * |w|_1`` instead of L2 (also ``heedrank lab fit --penalty l1`` on this tag);
- CoRe-style sparse heads: the k heads whose mean z-scored attention separates relevant from
  irrelevant candidates most, weighted equally.

Prints, per lever:
1. dev on the base model's features (``--grid``);
2. the leave-one-source-out transfer table (``--loso``);
3. the served configuration (``--served``): the recipe's adapter's features, the fusion weight
   chosen on dev, then the test sets, with paired tests against the recipe's card.

    python bench/head_fit_levers.py --work runs/recipe/default --grid --loso --served

docs/RESULTS.md, "The default rebuilt by its recipe", has the tables.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from heedrank.eval.compare import randomization_test
from heedrank.eval.study import design, load_items, ndcg10, variant_run

TRAIN = ("nf-train-hybrid50", "dl21-bm25-30", "scifact-train-bm25-30")
GRID: list[dict[str, Any]] = [
    {"loss": "pairwise", "l2": 0.1},
    *({"loss": "residual", "alpha": a, "l2": 0.1} for a in (0.5, 0.6, 0.7)),
    {"loss": "residual", "alpha": 0.6, "l2": 0.01}, {"loss": "residual", "alpha": 0.6, "l2": 1.0},
    {"loss": "pairwise", "l2": 0.1, "hard_k": 10}, {"loss": "residual", "alpha": 0.6, "l2": 0.1, "hard_k": 10},
    {"loss": "clear", "l2": 0.1, "margin": 1.0}, {"loss": "clear", "l2": 0.1, "margin": 0.5},
    *({"loss": "pairwise", "l2": 0.0, "l1": c} for c in (0.001, 0.002, 0.003, 0.005, 0.01, 0.03, 0.1)),
    *({"core": k} for k in (1, 2, 5, 15)),
]


def _mean(d: dict[str, float]) -> float:
    return float(np.mean(list(d.values())))


def _zt(x: Any) -> Any:
    sd = x.std(unbiased=False)
    return (x - x.mean()) / (sd if sd > 1e-12 else 1.0)


def fit(items: list, *, loss: str = "pairwise", alpha: float = 0.0, l2: float = 0.01, l1: float = 0.0,
        hard_k: int | None = None, margin: float = 1.0, epochs: int = 150, lr: float = 0.05) -> np.ndarray:
    """Head weights ``(L * H,)`` float64, full-batch Adam as ``heedrank lab fit``."""
    import torch

    torch.manual_seed(0)
    data = []
    for it in items:
        y = it.labels.astype(np.float64)
        if not ((y > 0).any() and (y <= 0).any()):
            continue
        g = torch.tensor(np.where(y > 0, 2.0 ** y - 1.0, 0.0))
        better = g[:, None] > g[None, :]
        if hard_k is not None:  # candidates are in first-stage order
            top = torch.zeros(len(g), dtype=torch.bool)
            top[:hard_k] = True
            better = better & top[None, :]
            if not better.any():
                continue
        data.append((torch.tensor(design(it, "heads"), dtype=torch.float64), _zt(torch.tensor(it.first_stage.astype(np.float64))), better))
    w = torch.zeros(data[0][0].shape[1], dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([w], lr=lr)
    for _ in range(epochs):
        opt.zero_grad()
        total = torch.zeros((), dtype=torch.float64)
        for X, zf, better in data:
            r = X @ w
            if loss == "clear":
                rz = _zt(r)
                m = (margin - (zf[:, None] - zf[None, :])).clamp_min(0.0)
                total = total + (m - (rz[:, None] - rz[None, :])).clamp_min(0.0)[better].mean()
                continue
            s = alpha * zf + (1 - alpha) * _zt(r) if loss == "residual" else r
            total = total + torch.nn.functional.softplus(-(s[:, None] - s[None, :]))[better].mean()
        total = total / len(data) + l2 * (w * w).sum() + l1 * w.abs().sum()
        total.backward()
        opt.step()
    return w.detach().numpy()


def core_weights(items: list, k: int) -> np.ndarray:
    """1/k on the k heads of largest mean z-scored mass on relevant minus irrelevant candidates."""
    diffs = []
    for it in items:
        y = it.labels > 0
        if y.any() and (~y).any():
            X = design(it, "heads")
            diffs.append(X[y].mean(0) - X[~y].mean(0))
    w = np.zeros(len(diffs[0]))
    w[np.argsort(-np.mean(diffs, axis=0))[:k]] = 1.0 / k
    return w


def weights_of(train: list, cfg: dict[str, Any]) -> np.ndarray:
    return core_weights(train, cfg["core"]) if "core" in cfg else fit(train, **cfg)


def per_query(items: list, qrels: dict, w: np.ndarray, alpha: float | None) -> dict[str, float]:
    v: dict[str, Any] = {"kind": "linear", "spec": "heads", "weights": list(w)}
    if alpha is not None:
        v = {"kind": "interpolate", "alpha": alpha, "of": v}
    return ndcg10(items, variant_run(items, v), qrels)


def dev_choice(items: list, qrels: dict, w: np.ndarray) -> tuple[float, float, float]:
    """(pure, fused at the dev-best alpha, that alpha); ties go to the alpha nearest 0.6."""
    fused = {a: _mean(per_query(items, qrels, w, a)) for a in np.round(np.linspace(0, 1, 11), 1)}
    a = max(fused, key=lambda x: (fused[x], -abs(x - 0.6)))
    return _mean(per_query(items, qrels, w, None)), fused[a], float(a)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("runs/recipe/default"))
    parser.add_argument("--grid", action="store_true")
    parser.add_argument("--loso", action="store_true")
    parser.add_argument("--served", action="store_true")
    args = parser.parse_args()
    dumps = args.work / "dumps"

    def load(name: str) -> tuple[list, dict]:
        meta, items = load_items(dumps / f"{name}.npz")
        return items, meta["qrels"]

    sources = {name: load(name) for name in TRAIN}
    train = [it for items, _ in sources.values() for it in items]
    weights = {json.dumps(cfg): weights_of(train, cfg) for cfg in GRID}
    if args.grid:
        dev, dq = load("nf-dev-hybrid50")
        print("| lever | base-model dev: pure / fused (alpha) |\n|---|---|")
        for key, w in weights.items():
            pure, fused, a = dev_choice(dev, dq, w)
            print(f"| {key} | {pure:.2f} / {fused:.2f} ({a}) |")
    if args.loso:
        print("| held out | lever | first stage | pure | fused 0.6 |\n|---|---|---|---|---|")
        for held, (items, q) in sources.items():
            rest = [it for name, (its, _) in sources.items() if name != held for it in its]
            first = _mean(ndcg10(items, variant_run(items, {"kind": "first"}), q))
            for cfg in ({"loss": "pairwise", "l2": 0.1}, {"loss": "pairwise", "l2": 0.0, "l1": 0.003},
                        {"loss": "pairwise", "l2": 0.0, "l1": 0.03}, {"core": 2}):
                w = weights_of(rest, cfg)
                print(f"| {held} | {json.dumps(cfg)} | {first:.2f} | {_mean(per_query(items, q, w, None)):.2f} | "
                      f"{_mean(per_query(items, q, w, 0.6)):.2f} |")
    if args.served:
        sets = {"NF test hybrid@50": "qa-nf-test-hybrid50", "NF test BM25@20": "qa-nf-test-bm25-20",
                "DL19 BM25@100": "qa-dl19-bm25-100"}
        dev, dq = load("qa-nf-dev-hybrid50")
        tests = {name: load(d) for name, d in sets.items()}
        card = np.asarray(json.loads((args.work / "out" / "card.fit.json").read_text())["weights"])
        ref_alpha = dev_choice(dev, dq, card)[2]
        ref = {t: per_query(items, q, card, ref_alpha) for t, (items, q) in tests.items()}
        print("| lever | served dev: pure / fused (alpha) | " + " | ".join(f"{t}: fused (vs the card, p)" for t in sets)
              + " |\n|---|---|" + "---|" * len(sets))
        for key, w in {"the recipe's card": card, **weights}.items():
            pure, fused, a = dev_choice(dev, dq, w)
            cells = []
            for t, (items, q) in tests.items():
                got = per_query(items, q, w, a)
                diffs = [got[k] - ref[t][k] for k in ref[t]]
                cells.append(f"{_mean(got):.2f} ({np.mean(diffs):+.2f}, p {randomization_test(diffs):.3f})")
            print(f"| {key} | {pure:.2f} / {fused:.2f} ({a}) | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()

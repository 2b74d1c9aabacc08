"""Study: two models' learned scores fused with the first stage, from their recipes' dumps.

Each model's default (its weights card's head weights over the features of its ``qa-*`` dump, the
query adapter's) is z-scored per query, as is the first-stage score, and the ensemble ranks by
``a z(first) + b z(model A) + (1 - a - b) z(model B)``. ``a`` and ``b`` are chosen on a grid of
0.1 by nDCG@10 on the dev dumps, then applied to every test set, paired against each model's own
default (``alpha z(first) + (1 - alpha) z(model)`` at its card's fusion weight) with a randomization
test (10,000 trials). The two dumps of a set must hold the same queries and candidates (the same
first stage: the recipes' dumps do, whatever the model).

    heedrank lab ensemble \\
        --a reranker/data/smollm2-135m-instruct.blockrank-cached.json RECIPE_A/dumps \\
        --b reranker/data/gemma3-270m.blockrank-cached.json RECIPE_B/dumps \\
        --dev qa-nf-dev-hybrid50 --test qa-nf-test-hybrid50 --test qa-dl19-bm25-100

Prints one JSON object: the weights chosen, and per set each default's and the ensemble's nDCG@10
(x 100) with the paired deltas.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from heedrank.fusion import standardize
from heedrank.lab.study import QueryItem, load_items, ndcg10, variant_scores

Rows = list[tuple[QueryItem, Any, Any, Any]]


def _card(path: Path) -> tuple[list[Any], float]:
    card = json.loads(path.read_text())
    return card["weights"], float(card["fusion"]["alpha"])


def load_pair(dump_a: Path, dump_b: Path, weights_a: Any, weights_b: Any) -> tuple[dict[str, dict[str, int]], Rows]:
    """Qrels and, per query both dumps hold, ``(item, z(first), z(A), z(B))``.

    Raises:
        ValueError: a query whose candidates differ between the dumps.
    """
    meta, items_a = load_items(dump_a)
    _, items_b = load_items(dump_b)
    by_id = {it.query_id: it for it in items_b}
    rows: Rows = []
    for it in items_a:
        other = by_id.get(it.query_id)
        if other is None:
            continue
        if list(it.doc_ids) != list(other.doc_ids):
            raise ValueError(f"query {it.query_id}: the two dumps hold other candidates")
        sa = variant_scores(it, {"kind": "linear", "spec": "heads", "weights": weights_a})
        sb = variant_scores(other, {"kind": "linear", "spec": "heads", "weights": weights_b})
        rows.append((it, standardize(it.first_stage.astype(np.float64)), standardize(sa), standardize(sb)))
    return meta["qrels"], rows


def ensemble_ndcg(qrels: dict[str, dict[str, int]], rows: Rows, a: float, b: float) -> dict[str, float]:
    """Per query nDCG@10 (x 100) of ``a z(first) + b z(A) + (1 - a - b) z(B)``."""
    run = {it.query_id: {d: float(x) for d, x in zip(it.doc_ids, a * f + b * sa + (1 - a - b) * sb)}
           for it, f, sa, sb in rows}
    return ndcg10([r[0] for r in rows], run, qrels)


def ensemble_study(a: tuple[Path, Path], b: tuple[Path, Path], dev: str, tests: Sequence[str]) -> dict[str, Any]:
    """The study of the module docstring: ``a`` and ``b`` are each model's ``(card, dump folder)``;
    ``dev`` and ``tests`` name dumps (``<folder>/<name>.npz``). Returns the weights chosen and, per
    set, each default's and the ensemble's nDCG@10 (x 100) with the paired deltas and p-values."""
    from heedrank.eval.compare import randomization_test

    (card_a, dir_a), (card_b, dir_b) = a, b
    (wa, alpha_a), (wb, alpha_b) = _card(card_a), _card(card_b)

    def pair(name: str) -> tuple[dict[str, dict[str, int]], Rows]:
        return load_pair(dir_a / f"{name}.npz", dir_b / f"{name}.npz", wa, wb)

    qrels, rows = pair(dev)
    grid = [(round(x, 1), round(y, 1)) for x in np.arange(0, 1.01, 0.1) for y in np.arange(0, 1.01 - x, 0.1)]
    best = max(grid, key=lambda xy: float(np.mean(list(ensemble_ndcg(qrels, rows, *xy).values()))))
    configs = {"A default": (alpha_a, 1 - alpha_a), "B default": (alpha_b, 0.0), "ensemble": best}
    out: dict[str, Any] = {"weights (first, A, B)": [best[0], best[1], round(1 - best[0] - best[1], 1)]}
    for name in [dev, *tests]:
        qrels, rows = pair(name)
        per = {c: ensemble_ndcg(qrels, rows, x, y) for c, (x, y) in configs.items()}
        report: dict[str, Any] = {"queries": len(rows)}
        report.update({c: round(float(np.mean(list(v.values()))), 2) for c, v in per.items()})
        for u, v in (("ensemble", "A default"), ("ensemble", "B default"), ("B default", "A default")):
            d = [per[u][q] - per[v][q] for q in sorted(per[u])]
            report[f"{u} - {v}"] = {"delta": round(float(np.mean(d)), 2), "p": round(randomization_test(d), 4)}
        out[name] = report
    return out

"""Synthetic feature-dump items (:class:`heedrank.lab.study.QueryItem`) with a known
informative head, shared by the study's evaluation tests (tests/lab) and its fits
(tests/lab/train). ``tests/`` is on ``sys.path`` (its conftest.py sits there)."""

from __future__ import annotations

import numpy as np

from heedrank.lab.study import QueryItem
from heedrank.reranker.cards import WeightsCard


def study_items(n_queries: int, seed: int, n: int = 12, L: int = 4, H: int = 3) -> tuple[list[QueryItem], dict]:
    """``(items, qrels)``: two relevant candidates of ``n`` per query; head 1 of layer 2
    carries relevance, the first stage a weaker signal; items in first-stage order."""
    rng = np.random.default_rng(seed)
    items, qrels = [], {}
    for q in range(n_queries):
        labels = np.zeros(n, dtype=np.int64)
        labels[rng.choice(n, size=2, replace=False)] = 1
        cal = rng.normal(size=(n, L, H)).astype(np.float32)
        cal[:, 2, 1] += 3.0 * labels  # the informative head: layer 2, head 1
        first = rng.normal(size=n) + 0.5 * labels  # a weaker first stage
        order = np.argsort(-first, kind="stable")
        qid = f"q{seed}-{q}"
        ids = [f"{qid}-d{i}" for i in range(n)]
        items.append(QueryItem(qid, [ids[i] for i in order], first[order], labels[order], {
            "calibrated": cal[order], "raw": cal[order], "signal": rng.normal(size=(n, H)).astype(np.float32)[order],
            "masked": cal[order].sum(axis=(1, 2))}))
        qrels[qid] = {ids[i]: int(labels[i]) for i in range(n) if labels[i]}
    return items, qrels


CUTOFF_L, CUTOFF_H = 2, 3


def cutoff_items(n_queries: int, n: int = 12, seed: int = 0) -> tuple[list[QueryItem], dict, WeightsCard]:
    """``(items, qrels, card)`` for the cut-off: head 0 of layer 0 carries the relevance
    signal, the first stage a weaker one; each query has one relevant document the first
    stage missed; ``card`` weighs head (0, 0) alone, fusion weight 0.6."""
    L, H = CUTOFF_L, CUTOFF_H
    rng = np.random.default_rng(seed)
    items, qrels = [], {}
    for q in range(n_queries):
        rel = rng.random(n) < 0.25
        cal = rng.normal(size=(n, L, H)).astype(np.float32)
        cal[:, 0, 0] += 2.0 * rel
        first = np.sort(rng.normal(size=n) + 0.5 * rel)[::-1].copy()  # first-stage order (descending)
        ids = [f"q{q}d{i}" for i in range(n)]
        items.append(QueryItem(f"q{q}", ids, first, rel.astype(np.float64), {"calibrated": cal}))
        qrels[f"q{q}"] = {d: 1 for d, r in zip(ids, rel) if r} | {f"q{q}-unretrieved": 1}
    card = WeightsCard.from_json({"layer": L - 1, "weights": [1.0] + [0.0] * (L * H - 1), "fusion": {"alpha": 0.6}},
                                 "synthetic card")
    return items, qrels, card

"""Evaluating the relevance cut-off (:mod:`heedrank.calibration`) on study dumps.

For every query of a dump, each candidate count ``N`` (the first stage's top ``N``,
re-scored as the service would score that many: per-(layer, head) features z-scored over
the ``N``), and each serving mode (fused with first-stage scores, fused with the reciprocal
rank of the given order, the reranker alone), the served scores are computed exactly as the
service computes them (:func:`served`: :func:`heedrank.lab.study.variant_scores`,
:func:`heedrank.fusion.fuse`, :func:`heedrank.calibration.features`). The maps are fitted
by :mod:`heedrank.lab.train.cutoff_fit`; here a cut-off is measured on a set
(:func:`evaluate_cutoff`): precision, recall (of every judged relevant document in the
qrels) and F1 of the returned set per query (an empty set has precision 1 and F1 0), and the
paired randomization test (:func:`heedrank.eval.compare.randomization_test`) of the
per-query F1 difference.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from heedrank.calibration import Calibration, PlattMap, features
from heedrank.errors import ValidationError
from heedrank.fusion import standardize
from heedrank.lab.study import QueryItem, variant_scores
from heedrank.reranker.cards import WeightsCard
from heedrank.serving import ZFusion

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Served:
    """One query at one candidate count, one mode: what the service would return.

    Attributes:
        query_id: The query.
        x: ``(N, 4)`` float64 map inputs in served order (:data:`heedrank.calibration.FEATURES`).
        scores: ``(N,)`` served scores in served order.
        labels: ``(N,)`` 1.0 for a relevant candidate (grade >= ``min_grade``), else 0.
        n_relevant: Relevant documents of the query in the qrels (recall's denominator).
    """

    query_id: str
    x: np.ndarray
    scores: np.ndarray
    labels: np.ndarray
    n_relevant: int


def head_variant(card: WeightsCard) -> dict[str, Any]:
    """The study variant of a weights card's learned scorer (pure reranker).

    Args:
        card: The card, as :func:`heedrank.reranker.cards.read_card` reads it.

    Raises:
        ValidationError: the card has no weights or no layer.
    """
    if card.weights is None or card.layer is None:
        raise ValidationError(f"weights card {card.path} has no weights or no layer: refit it with "
                              "`heedrank lab fit --export`")
    layers = card.data.get("layers") or list(range(int(card.layer) + 1))
    return {"kind": "linear", "spec": "heads", "weights": list(card.weights), "layers": layers}


def subset(item: QueryItem, n: int) -> QueryItem:
    """The first stage's top ``n`` of ``item`` (dump order is first-stage order)."""
    return replace(item, doc_ids=item.doc_ids[:n], first_stage=item.first_stage[:n], labels=item.labels[:n],
                   features={k: v[:n] for k, v in item.features.items()})


def served(items: Sequence[QueryItem], qrels: Mapping[str, Mapping[str, int]], variant: Mapping[str, Any],
           alpha: float, mode: str, n: int | None, *, min_grade: int = 1) -> list[Served]:
    """Every query of ``items`` served at candidate count ``n`` (``None``: all its
    candidates) in ``mode`` (:data:`heedrank.calibration.MODES`), plus the judged queries
    with a relevant document and no candidates (nothing returned)."""
    out = []
    for it in items:
        sub = subset(it, n) if n is not None else it
        r = variant_scores(sub, variant)
        policy = ZFusion(alpha=None if mode == "none" else alpha, by="rank" if mode == "rank" else "score")
        s = policy.served_scores(sub.first_stage, r)
        order = sorted(range(len(s)), key=lambda i: (-float(s[i]), sub.doc_ids[i]))  # Ranking's order
        if mode == "none":  # the map reads the reranker's own scores z-scored (ZFusion.apply)
            s = list(standardize(np.asarray(s, dtype=np.float64)))
        rel = {d for d, g in qrels.get(it.query_id, {}).items() if g >= min_grade}
        ss = np.asarray([float(s[i]) for i in order])
        lab = np.asarray([sub.doc_ids[i] in rel for i in order], dtype=np.float64)
        out.append(Served(it.query_id, np.asarray(features(list(ss)), dtype=np.float64).reshape(-1, 4), ss, lab,
                          len(rel)))
    seen = {it.query_id for it in items}
    for q, r in qrels.items():
        n_rel = sum(g >= min_grade for g in r.values())
        if q not in seen and n_rel:
            out.append(Served(q, np.zeros((0, 4)), np.zeros(0), np.zeros(0), n_rel))
    return out


def prf(labels: np.ndarray, keep: int, n_relevant: int) -> tuple[float, float, float]:
    """Precision, recall, F1 of the top ``keep`` of a served list."""
    tp = float(labels[:keep].sum())
    p = tp / keep if keep else 1.0
    r = tp / n_relevant if n_relevant else 1.0
    f = 2 * p * r / (p + r) if tp else 0.0
    return p, r, f


def per_query(rows: Sequence[Served], keep: Any) -> np.ndarray:
    """``(Q, 4)`` precision, recall, F1 and hits returned per query, ``keep(row) -> int`` (rows
    sorted by query id, so two calls pair up)."""
    out = []
    for row in sorted(rows, key=lambda r: r.query_id):
        k = int(keep(row)) if len(row.labels) else 0
        out.append((*prf(row.labels, k, row.n_relevant), k))
    return np.asarray(out, dtype=np.float64)


def keep_above(plat: PlattMap, threshold: float) -> Any:
    """``keep(row) -> int``: how many of a served list's candidates have P(relevant) >= ``threshold``."""
    def keep(row: Served) -> int:
        return sum(1 for p in plat.probabilities(list(row.scores)) if p >= threshold)
    return keep


def evaluate_cutoff(items: Sequence[QueryItem], qrels: Mapping[str, Mapping[str, int]], card: WeightsCard,
                    calibration: Calibration, mode: str, n: int | None, top_k: int, *,
                    min_grade: int = 1) -> dict[str, Any]:
    """The ``"auto"`` cut-off against the fixed top-``top_k`` on one set at count ``n``:
    mean precision, recall, F1 and hits returned of each, the F1 difference and its p."""
    from heedrank.eval.compare import randomization_test

    plat = calibration.maps[mode]
    rows = served(items, qrels, head_variant(card), float(calibration.alpha or 0.0), mode, n, min_grade=min_grade)
    auto = per_query(rows, keep_above(plat, plat.threshold))
    fixed = per_query(rows, lambda r: min(top_k, len(r.labels)))
    best_k = max(range(1, (n or max(len(it.doc_ids) for it in items)) + 1),
                 key=lambda k: per_query(rows, lambda r, k=k: min(k, len(r.labels)))[:, 2].mean())
    oracle = per_query(rows, lambda r: min(best_k, len(r.labels)))
    d = auto[:, 2] - fixed[:, 2]
    return {"queries": len(rows), "auto": auto.mean(0).tolist(), "top_k": top_k, "fixed": fixed.mean(0).tolist(),
            "delta_f1": float(d.mean()), "p": randomization_test(d),
            "best_k_on_this_set": best_k, "fixed_best_k": oracle.mean(0).tolist(),
            "p_vs_best_k": randomization_test(auto[:, 2] - oracle[:, 2])}

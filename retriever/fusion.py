"""Rank fusion of first-stage rankings (pure functions): reciprocal rank fusion and a
weighted sum of normalised scores."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from heedrank.errors import ValidationError
from heedrank.types import Ranking

RRF_K = 60
"""The constant of reciprocal rank fusion (Cormack et al., SIGIR 2009)."""


def reciprocal_rank_fusion(rankings: Sequence[Ranking], k: int, rrf_k: int = RRF_K) -> Ranking:
    """Fuse rankings of one query by reciprocal rank fusion (docs/design/algorithms.md section 5).

    ``RRF(d) = sum over rankings r containing d of 1 / (rrf_k + rank_r(d))`` with
    ``rank_r`` 1-based in each ranking's ``(-score, doc_id)`` order; a document absent
    from a ranking gets nothing from it. Input scores are not used, only positions.

    Args:
        rankings: Rankings of the same query (at least one).
        k: Hits kept (clamped to the number of distinct documents).
        rrf_k: Smoothing constant (60).

    Returns:
        Ranking whose scores are RRF scores (unitless, in ``(0, len(rankings) / (rrf_k + 1)]``),
        sorted by ``(-score, doc_id)``.

    Raises:
        ValidationError: no rankings, rankings of different queries, ``k < 0`` or ``rrf_k < 0``.

    Example:
        >>> a = Ranking.from_scores("q", {"d1": 3.0, "d2": 2.0})
        >>> b = Ranking.from_scores("q", {"d2": 0.9, "d3": 0.5})
        >>> [(h.doc_id, round(h.score, 5)) for h in reciprocal_rank_fusion([a, b], 3).hits]
        [('d2', 0.03252), ('d1', 0.01639), ('d3', 0.01613)]
    """
    if not rankings:
        raise ValidationError("reciprocal_rank_fusion needs at least one ranking")
    qids = {r.query_id for r in rankings}
    if len(qids) != 1:
        raise ValidationError(f"cannot fuse rankings of different queries: {sorted(qids)}")
    if k < 0 or rrf_k < 0:
        raise ValidationError(f"k and rrf_k must be >= 0, got k={k}, rrf_k={rrf_k}")
    fused: dict[str, float] = {}
    for ranking in rankings:
        for rank, hit in enumerate(ranking.hits, start=1):
            fused[hit.doc_id] = fused.get(hit.doc_id, 0.0) + 1.0 / (rrf_k + rank)
    return Ranking.from_scores(rankings[0].query_id, fused, k)


NORMALIZATIONS = ("minmax", "zscore")


def _normalise(scores: np.ndarray, how: str) -> np.ndarray:
    if how == "minmax":
        lo, hi = float(scores.min()), float(scores.max())
        return np.ones_like(scores) if hi <= lo else (scores - lo) / (hi - lo)
    std = float(scores.std())
    return np.zeros_like(scores) if std == 0 else (scores - float(scores.mean())) / std


def weighted_score_fusion(
    rankings: Sequence[Ranking],
    k: int,
    weights: Sequence[float] | None = None,
    normalization: str = "minmax",
) -> Ranking:
    """Fuse rankings of one query by a weighted sum of per-ranking normalised scores.

    Each ranking's scores are normalised over its own hits: ``"minmax"`` maps them to
    ``[0, 1]`` (all equal -> 1), ``"zscore"`` to ``(s - mean) / std`` (all equal -> 0).
    ``fused(d) = sum_r w_r * norm_r(d)``; a document absent from ranking ``r`` gets the
    lowest normalised score of ``r`` (so being missing is never better than being last).
    An empty ranking contributes nothing.

    Args:
        rankings: Rankings of the same query (at least one).
        k: Hits kept (clamped to the number of distinct documents).
        weights: One non-negative weight per ranking; ``None`` = equal weights summing to 1.
        normalization: ``"minmax"`` or ``"zscore"``.

    Returns:
        Ranking whose scores are the fused scores (unitless; with min-max and weights
        summing to 1 they lie in ``[0, 1]``), sorted by ``(-score, doc_id)``.

    Raises:
        ValidationError: no rankings, rankings of different queries, a bad weight list,
            ``k < 0`` or an unknown normalization.

    Example:
        >>> a = Ranking.from_scores("q", {"d1": 10.0, "d2": 5.0, "d3": 0.0})
        >>> b = Ranking.from_scores("q", {"d3": 0.9, "d1": 0.5})
        >>> [(h.doc_id, round(h.score, 3)) for h in weighted_score_fusion([a, b], 3).hits]
        [('d1', 0.5), ('d3', 0.5), ('d2', 0.25)]
    """
    if not rankings:
        raise ValidationError("weighted_score_fusion needs at least one ranking")
    qids = {r.query_id for r in rankings}
    if len(qids) != 1:
        raise ValidationError(f"cannot fuse rankings of different queries: {sorted(qids)}")
    if k < 0:
        raise ValidationError(f"k must be >= 0, got {k}")
    if normalization not in NORMALIZATIONS:
        raise ValidationError(f"unknown normalization {normalization!r}; choose one of {list(NORMALIZATIONS)}")
    if weights is None:
        weights = [1.0 / len(rankings)] * len(rankings)
    if len(weights) != len(rankings) or any(not np.isfinite(w) or w < 0 for w in weights):
        raise ValidationError(f"need {len(rankings)} finite non-negative weights, got {list(weights)}")
    docs = sorted({h.doc_id for r in rankings for h in r.hits})
    pos = {d: i for i, d in enumerate(docs)}
    fused = np.zeros(len(docs), dtype=np.float64)
    for ranking, w in zip(rankings, weights):
        if not len(ranking):
            continue
        norm = _normalise(np.array([h.score for h in ranking.hits], dtype=np.float64), normalization)
        part = np.full(len(docs), float(norm.min()))
        part[[pos[h.doc_id] for h in ranking.hits]] = norm
        fused += w * part
    return Ranking.from_scores(rankings[0].query_id, dict(zip(docs, fused.tolist())), k)

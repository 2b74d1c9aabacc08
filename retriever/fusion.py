"""Rank fusion of first-stage rankings (pure functions)."""

from __future__ import annotations

from collections.abc import Sequence

from attnrank.errors import ValidationError
from attnrank.types import Ranking

RRF_K = 60
"""The constant of reciprocal rank fusion (Cormack et al., SIGIR 2009)."""


def reciprocal_rank_fusion(rankings: Sequence[Ranking], k: int, rrf_k: int = RRF_K) -> Ranking:
    """Fuse rankings of one query by reciprocal rank fusion (ALGORITHMS.md section 5).

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

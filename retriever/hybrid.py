"""Hybrid first stage: fusion of BM25 and dense rankings (reciprocal rank fusion, or a
weighted sum of normalised scores), as pure functions on rankings and as a retriever.
The per-score pieces (:func:`heedrank.fusion.rrf`, :func:`heedrank.fusion.minmax`,
:func:`heedrank.fusion.standardize`) live in :mod:`heedrank.fusion`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from heedrank.errors import ValidationError
from heedrank.fusion import RRF_K, minmax, rrf, standardize
from heedrank.protocols import FilterArg, Retriever
from heedrank.types import Query, Ranking
from heedrank.retriever.base import check_args

DEFAULT_DEPTH = 100
"""Hits taken from each fused retriever (at least ``k``)."""
FUSIONS = ("rrf", "weighted")
NORMALIZATIONS = ("minmax", "zscore")


def reciprocal_rank_fusion(rankings: Sequence[Ranking], k: int, rrf_k: int = RRF_K) -> Ranking:
    """Fuse rankings of one query by reciprocal rank fusion (docs/design/algorithms.md section 5).

    ``RRF(d) = sum over rankings r containing d of 1 / (rrf_k + rank_r(d))``
    (:func:`heedrank.fusion.rrf`) with ``rank_r`` 1-based in each ranking's
    ``(-score, doc_id)`` order; a document absent from a ranking gets nothing from it. Input scores are not used, only positions.

    Args:
        rankings: Rankings of the same query (at least one).
        k: Hits kept (clamped to the number of distinct documents).
        rrf_k: Smoothing constant (:data:`heedrank.fusion.RRF_K`).

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
    _check_one_query(rankings, "reciprocal_rank_fusion")
    if k < 0 or rrf_k < 0:
        raise ValidationError(f"k and rrf_k must be >= 0, got k={k}, rrf_k={rrf_k}")
    fused: dict[str, float] = {}
    for ranking in rankings:
        for rank, hit in enumerate(ranking.hits, start=1):
            fused[hit.doc_id] = fused.get(hit.doc_id, 0.0) + rrf(rank, rrf_k)
    return Ranking.from_scores(rankings[0].query_id, fused, k)


_NORMALISE = {"minmax": minmax, "zscore": standardize}


def _check_one_query(rankings: Sequence[Ranking], name: str) -> None:
    """Raise ValidationError unless ``rankings`` is non-empty and all of one query."""
    if not rankings:
        raise ValidationError(f"{name} needs at least one ranking")
    qids = {r.query_id for r in rankings}
    if len(qids) != 1:
        raise ValidationError(f"cannot fuse rankings of different queries: {sorted(qids)}")


def weighted_score_fusion(
    rankings: Sequence[Ranking],
    k: int,
    weights: Sequence[float] | None = None,
    normalization: str = "minmax",
) -> Ranking:
    """Fuse rankings of one query by a weighted sum of per-ranking normalised scores.

    Each ranking's scores are normalised over its own hits: ``"minmax"`` maps them to
    ``[0, 1]`` (all equal -> 1, :func:`heedrank.fusion.minmax`), ``"zscore"`` to
    ``(s - mean) / std`` (all equal -> 0, :func:`heedrank.fusion.standardize`).
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
    _check_one_query(rankings, "weighted_score_fusion")
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
        norm = _NORMALISE[normalization](np.array([h.score for h in ranking.hits], dtype=np.float64))
        part = np.full(len(docs), float(norm.min()))
        part[[pos[h.doc_id] for h in ranking.hits]] = norm
        fused += w * part
    return Ranking.from_scores(rankings[0].query_id, dict(zip(docs, fused.tolist())), k)


class HybridRetriever:
    """Fusion of several retrievers (BM25 and dense by default), docs/design/algorithms.md section 5.

    Each retriever returns its top ``max(k, depth)`` under the same metadata filter;
    ``fusion="rrf"`` scores documents ``sum_r 1 / (rrf_k + rank_r(d))``,
    ``fusion="weighted"`` ``sum_r w_r * norm_r(d)`` (see :func:`weighted_score_fusion`).
    Scores are unitless, higher = better; the top ``k`` are kept.

    Args:
        retrievers: The retrievers to fuse (at least one).
        depth: Hits per retriever; ``None`` = ``max(k, 100)``.
        rrf_k: RRF constant (:data:`heedrank.fusion.RRF_K`).
        fusion: ``"rrf"`` or ``"weighted"``.
        weights: Per-retriever weights of the weighted fusion (``None`` = equal).
        normalization: ``"minmax"`` or ``"zscore"`` (weighted fusion).
    """

    name = "hybrid"
    requires = ("bm25", "dense")
    """The index parts it reads (:meth:`heedrank.index.store.Index.provides`): an index offers this retriever when it has them."""

    def __init__(
        self,
        retrievers: Sequence[Retriever],
        *,
        depth: int | None = None,
        rrf_k: int = RRF_K,
        fusion: str = "rrf",
        weights: Sequence[float] | None = None,
        normalization: str = "minmax",
    ) -> None:
        if not retrievers:
            raise ValidationError("HybridRetriever needs at least one retriever")
        if depth is not None and depth < 1:
            raise ValidationError(f"depth must be >= 1, got {depth}")
        if rrf_k < 0:
            raise ValidationError(f"rrf_k must be >= 0, got {rrf_k}")
        if fusion not in FUSIONS:
            raise ValidationError(f"unknown fusion {fusion!r}; choose one of {list(FUSIONS)}")
        if normalization not in NORMALIZATIONS:
            raise ValidationError(f"unknown normalization {normalization!r}; choose one of {list(NORMALIZATIONS)}")
        if weights is not None and len(weights) != len(retrievers):
            raise ValidationError(f"need one weight per retriever ({len(retrievers)}), got {list(weights)}")
        self.retrievers = list(retrievers)
        self.depth = depth
        self.rrf_k = rrf_k
        self.fusion = fusion
        self.weights = list(weights) if weights is not None else None
        self.normalization = normalization

    @classmethod
    def from_index(cls, index: Any, **options: Any) -> HybridRetriever:
        """BM25 + dense over an :class:`heedrank.index.store.Index`.

        Options: ``depth`` (int), ``rrf_k`` (int), ``fusion`` (``"rrf"``/``"weighted"``),
        ``weights`` ([bm25, dense]), ``normalization``, ``show_progress`` and ``strategy``
        (dense retriever).

        Raises:
            ValidationError: the index has no vectors, or an unknown option.
        """
        from heedrank.retriever.bm25 import BM25Retriever
        from heedrank.retriever.dense import DenseRetriever

        kwargs = {k: options.pop(k) for k in ("depth", "rrf_k", "fusion", "weights", "normalization") if k in options}
        dense_opts = {k: options.pop(k) for k in ("show_progress", "strategy") if k in options}
        if options:
            raise ValidationError(f"unknown hybrid retriever options: {sorted(options)}")
        if index.dense is None:
            raise ValidationError("this index has no dense vectors (built with --no-dense); hybrid needs them")
        return cls([BM25Retriever.from_index(index), DenseRetriever.from_index(index, **dense_opts)], **kwargs)

    def retrieve(self, queries: Sequence[Query], k: int, *, filter: FilterArg | None = None) -> list[Ranking]:
        """Fused top-``k`` of each query among documents matching ``filter``, sorted by ``(-score, doc_id)``.

        Raises:
            ValidationError: ``k < 1``. FilterError: an invalid filter.
        """
        k, parsed = check_args(k, filter)  # parsed once, shared by the fused retrievers
        depth = max(k, self.depth if self.depth is not None else DEFAULT_DEPTH)
        per_retriever = [r.retrieve(queries, depth, filter=parsed) for r in self.retrievers]
        out = []
        for i in range(len(queries)):
            rankings = [rankings[i] for rankings in per_retriever]
            if self.fusion == "rrf":
                out.append(reciprocal_rank_fusion(rankings, k, self.rrf_k))
            else:
                out.append(weighted_score_fusion(rankings, k, self.weights, self.normalization))
        return out

    def __repr__(self) -> str:
        names = ", ".join(getattr(r, "name", type(r).__name__) for r in self.retrievers)
        return f"HybridRetriever([{names}], fusion={self.fusion!r}, depth={self.depth}, rrf_k={self.rrf_k})"

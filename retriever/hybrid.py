"""Hybrid first stage: fusion of BM25 and dense rankings (reciprocal rank fusion, or a
weighted sum of normalised scores)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from heedrank.errors import ValidationError
from heedrank.protocols import FilterArg, Retriever
from heedrank.types import Query, Ranking
from heedrank.retriever.base import check_args
from heedrank.retriever.fusion import NORMALIZATIONS, RRF_K, reciprocal_rank_fusion, weighted_score_fusion

DEFAULT_DEPTH = 100
"""Hits taken from each fused retriever (at least ``k``)."""
FUSIONS = ("rrf", "weighted")


class HybridRetriever:
    """Fusion of several retrievers (BM25 and dense by default), docs/design/algorithms.md section 5.

    Each retriever returns its top ``max(k, depth)`` under the same metadata filter;
    ``fusion="rrf"`` scores documents ``sum_r 1 / (rrf_k + rank_r(d))``,
    ``fusion="weighted"`` ``sum_r w_r * norm_r(d)`` (see
    :func:`heedrank.retriever.fusion.weighted_score_fusion`). Scores are unitless, higher = better;
    the top ``k`` are kept.

    Args:
        retrievers: The retrievers to fuse (at least one).
        depth: Hits per retriever; ``None`` = ``max(k, 100)``.
        rrf_k: RRF constant (60).
        fusion: ``"rrf"`` or ``"weighted"``.
        weights: Per-retriever weights of the weighted fusion (``None`` = equal).
        normalization: ``"minmax"`` or ``"zscore"`` (weighted fusion).
    """

    name = "hybrid"

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

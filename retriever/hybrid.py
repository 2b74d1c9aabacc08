"""Hybrid first stage: reciprocal rank fusion of BM25 and dense rankings."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from attnrank.errors import ValidationError
from attnrank.protocols import Filter, Retriever
from attnrank.types import Query, Ranking
from retriever.base import check_request
from retriever.fusion import RRF_K, reciprocal_rank_fusion

DEFAULT_DEPTH = 100
"""Hits taken from each fused retriever (at least ``k``)."""


class HybridRetriever:
    """RRF over several retrievers (BM25 and dense by default), ALGORITHMS.md section 5.

    Each retriever returns its top ``max(k, depth)``; documents are scored
    ``sum_r 1 / (rrf_k + rank_r(d))`` (unitless, higher = better) and the top ``k`` kept.

    Args:
        retrievers: The retrievers to fuse (at least one).
        depth: Hits per retriever; ``None`` = ``max(k, 100)``.
        rrf_k: RRF constant (60).
    """

    name = "hybrid"

    def __init__(self, retrievers: Sequence[Retriever], *, depth: int | None = None, rrf_k: int = RRF_K) -> None:
        if not retrievers:
            raise ValidationError("HybridRetriever needs at least one retriever")
        if depth is not None and depth < 1:
            raise ValidationError(f"depth must be >= 1, got {depth}")
        if rrf_k < 0:
            raise ValidationError(f"rrf_k must be >= 0, got {rrf_k}")
        self.retrievers = list(retrievers)
        self.depth = depth
        self.rrf_k = rrf_k

    @classmethod
    def from_index(cls, index: Any, **options: Any) -> HybridRetriever:
        """BM25 + dense over an :class:`index.store.Index`.

        Options: ``depth`` (int), ``rrf_k`` (int), ``show_progress`` (bool, dense encoding).

        Raises:
            ValidationError: the index has no vectors, or an unknown option.
        """
        from retriever.bm25 import BM25Retriever
        from retriever.dense import DenseRetriever

        depth = options.pop("depth", None)
        rrf_k = options.pop("rrf_k", RRF_K)
        dense_opts = {k: options.pop(k) for k in ("show_progress",) if k in options}
        if options:
            raise ValidationError(f"unknown hybrid retriever options: {sorted(options)}")
        if index.dense is None:
            raise ValidationError("this index has no dense vectors (built with --no-dense); hybrid needs them")
        return cls(
            [BM25Retriever.from_index(index), DenseRetriever.from_index(index, **dense_opts)], depth=depth, rrf_k=rrf_k
        )

    def retrieve(self, queries: Sequence[Query], k: int, *, filter: Filter | None = None) -> list[Ranking]:
        """Fused top-``k`` of each query, sorted by ``(-score, doc_id)``.

        Raises:
            ValidationError: ``k < 1`` or a metadata filter (not supported yet).
        """
        k = check_request(k, filter)
        depth = max(k, self.depth if self.depth is not None else DEFAULT_DEPTH)
        per_retriever = [r.retrieve(queries, depth, filter=filter) for r in self.retrievers]
        return [
            reciprocal_rank_fusion([rankings[i] for rankings in per_retriever], k, self.rrf_k)
            for i in range(len(queries))
        ]

    def __repr__(self) -> str:
        names = ", ".join(getattr(r, "name", type(r).__name__) for r in self.retrievers)
        return f"HybridRetriever([{names}], depth={self.depth}, rrf_k={self.rrf_k})"

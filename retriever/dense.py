"""Dense first stage: bi-encoder query embedding + vector search (exact, HNSW or IVF) with
metadata filters planned by :mod:`heedrank.index.planner`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from heedrank.errors import ValidationError
from heedrank.protocols import FilterArg
from heedrank.types import Query, Ranking, ScoredDoc
from heedrank.retriever.base import check_args

TIE_MARGIN = 8
"""Extra neighbours fetched so that ties at the ``k``-th score are broken by doc id."""


class DenseRetriever:
    """Cosine similarity between the query embedding and the document vectors.

    Scores are cosine similarities in ``[-1, 1]`` (inner products of L2-normalised
    vectors; with passage chunking, the best passage's). Every document gets a score, so
    a query gets ``min(k, matching documents)`` hits: with a filter, only matching
    documents, never fewer than exist (the planner falls back to exact search), never
    padding. HNSW and IVF indexes are approximate; flat is exact.

    Args:
        index: :class:`heedrank.index.store.Index` with vectors.
        show_progress: tqdm bar while encoding query batches.
        strategy: ``"auto"`` (the planner), ``"exact"`` or ``"ann"``.
    """

    name = "dense"
    requires = ("dense",)
    """The index parts it reads (:meth:`heedrank.index.store.Index.provides`): an index offers this retriever when it has them."""

    def __init__(self, index: Any, *, show_progress: bool = False, strategy: str = "auto") -> None:
        if index.dense is None:
            raise ValidationError("this index has no dense vectors (built with --no-dense); use the bm25 retriever")
        self.index = index
        self.show_progress = show_progress
        self.strategy = strategy
        self.last_report: Any = None

    @classmethod
    def from_index(cls, index: Any, **options: Any) -> DenseRetriever:
        """Build over an :class:`heedrank.index.store.Index`; the encoder loads on first retrieve.

        Options: ``show_progress`` (bool; default: the index's), ``strategy``
        (``"auto"``, ``"exact"``, ``"ann"``).

        Raises:
            ValidationError: the index has no vectors (built with ``--no-dense``), or an
                unknown option.
        """
        show = options.pop("show_progress", getattr(index, "show_progress", False))
        strategy = options.pop("strategy", "auto")
        if options:
            raise ValidationError(f"unknown dense retriever options: {sorted(options)}")
        return cls(index, show_progress=show, strategy=strategy)

    @property
    def encoder(self) -> Any:
        """The query encoder (loaded by the index on first access)."""
        return self.index.encoder

    def retrieve(self, queries: Sequence[Query], k: int, *, filter: FilterArg | None = None) -> list[Ranking]:
        """Top-``k`` of each query by cosine similarity among documents matching ``filter``,
        sorted by ``(-score, doc_id)``.

        Raises:
            ValidationError: ``k < 1``. FilterError: an invalid filter.
        """
        k, parsed = check_args(k, filter)
        if not queries:
            return []
        texts = [q.text for q in queries]
        vectors = np.asarray(self.encoder.encode_queries(texts, show_progress=self.show_progress), dtype=np.float32)
        rows, report = self.index.search_dense(vectors, k + TIE_MARGIN, filter=parsed, strategy=self.strategy)
        self.last_report = report
        out = []
        for q, (ids, scores) in zip(queries, rows):
            out.append(Ranking.from_hits(q.query_id, (ScoredDoc(d, float(s)) for d, s in zip(ids, scores.tolist())), k))
        return out

    def __repr__(self) -> str:
        return f"DenseRetriever({len(self.index.dense)} vectors, {self.index.dense.kind})"

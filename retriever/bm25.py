"""BM25 first stage over an index's bm25s matrix (see :mod:`index.bm25` for scoring and
tokenisation)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from attnrank.protocols import Filter
from attnrank.types import Query, Ranking, ScoredDoc
from retriever.base import check_request


class BM25Retriever:
    """Lucene-style BM25 (k1 = 0.9, b = 0.4) over ``title + " " + text``.

    Scores are BM25 sums (>= 0, unbounded, comparable only within one query). Only
    documents sharing at least one token with the query are returned, so a query may get
    fewer than ``k`` hits, or none. Ties are broken by doc id.

    Args:
        bm25: :class:`index.bm25.BM25Index`.
        doc_ids: Doc id of every BM25 row (``doc_ids[vid]``).
    """

    name = "bm25"

    def __init__(self, bm25: Any, doc_ids: Sequence[str]) -> None:
        if len(doc_ids) != bm25.num_docs:
            from attnrank.errors import IndexMismatchError

            raise IndexMismatchError(f"BM25 index has {bm25.num_docs} rows but {len(doc_ids)} doc ids were given")
        self.bm25 = bm25
        self.doc_ids = doc_ids

    @classmethod
    def from_index(cls, index: Any, **options: Any) -> BM25Retriever:
        """Build over an :class:`index.store.Index` (no options)."""
        if options:
            from attnrank.errors import ValidationError

            raise ValidationError(f"unknown bm25 retriever options: {sorted(options)}")
        return cls(index.bm25, index.doc_ids)

    def retrieve(self, queries: Sequence[Query], k: int, *, filter: Filter | None = None) -> list[Ranking]:
        """Top-``k`` of each query, sorted by ``(-score, doc_id)``.

        Raises:
            ValidationError: ``k < 1`` or a metadata filter (not supported yet).
        """
        k = check_request(k, filter)
        results = self.bm25.search([q.text for q in queries], k)
        ids = self.doc_ids
        return [
            Ranking.from_hits(q.query_id, (ScoredDoc(ids[v], float(s)) for v, s in zip(vids.tolist(), scores.tolist())), k)
            for q, (vids, scores) in zip(queries, results)
        ]

    def __repr__(self) -> str:
        return f"BM25Retriever({self.bm25.num_docs} docs)"

"""BM25 first stage over an index's bm25s matrix and delta (see :mod:`heedrank.index.bm25` for
scoring and tokenisation)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from heedrank.protocols import FilterArg
from heedrank.types import Query, Ranking, ScoredDoc
from heedrank.retriever.base import check_args


class BM25Retriever:
    """Lucene-style BM25 (k1 = 0.9, b = 0.4) over ``title + " " + text``.

    Scores are BM25 sums (>= 0, unbounded, comparable only within one query). Only
    documents sharing at least one token with the query are returned, so a query may get
    fewer than ``k`` hits, or none. Ties are broken by doc id. With a metadata filter,
    only matching documents are scored (exactly: BM25 scores every document).

    Args:
        index: :class:`heedrank.index.store.Index`.
    """

    name = "bm25"
    requires = ("bm25",)
    """The index parts it reads (:meth:`heedrank.index.store.Index.provides`): an index offers this retriever when it has them."""

    def __init__(self, index: Any) -> None:
        self.index = index

    @classmethod
    def from_index(cls, index: Any, **options: Any) -> BM25Retriever:
        """Build over an :class:`heedrank.index.store.Index` (no options)."""
        if options:
            from heedrank.errors import ValidationError

            raise ValidationError(f"unknown bm25 retriever options: {sorted(options)}")
        return cls(index)

    def retrieve(self, queries: Sequence[Query], k: int, *, filter: FilterArg | None = None) -> list[Ranking]:
        """Top-``k`` of each query among documents matching ``filter``, sorted by ``(-score, doc_id)``.

        Raises:
            ValidationError: ``k < 1``. FilterError: an invalid filter.
        """
        k, parsed = check_args(k, filter)
        results = self.index.search_bm25([q.text for q in queries], k, filter=parsed)
        out = []
        for q, (ids, scores) in zip(queries, results):
            out.append(Ranking.from_hits(q.query_id, (ScoredDoc(d, float(s)) for d, s in zip(ids, scores.tolist())), k))
        return out

    def __repr__(self) -> str:
        return f"BM25Retriever({self.index.bm25.num_live} docs)"

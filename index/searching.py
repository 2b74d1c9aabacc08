"""Searching an :class:`heedrank.index.store.Index`: BM25 and dense top-``k`` among the live
documents a metadata filter allows.

These functions are the Index's own: they hold its read lock (:attr:`~heedrank.index.store.Index.rw`)
while they filter, search and resolve vids to doc ids, so a concurrent delete cannot race
them. Callers use :meth:`~heedrank.index.store.Index.search_bm25` and
:meth:`~heedrank.index.store.Index.search_dense`, which delegate here; their docstrings are the
contract.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from heedrank.errors import NotFoundError

if TYPE_CHECKING:
    from heedrank.index.planner import SearchReport
    from heedrank.index.store import Index

Hits = list[tuple[list[str], np.ndarray]]
"""Per query ``(doc_ids, scores float32 (r,))``, by descending score."""


def search_bm25(index: Index, texts: Sequence[str], k: int, filter: Any) -> Hits:
    """See :meth:`heedrank.index.store.Index.search_bm25`."""
    with index.rw.read():
        allowed = index.filter_vids(filter)
        return [(index.doc_ids_of(v), s) for v, s in index.bm25.search(texts, k, allowed=allowed)]


def search_dense(index: Index, vectors: np.ndarray, k: int, filter: Any, strategy: str) -> tuple[Hits, SearchReport]:
    """See :meth:`heedrank.index.store.Index.search_dense`."""
    from heedrank.index.planner import planned_search

    if index.dense is None:
        raise NotFoundError("this index was built without dense vectors (--no-dense)")
    bits = index.group_bits
    with index.rw.read():
        dense = index.dense  # read under the lock: compaction swaps it under the write lock
        allowed = index.filter_vids(filter)
        if allowed is not None and bits:  # a document's vid -> the labels of its passages
            labels = np.asarray(dense.labels())
            allowed = labels[np.isin(labels >> bits, allowed)]
        rows, report = planned_search(
            dense, vectors, k, allowed=allowed, params=index.planner, strategy=strategy,
            group_bits=bits, max_group=index.max_group,
        )
        return [(index.doc_ids_of(v), s) for v, s in rows], report

"""Applying committed document changes to an :class:`heedrank.index.store.Index`'s in-memory
parts: BM25 (delta rows, masked rows), the vector index and the vid -> doc id table.

:meth:`heedrank.index.store.Index.add_documents` and
:meth:`~heedrank.index.store.Index.delete_documents` commit to the document store first,
then call these while holding the index's write lock (:attr:`~heedrank.index.store.Index.rw`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from heedrank.types import Document

if TYPE_CHECKING:
    from heedrank.index.store import Index


def apply_add(index: Index, result: list[tuple[str, int, int | None]], docs: Sequence[Document],
              vecs: Sequence[np.ndarray] | None) -> None:
    """Apply an upsert the document store committed: drop the replaced versions, add the new
    ones to BM25 (its delta) and the vector index, map their vids, clear the filter cache.

    Args:
        index: The index (its write lock held).
        result: The document store's ``upsert`` result, per document ``(doc_id, new vid,
            replaced vid or None)``, in ``docs`` order, new vids increasing.
        docs: The documents added.
        vecs: float32 ``(p, d)`` vectors per document (``None`` without dense vectors).
    """
    old = np.array([o for _, _, o in result if o is not None], dtype=np.int64)
    new = [v for _, v, _ in result]
    if len(old):
        drop_vids(index, old)
    index.bm25.add_documents(new, [d.content for d in docs])
    if index.dense is not None and vecs is not None:
        labels, x = index.label_rows(new, vecs)
        index.dense.add(x, labels)
        index.vectors_dirty = True
    table = index.doc_ids
    if new[-1] >= len(table):
        table.extend([None] * (new[-1] + 1 - len(table)))
    for (d, v, _) in result:
        table[v] = d
    index.clear_filter_cache()


def drop_vids(index: Index, vids: np.ndarray) -> None:
    """Remove the document versions ``vids`` (int64) from the in-memory parts: masked in
    BM25, their vectors deleted (HNSW: tombstoned), unmapped in the doc id table. The
    caller clears the filter cache."""
    index.bm25.mark_deleted(vids)
    if index.dense is not None:
        labels = np.asarray(index.dense.labels())
        index.dense.delete(labels[np.isin(labels >> index.group_bits, vids)])
        index.vectors_dirty = True
    table = index.doc_ids
    for v in vids.tolist():
        if 0 <= v < len(table):
            table[v] = None

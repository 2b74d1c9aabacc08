"""The lookups an :class:`heedrank.index.store.Index` derives from its document store and
keeps in memory: the vid -> doc id table (:class:`DocIdTable`) and the vid sets of recent
metadata filters (:class:`FilterCache`). Updates edit the first and clear the second.

Every stored version of a document has its own int64 ``vid`` (:mod:`heedrank.index.docstore`);
the table maps each vid to its doc id while that version is live, to ``None`` once it is
deleted or replaced. It is read from the document store on first use, replaced after the
catch-up at open and after compaction (:meth:`heedrank.index.store.Index.set_doc_ids`), and
edited in place by updates (:mod:`heedrank.index.updates`) under the index's write lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from heedrank.errors import NotFoundError
from heedrank.protocols import WritableDocStore

if TYPE_CHECKING:
    from heedrank.index.filters import BoolFilter


class DocIdTable:
    """``table[vid]``: the doc id of each live vid, ``None`` for dead ones.

    Args:
        docstore: The document store the table is read from (its ``vid_doc_pairs()`` and
            ``next_vid``).
        doc_ids: The table itself (vids ``0, 1, ...``) when known; ``None`` reads it on first use.
    """

    def __init__(self, docstore: WritableDocStore, doc_ids: Sequence[str] | None = None) -> None:
        self.docstore = docstore
        self._lock = threading.Lock()
        self._table: list[str | None] | None = list(doc_ids) if doc_ids is not None else None

    @property
    def table(self) -> list[str | None]:
        """The table, read from the document store on first use (a list edited in place by updates)."""
        table = self._table
        if table is None:
            with self._lock:
                table = self._table
                if table is None:
                    table = self.replace(*self.docstore.vid_doc_pairs())
        return table

    def replace(self, vids: np.ndarray, ids: Sequence[str]) -> list[str | None]:
        """Replace the table with live ``vids`` (int64) and their ``ids``; returns the new
        table, long enough for every vid below the document store's ``next_vid``."""
        top = int(vids.max()) + 1 if len(vids) else 0
        table: list[str | None] = [None] * max(top, int(self.docstore.next_vid))
        for v, d in zip(vids.tolist(), ids):
            table[v] = d
        self._table = table
        return table

    def ids_of(self, vids: Sequence[int] | np.ndarray) -> list[str]:
        """Doc ids of live ``vids``, in order.

        Raises:
            NotFoundError: a vid that is not live (deleted, replaced or never assigned).
        """
        table = self.table
        out = []
        for v in np.asarray(vids).tolist():
            d = table[v] if 0 <= v < len(table) else None
            if d is None:
                raise NotFoundError(f"vid {v} is not a live document")
            out.append(d)
        return out

    def live_vids(self) -> np.ndarray:
        """Sorted int64 vids of the live documents."""
        table = self.table
        return np.fromiter((v for v, d in enumerate(table) if d is not None), dtype=np.int64)


class FilterCache:
    """Sorted int64 vids matching each of the ``size`` most recently used metadata filters.

    Args:
        compute: The vids of a parsed filter (the document store's ``filter_vids``).
        size: Filters kept; the least recently used is dropped beyond it.
    """

    def __init__(self, compute: Callable[[BoolFilter], np.ndarray], size: int) -> None:
        self._compute = compute
        self._size = size
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    def vids(self, flt: Any) -> np.ndarray | None:
        """The vids (read-only) of ``flt``: a parsed :class:`heedrank.index.filters.BoolFilter`,
        its JSON form (parsed here) or ``None`` (no filter: returns ``None``).

        Raises:
            FilterError: an invalid filter.
        """
        from heedrank.index.filters import as_filter, cache_key

        parsed: BoolFilter | None = as_filter(flt)
        if parsed is None:
            return None
        key = cache_key(parsed)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        vids = self._compute(parsed)
        vids.setflags(write=False)
        with self._lock:
            self._cache[key] = vids
            while len(self._cache) > self._size:
                self._cache.popitem(last=False)
        return vids

    def clear(self) -> None:
        """Forget every filter's vids (an update changed them)."""
        with self._lock:
            self._cache.clear()

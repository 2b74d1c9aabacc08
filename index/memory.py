"""In-memory document store: for tests, small corpora and TREC DL candidate passages."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from heedrank.errors import NotFoundError, ValidationError
from heedrank.types import Document


class InMemoryDocStore:
    """Documents by id in a dict; implements :class:`heedrank.protocols.WritableDocStore`
    like :class:`heedrank.index.docstore.SQLiteDocStore` (vids that only grow, :meth:`upsert`,
    :meth:`delete`, :meth:`filter_vids` with :func:`heedrank.index.filters.matches`), nothing durable.

    Args:
        docs: The documents; ``vid`` (0, 1, ...) follows iteration order.

    Raises:
        ValidationError: a doc id occurs twice.
    """

    def __init__(self, docs: Iterable[Document] = ()) -> None:
        self._docs: dict[str, tuple[int, Document]] = {}
        self._next_vid = 0
        self.add_many(docs)

    def add_many(self, docs: Iterable[Document]) -> int:
        """Append documents. Returns the number added. Raises ValidationError on a repeated id."""
        n = 0
        for doc in docs:
            if doc.doc_id in self._docs:
                raise ValidationError(f"duplicate document id {doc.doc_id!r}")
            self._docs[doc.doc_id] = (self._next_vid, doc)
            self._next_vid += 1
            n += 1
        return n

    def upsert(self, docs: Sequence[Document], vectors: Sequence[Any] | None = None) -> list[tuple[str, int, int | None]]:
        """Add or replace documents; each gets a new vid. Returns ``(doc_id, new_vid, old_vid)``
        per document. ``vectors`` is accepted for parity with SQLite and not stored."""
        from heedrank.index.docstore import _check_unique, metadata_json

        docs = list(docs)
        _check_unique(docs)
        for d in docs:
            metadata_json(d)
        out = []
        for d in docs:
            prev = self._docs.pop(d.doc_id, (None, None))[0]
            self._docs[d.doc_id] = (self._next_vid, d)
            out.append((d.doc_id, self._next_vid, prev))
            self._next_vid += 1
        return out

    def delete(self, doc_ids: Sequence[str]) -> list[tuple[str, int]]:
        """Delete documents (unknown ids ignored). Returns ``(doc_id, vid)`` of each deleted one."""
        out = []
        for d in dict.fromkeys(doc_ids):
            entry = self._docs.pop(d, None)
            if entry is not None:
                out.append((d, entry[0]))
        return out

    def pending_vectors(self, vids: Sequence[int] | np.ndarray) -> dict[int, np.ndarray]:
        """Always ``{}``: an in-memory index has no vector file to catch up."""
        return {}

    def discard_vectors(self, max_vid: int) -> int:
        """Nothing to forget (see :meth:`pending_vectors`); returns 0."""
        return 0

    def close(self) -> None:
        """Nothing to release."""

    @property
    def next_vid(self) -> int:
        return self._next_vid

    def filter_vids(self, flt: Any = None) -> np.ndarray:
        """Sorted int64 vids of the documents matching a filter (see :mod:`heedrank.index.filters`)."""
        from heedrank.index.filters import as_filter, matches

        f = as_filter(flt)
        vids = [vid for vid, doc in self._docs.values() if matches(f, doc.doc_id, doc.metadata)]
        return np.asarray(sorted(vids), dtype=np.int64)

    def vid_doc_pairs(self) -> tuple[np.ndarray, list[str]]:
        """``(vids int64 (n,), doc_ids)`` ordered by vid."""
        pairs = sorted((vid, d) for d, (vid, _) in self._docs.items())
        return np.asarray([p[0] for p in pairs], dtype=np.int64), [p[1] for p in pairs]

    def get_by_vids(self, vids: Sequence[int] | np.ndarray) -> list[tuple[int, Document]]:
        """``(vid, Document)`` of the vids that exist, in vid order."""
        wanted = {int(v) for v in vids}
        return sorted(((vid, doc) for vid, doc in self._docs.values() if vid in wanted), key=lambda p: p[0])

    def get_many(self, doc_ids: Sequence[str]) -> dict[str, Document]:
        """The documents that exist among ``doc_ids``, in request order (missing ids absent)."""
        return {d: self._docs[d][1] for d in dict.fromkeys(doc_ids) if d in self._docs}

    def get(self, doc_id: str) -> Document:
        """One document. Raises NotFoundError if absent."""
        try:
            return self._docs[doc_id][1]
        except KeyError:
            raise NotFoundError(f"document {doc_id!r} not found") from None

    def vids_of(self, doc_ids: Sequence[str]) -> dict[str, int]:
        """``{doc_id: vid}`` for the ids that exist."""
        return {d: self._docs[d][0] for d in dict.fromkeys(doc_ids) if d in self._docs}

    def doc_ids(self) -> list[str]:
        """Every doc id in ``vid`` order."""
        return self.vid_doc_pairs()[1]

    def iter_with_vids(self, batch_size: int = 1000) -> Iterator[tuple[int, Document]]:
        """``(vid, Document)`` of all documents in vid order."""
        return iter(sorted(self._docs.values(), key=lambda p: p[0]))

    def iter_documents(self, batch_size: int = 1000) -> Iterator[Document]:
        """All documents in vid order (``batch_size`` is accepted for parity with SQLite)."""
        return iter([doc for _, doc in sorted(self._docs.values(), key=lambda p: p[0])])

    def __iter__(self) -> Iterator[Document]:
        return self.iter_documents()

    def __contains__(self, doc_id: object) -> bool:
        return doc_id in self._docs

    def __len__(self) -> int:
        return len(self._docs)

    def __repr__(self) -> str:
        return f"InMemoryDocStore({len(self)} documents)"

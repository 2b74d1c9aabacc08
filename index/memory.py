"""In-memory document store: for tests, small corpora and TREC DL candidate passages."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

from attnrank.errors import NotFoundError, ValidationError
from attnrank.types import Document


class InMemoryDocStore:
    """Documents by id in a dict; implements :class:`attnrank.protocols.DocStore`.

    Args:
        docs: The documents; ``vid`` (position) follows iteration order.

    Raises:
        ValidationError: a doc id occurs twice.
    """

    def __init__(self, docs: Iterable[Document] = ()) -> None:
        self._docs: dict[str, Document] = {}
        self.add_many(docs)

    def add_many(self, docs: Iterable[Document]) -> int:
        """Append documents. Returns the number added. Raises ValidationError on a repeated id."""
        n = 0
        for doc in docs:
            if doc.doc_id in self._docs:
                raise ValidationError(f"duplicate document id {doc.doc_id!r}")
            self._docs[doc.doc_id] = doc
            n += 1
        return n

    def get_many(self, doc_ids: Sequence[str]) -> dict[str, Document]:
        """The documents that exist among ``doc_ids``, in request order (missing ids absent)."""
        return {d: self._docs[d] for d in dict.fromkeys(doc_ids) if d in self._docs}

    def get(self, doc_id: str) -> Document:
        """One document. Raises NotFoundError if absent."""
        try:
            return self._docs[doc_id]
        except KeyError:
            raise NotFoundError(f"document {doc_id!r} not found") from None

    def doc_ids(self) -> list[str]:
        """Every doc id in insertion (``vid``) order."""
        return list(self._docs)

    def iter_documents(self, batch_size: int = 1000) -> Iterator[Document]:
        """All documents in insertion order (``batch_size`` is accepted for parity with SQLite)."""
        return iter(list(self._docs.values()))

    def __iter__(self) -> Iterator[Document]:
        return self.iter_documents()

    def __contains__(self, doc_id: object) -> bool:
        return doc_id in self._docs

    def __len__(self) -> int:
        return len(self._docs)

    def __repr__(self) -> str:
        return f"InMemoryDocStore({len(self)} documents)"

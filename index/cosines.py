"""The embedder's cosine of a query with candidate documents: the ``dense`` signal of the
default's scorer (:mod:`heedrank.scorer`).

A candidate the index holds is read from its stored vector, not re-encoded
(:func:`stored_cosines`: ``/search``); any other (``/rerank``'s
documents, ``rerank-batch`` and ``eval trec-dl``'s passages) is encoded by the same embedder with
its truncation, in one batch, and its vector kept in a bounded cache keyed by the text's sha256,
so a repeated document costs nothing.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np

from heedrank.index.passages import labels_for
from heedrank.types import Document

CACHE_VECTORS = 50_000
"""Document vectors kept (384 float32 each for the default embedder: about 77 MB)."""


def stored_cosines(index: Any, query: np.ndarray, doc_ids: Sequence[str]) -> dict[str, float]:
    """Cosine similarity of one query embedding with documents' stored vectors, no re-encoding
    (chunked documents: the best passage's, as the dense retriever scores them).

    Args:
        index: An opened :class:`heedrank.index.store.Index`.
        query: float32 ``(dim,)`` L2-normalised query embedding (the index's encoder's).
        doc_ids: Documents to score.

    Returns:
        ``{doc_id: cosine in [-1, 1]}`` for the ids that have a stored vector; empty when the
        index has no dense vectors.
    """
    if index.dense is None or not len(doc_ids):
        return {}
    with index.rw.read():
        vids = index.docstore.vids_of(doc_ids)
        if not vids:
            return {}
        ids = list(vids)
        wanted = [labels_for(vids[d], index.max_group, index.group_bits) for d in ids]
        owner = np.repeat(np.arange(len(ids)), [len(w) for w in wanted])
        labels = np.concatenate(wanted)
        stored = np.asarray(index.dense.labels())
        pos = np.minimum(np.searchsorted(stored, labels), max(len(stored) - 1, 0))
        present = (stored[pos] == labels) if len(stored) else np.zeros(len(labels), dtype=bool)
        if not present.any():
            return {}
        sims = index.dense.vectors(labels[present]) @ np.asarray(query, dtype=np.float32).reshape(-1)
    best = np.full(len(ids), -np.inf)
    np.maximum.at(best, owner[present], sims)
    return {d: float(s) for d, s in zip(ids, best) if np.isfinite(s)}


class DenseSignal:
    """Cosines of a query with documents (module docstring).

    Args:
        encoder: The embedder (``encode_queries``, ``encode_documents``: L2-normalised float32 rows).
        index: An opened :class:`heedrank.index.store.Index` whose stored vectors serve the
            documents it holds, or ``None``.
        cache_vectors: Document vectors kept, by text hash.
    """

    def __init__(self, encoder: Any, index: Any = None, *, cache_vectors: int = CACHE_VECTORS) -> None:
        self.encoder = encoder
        self.index = index
        self.cache_vectors = cache_vectors
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def of_index(cls, index: Any) -> DenseSignal | None:
        """The signal of an index's embedder, or ``None`` for an index built without vectors."""
        return None if getattr(index, "dense", None) is None else cls(index.encoder, index)

    @classmethod
    def packaged(cls) -> DenseSignal:
        """The packaged default embedder's (all-MiniLM-L6-v2), for documents without an index: one
        per process (its model loads on first use, and its cache serves every pipeline)."""
        return _packaged()

    def describe(self) -> dict[str, Any]:
        return {"embedder": self.encoder.describe().get("name") if hasattr(self.encoder, "describe") else None,
                "stored_vectors": self.index is not None}

    def cosines(self, query: str, documents: Sequence[Document], *, stored: bool = True) -> dict[str, float]:
        """``{doc_id: cosine in [-1, 1]}`` of ``query`` with every document.

        Args:
            query: The query text.
            documents: The candidates (their ``content`` is encoded when not read from the index).
            stored: Read the index's stored vectors for the documents it holds (``/search``);
                ``False``: the documents are the caller's texts (``/rerank``).
        """
        if not documents:
            return {}
        qv = np.asarray(self.encoder.encode_queries([query]), dtype=np.float32)[0]
        out: dict[str, float] = {}
        if stored and self.index is not None:
            out = stored_cosines(self.index, qv, [d.doc_id for d in documents])
        rest = [d for d in documents if d.doc_id not in out]
        if rest:
            for d, v in zip(rest, self._vectors([d.content for d in rest])):
                out[d.doc_id] = float(v @ qv)
        return out

    def _vectors(self, texts: Sequence[str]) -> list[np.ndarray]:
        keys = [hashlib.sha256(t.encode("utf-8")).hexdigest() for t in texts]
        with self._lock:
            have = {k: self._cache[k] for k in keys if k in self._cache}
            for k in have:
                self._cache.move_to_end(k)
        todo = list(dict.fromkeys(k for k in keys if k not in have))
        if todo:
            first = {k: t for k, t in zip(keys, texts)}
            new = np.asarray(self.encoder.encode_documents([first[k] for k in todo]), dtype=np.float32)
            with self._lock:
                for k, v in zip(todo, new):
                    have[k] = v
                    self._cache[k] = v
                while len(self._cache) > self.cache_vectors:
                    self._cache.popitem(last=False)
        return [have[k] for k in keys]


@functools.lru_cache(maxsize=1)
def _packaged() -> DenseSignal:
    from heedrank.index.encoder import SentenceTransformerEncoder

    return DenseSignal(SentenceTransformerEncoder())

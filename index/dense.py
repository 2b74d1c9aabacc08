"""Exact inner-product vector index (faiss), the ``vectors.faiss`` file of an index directory.

``faiss.IndexIDMap2(faiss.IndexFlatIP(d))``: brute-force inner product over float32
vectors, each stored with an int64 label = the document's ``vid`` (its row in the
document store). With L2-normalised vectors the score is the cosine similarity in
``[-1, 1]``.

faiss pads results with label ``-1`` (and score ``-inf``) when fewer than ``k`` vectors
exist; :meth:`DenseIndex.search` strips that padding, so ``-1`` never leaves this module.
``faiss`` is imported when an index is created or loaded.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np

from attnrank.errors import NotFoundError, ValidationError, require

logger = logging.getLogger(__name__)

VECTORS_FILE = "vectors.faiss"
INDEX_TYPE = "IndexIDMap2(IndexFlatIP)"


def _as_matrix(x: np.ndarray, dim: int, what: str) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2 or x.shape[1] != dim:
        raise ValidationError(f"{what} must have shape (n, {dim}), got {x.shape}")
    return np.ascontiguousarray(x, dtype=np.float32)


class DenseIndex:
    """faiss exact inner-product index with ``vid`` labels.

    Args:
        dim: Vector dimension.
        index: An existing faiss index (used by :meth:`load`); ``None`` creates an empty one.
    """

    def __init__(self, dim: int, index: Any = None) -> None:
        if index is None:
            faiss = require("faiss", "index")
            index = faiss.IndexIDMap2(faiss.IndexFlatIP(int(dim)))
        self.index = index
        self.dim = int(dim)
        self._write_lock = threading.Lock()

    def __len__(self) -> int:
        return int(self.index.ntotal)

    def add(self, vectors: np.ndarray, ids: np.ndarray) -> None:
        """Add vectors with their labels.

        Args:
            vectors: float32 ``(n, dim)`` (L2-normalised for cosine scores).
            ids: int64 ``(n,)`` labels (document ``vid``), >= 0.

        Raises:
            ValidationError: shape mismatch or a negative id.
        """
        x = _as_matrix(vectors, self.dim, "vectors")
        labels = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
        if len(labels) != len(x):
            raise ValidationError(f"got {len(x)} vectors but {len(labels)} ids")
        if len(labels) and labels.min() < 0:
            raise ValidationError("vector ids must be >= 0 (-1 is faiss's padding sentinel)")
        with self._write_lock:
            self.index.add_with_ids(x, labels)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` vectors by inner product, ``k`` clamped to the index size.

        Args:
            queries: float32 ``(n, dim)``.
            k: Hits wanted per query.

        Returns:
            ``(scores float32 (n, k'), ids int64 (n, k'))`` with ``k' = min(k, len(self))``,
            each row sorted by descending score. No ``-1`` padding ever appears.
        """
        q = _as_matrix(queries, self.dim, "queries")
        kk = min(int(k), len(self))
        if kk <= 0 or len(q) == 0:
            return np.zeros((len(q), 0), dtype=np.float32), np.zeros((len(q), 0), dtype=np.int64)
        scores, ids = self.index.search(q, kk)
        if (ids < 0).any():  # defensive: cannot happen for flat indexes with kk <= ntotal
            keep = int((ids >= 0).sum(axis=1).min())
            logger.warning("faiss returned -1 padding; cutting results to %d per query", keep)
            scores, ids = scores[:, :keep], ids[:, :keep]
        return scores.astype(np.float32, copy=False), ids.astype(np.int64, copy=False)

    def reconstruct(self, vid: int) -> np.ndarray:
        """The stored float32 ``(dim,)`` vector of label ``vid``. Raises NotFoundError."""
        try:
            return np.asarray(self.index.reconstruct(int(vid)), dtype=np.float32)
        except RuntimeError:
            raise NotFoundError(f"no vector with id {vid}") from None

    def save(self, path: str | Path) -> None:
        """Write the faiss index to ``path`` (usually ``<index>/vectors.faiss``)."""
        faiss = require("faiss", "index")
        faiss.write_index(self.index, str(path))

    @classmethod
    def load(cls, path: str | Path) -> DenseIndex:
        """Read a faiss index file. Raises NotFoundError when missing or unreadable."""
        path = Path(path)
        if not path.is_file():
            raise NotFoundError(f"vector index not found: {path}")
        faiss = require("faiss", "index")
        try:
            index = faiss.read_index(str(path))
        except RuntimeError as exc:
            raise NotFoundError(f"vector index {path} is unreadable ({exc})") from exc
        return cls(index.d, index)

    def describe(self) -> dict[str, Any]:
        return {"index_type": INDEX_TYPE, "dim": self.dim, "ntotal": len(self), "metric": "inner_product"}

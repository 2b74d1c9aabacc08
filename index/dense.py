"""Inner-product vector indexes (faiss): exact flat, HNSW and IVF, the ``vectors.faiss``
file of an index directory.

Every vector carries an int64 *label* (``>= 0``): the document's ``vid`` (one version of
one document; see :mod:`heedrank.index.docstore`), or ``vid << passage_bits | j`` for passage ``j``
of a chunked document (:mod:`heedrank.index.passages`). Labels only ever grow: :meth:`DenseIndex.add`
refuses a label not above every stored one, so the stored labels are always sorted.

=========  ===================================================  ===========================
type       faiss index                                          delete
=========  ===================================================  ===========================
``flat``   ``IndexIDMap2(IndexFlatIP)``: exact                  in place (``remove_ids``)
``hnsw``   ``IndexIDMap2(IndexHNSWFlat(M, IP))``: graph ANN     tombstones, until a rebuild
           (``efConstruction``, ``efSearch``)                   (:meth:`DenseIndex.rebuilt`)
``ivf``    ``IndexIVFFlat(IndexFlatIP quantizer, nlist, IP)``   in place (``remove_ids``)
           (``nprobe``), direct map for reconstruction; with
           ``ivf_storage="sq8"`` ``IndexIVFScalarQuantizer``
           (``QT_8bit``: one byte a dimension)
=========  ===================================================  ===========================

With L2-normalised vectors the score is the cosine similarity in ``[-1, 1]``.

Two searches (the planner in :mod:`heedrank.index.planner` picks one):

* :meth:`DenseIndex.search_exact`: brute force over the allowed labels only (faiss
  ``IDSelectorArray`` on the flat storage: ``O(m d)`` for ``m`` allowed vectors). Exact
  for every index type (over the decoded vectors for IVF's ``sq8`` storage).
* :meth:`DenseIndex.search_ann`: the index's own search with an ``IDSelector`` passed
  through faiss ``SearchParameters`` (bitmap over positions for flat/HNSW, over labels
  for IVF), with ``efSearch`` / ``nprobe`` per call. Under a selective filter HNSW and IVF
  may return fewer than ``k`` hits: the selector only drops non-matching vectors from the
  results, it does not widen the search.

faiss pads short results with label ``-1`` and score ``-inf``; both searches strip the
padding, so ``-1`` never leaves this module. ``faiss`` is imported when an index is
created or loaded.

:class:`DenseParams` and the construction of each faiss type live in
:mod:`heedrank.index.dense_build` (re-exported here); the searches, the faiss selectors
they use and the HNSW tombstones in :mod:`heedrank.index.dense_search`.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

from heedrank.errors import NotFoundError, ValidationError, require
from heedrank.files import write_atomic
from heedrank.index.dense_build import (
    INDEX_TYPE,
    INDEX_TYPES,
    TRAIN_POINTS_PER_CELL,
    DenseParams,
    auto_nlist,
    create_index,
    params_of,
    train_ivf,
    training_sample,
)
from heedrank.index.dense_search import (
    FaissSearch,
    Tombstones,
    as_labels,
    as_matrix,
    inner_index,
    ivf_labels,
    ivf_vectors,
    positions_of,
    stored_vectors,
    strip_padding,
)
from heedrank.index.rwlock import RWLock

__all__ = ["INDEX_TYPE", "INDEX_TYPES", "VECTORS_FILE", "DenseIndex", "DenseParams", "auto_nlist", "strip_padding"]

logger = logging.getLogger(__name__)

VECTORS_FILE = "vectors.faiss"


class DenseIndex:
    """A faiss inner-product index over labelled vectors (see the module docstring).

    Thread-safe: searches share a read lock; :meth:`add` and :meth:`delete` take the
    write lock.

    Args:
        dim: Vector dimension.
        params: Index type and parameters; ignored when ``index`` is given.
        index: An existing faiss index (:meth:`load`); ``None`` creates an empty one (an
            IVF index must be trained first: use :meth:`build`).

    Example:
        >>> x = np.eye(4, dtype=np.float32)
        >>> ix = DenseIndex.build(x, np.array([10, 11, 12, 13]), DenseParams("hnsw"))
        >>> [lab.tolist() for lab, _ in ix.search_exact(x[:1], 2, allowed=np.array([11, 12, 13]))]
        [[11, 12]]
    """

    def __init__(self, dim: int, params: DenseParams | None = None, index: Any = None) -> None:
        self.faiss = require("faiss", "index")
        self.dim = int(dim)
        if index is None:
            params = (params or DenseParams()).for_size(0)  # an empty index: auto is flat
            index = create_index(self.faiss, self.dim, params)
        else:
            params = params_of(self.faiss, index, params)
        self.index = index
        self.params = params
        self._lock = RWLock()
        self._tombstones = Tombstones()
        self._ivf_labels = ivf_labels(self.faiss, index) if params.index_type == "ivf" else None
        labels = self.labels()
        if len(labels) > 1 and not (np.diff(labels) > 0).all():
            raise NotFoundError("vector index labels are not strictly increasing; rebuild the index")

    # -- construction (faiss types: heedrank.index.dense_build) ---------------------------
    @classmethod
    def build(
        cls, vectors: np.ndarray, labels: np.ndarray, params: DenseParams | None = None, *, dim: int | None = None
    ) -> DenseIndex:
        """Create an index of ``params.index_type`` over ``vectors`` (IVF: trained on them, or on a
        sample of them past :data:`~heedrank.index.dense_build.TRAIN_POINTS_PER_CELL` a cell):
        :meth:`build_streamed` with one part.

        Args:
            vectors: float32 ``(n, d)``.
            labels: int64 ``(n,)``, strictly increasing, ``>= 0``.
            params: Index type and parameters (``"auto"`` resolved for ``len(vectors)``:
                :meth:`heedrank.index.dense.DenseParams.for_size`).
            dim: Dimension when ``vectors`` is empty.

        Raises:
            ValidationError: shapes, labels, or an IVF index over fewer vectors than ``nlist``.
        """
        d = int(dim if dim is not None else np.asarray(vectors).shape[-1])
        x = as_matrix(vectors, d, "vectors")
        return cls.build_streamed(lambda: ((x, labels),), len(x), params, dim=d)

    @classmethod
    def build_streamed(
        cls, parts: Callable[[], Iterable[tuple[np.ndarray, np.ndarray]]], n: int, params: DenseParams | None = None,
        *, dim: int,
    ) -> DenseIndex:
        """:meth:`build` over vectors that come in parts, never all held at once: each call of
        ``parts`` yields the same ``(vectors, labels)`` pairs in the same order (e.g. read back
        from a build's checkpoint files), ``n`` vectors in all, labels strictly increasing across
        them. An IVF index is trained on a seeded uniform sample of at most
        :data:`~heedrank.index.dense_build.TRAIN_POINTS_PER_CELL` vectors a cell (one pass; all
        of them when they are fewer, so the result is :meth:`build`'s), then every part is added
        (a second pass). Peak memory: the index, the sample and one part.

        Raises:
            ValidationError: as :meth:`build`; the parts hold other than ``n`` vectors.
        """
        params = (params or DenseParams()).for_size(n)
        if params.index_type != "ivf":
            out = cls(dim, params)
        else:  # nlist resolved for all n vectors, not for the sample
            params = replace(params, nlist=params.nlist or auto_nlist(n))
            sample = training_sample(parts(), n, TRAIN_POINTS_PER_CELL * params.nlist)
            ivf, params = train_ivf(require("faiss", "index"), sample, params)
            del sample
            out = cls(dim, params, index=ivf)
        added = 0
        for x, labels in parts():
            out.add(x, labels)
            added += len(labels)
        if added != n:
            raise ValidationError(f"expected {n} vectors, the parts held {added}")
        return out

    # -- parts ---------------------------------------------------------------------------
    @property
    def kind(self) -> str:
        """``"flat"``, ``"hnsw"`` or ``"ivf"``."""
        return self.params.index_type

    def labels(self) -> np.ndarray:
        """Sorted int64 labels of every stored vector (tombstoned ones included); position
        ``i`` of flat/HNSW storage holds ``labels()[i]``. A view: copy it to keep it."""
        if self._ivf_labels is not None:
            return self._ivf_labels
        id_map = self.index.id_map
        n = int(id_map.size())
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        return self.faiss.rev_swig_ptr(id_map.data(), n)

    def __len__(self) -> int:
        """Stored vectors, tombstoned ones included."""
        return int(self.index.ntotal)

    @property
    def num_live(self) -> int:
        """Stored vectors that are not tombstoned."""
        return len(self) - len(self._tombstones)

    @property
    def tombstones(self) -> frozenset[int]:
        """Labels deleted but still in the graph (HNSW only; empty for flat/IVF)."""
        return self._tombstones.labels()

    def positions(self, labels: np.ndarray) -> np.ndarray:
        """Positions of stored ``labels`` in :meth:`labels` order; absent labels are dropped."""
        return positions_of(self.labels(), labels)

    # -- writing -------------------------------------------------------------------------
    def add(self, vectors: np.ndarray, ids: np.ndarray) -> None:
        """Add vectors with their labels.

        Args:
            vectors: float32 ``(n, dim)`` (L2-normalised for cosine scores).
            ids: int64 ``(n,)`` labels, ``>= 0``, strictly increasing and above every
                stored label (labels are never reused).

        Raises:
            ValidationError: shape mismatch, a negative, repeated or non-increasing label.
        """
        x = as_matrix(vectors, self.dim, "vectors")
        labels = as_labels(ids)
        if len(labels) != len(x):
            raise ValidationError(f"got {len(x)} vectors but {len(labels)} ids")
        if not len(labels):
            return
        if labels.min() < 0:
            raise ValidationError("vector ids must be >= 0 (-1 is faiss's padding sentinel)")
        if len(labels) > 1 and not (np.diff(labels) > 0).all():
            raise ValidationError("vector ids must be strictly increasing")
        with self._lock.write():
            stored = self.labels()
            if len(stored) and labels[0] <= stored[-1]:
                raise ValidationError(
                    f"vector id {int(labels[0])} is not above the largest stored id {int(stored[-1])}; ids are never reused"
                )
            self.index.add_with_ids(x, labels)
            if self._ivf_labels is not None:
                self._ivf_labels = np.concatenate([self._ivf_labels, labels])
            self._tombstones.grow(len(labels))

    def delete(self, ids: np.ndarray) -> int:
        """Delete vectors by label: in place for flat and IVF, as tombstones for HNSW
        (excluded from every search until :meth:`rebuilt`). Unknown labels are ignored.

        Returns:
            Number of stored vectors deleted or tombstoned.
        """
        labels = np.unique(as_labels(ids))
        with self._lock.write():
            present = self.labels()
            labels = labels[np.isin(labels, present)]
            if not len(labels):
                return 0
            if self.kind == "hnsw":
                return self._tombstones.add(labels, present)
            if self.kind == "ivf":
                removed = int(self.index.remove_ids(self.faiss.IDSelectorArray(labels)))
                self._ivf_labels = np.setdiff1d(self.labels(), labels, assume_unique=True)
                return removed
            return int(self.index.remove_ids(self.faiss.IDSelectorBatch(labels)))

    def rebuilt(self, params: DenseParams | None = None) -> DenseIndex:
        """A new index of the live vectors only (tombstones dropped; IVF retrained).

        Holds the read lock while copying the vectors; building runs without it.
        """
        params = params or self.params
        with self._lock.read():
            live = self._tombstones.drop(self.labels().copy())
            vectors = self.vectors(live)
        if params.index_type == "ivf" and len(vectors) < (params.nlist or 1):
            params = replace(params, nlist=auto_nlist(len(vectors)))
        return DenseIndex.build(vectors, live, params, dim=self.dim)

    # -- reading -------------------------------------------------------------------------
    def vectors(self, labels: np.ndarray) -> np.ndarray:
        """float32 ``(m, d)`` stored vectors of ``labels`` (all present). Raises NotFoundError."""
        labels = as_labels(labels)
        if self.kind == "ivf":
            return ivf_vectors(self.index, labels, self.dim)
        pos = self.positions(labels)
        if len(pos) != len(labels):
            raise NotFoundError("a vector id is not in the index")
        return stored_vectors(self.faiss, self.index, self.kind, self.dim)[pos]

    def reconstruct(self, vid: int) -> np.ndarray:
        """The stored float32 ``(dim,)`` vector of label ``vid``. Raises NotFoundError."""
        return self.vectors(np.array([vid]))[0]

    def search_exact(
        self, queries: np.ndarray, k: int, *, allowed: np.ndarray | None = None
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Exact top-``k`` by inner product among ``allowed`` labels (``None`` = all live).

        Flat and HNSW search their ``IndexFlat`` storage directly: with a filter through an
        ``IDSelectorArray`` of the allowed positions (faiss then computes only those inner
        products, ``O(m d)``), with tombstones only through a position bitmap. IVF gathers
        the allowed vectors (small sets) or visits every cell with a label selector.

        Args:
            queries: float32 ``(n, dim)``.
            k: Hits wanted per query.
            allowed: int64 labels the results must come from (absent ones are ignored);
                tombstoned labels are always excluded.

        Returns:
            Per query ``(labels int64 (r,), scores float32 (r,))`` sorted by descending
            score, ``r = min(k, number of allowed live vectors)``.
        """
        q = as_matrix(queries, self.dim, "queries")
        with self._lock.read():
            return self._search().exact(q, int(k), allowed)

    def _search(self) -> FaissSearch:
        """The searches over the stored labels and tombstones as they are now (hold the read lock)."""
        return FaissSearch(self.faiss, self.index, self.params, self.labels(), self._tombstones)

    def search_ann(
        self,
        queries: np.ndarray,
        k: int,
        *,
        allowed: np.ndarray | None = None,
        ef_search: int | None = None,
        nprobe: int | None = None,
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """The index's own top-``k`` search restricted to ``allowed`` labels by an ``IDSelector``.

        Flat indexes search exactly. HNSW and IVF are approximate and, under a selective
        ``allowed`` set, may return fewer than ``min(k, len(allowed))`` hits per query
        (the planner then retries exactly).

        Args:
            queries: float32 ``(n, dim)``.
            k: Hits wanted per query.
            allowed: int64 labels the results must come from; ``None`` = all live.
            ef_search: HNSW candidate list size (default: ``params.ef_search``).
            nprobe: IVF cells visited (default: ``params.nprobe``; capped at ``nlist``).

        Returns:
            Per query ``(labels int64 (r,), scores float32 (r,))``, sorted by descending
            score, ``r <= k``; no ``-1`` padding.
        """
        if self.kind == "flat":
            return self.search_exact(queries, k, allowed=allowed)
        q = as_matrix(queries, self.dim, "queries")
        with self._lock.read():
            return self._search().ann(q, int(k), allowed, ef_search, nprobe)

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Unfiltered top-``k`` as ``(scores float32 (n, k'), labels int64 (n, k'))``,
        ``k' = min(k, live vectors)``: exact for flat; HNSW/IVF rows are cut to the shortest
        row's length (never padded). Prefer :meth:`search_ann` / :meth:`search_exact`."""
        rows = self.search_ann(queries, k)
        width = min((len(lab) for lab, _ in rows), default=0)
        scores = np.stack([s[:width] for _, s in rows]) if rows else np.zeros((0, 0), np.float32)
        labels = np.stack([lab[:width] for lab, _ in rows]) if rows else np.zeros((0, 0), np.int64)
        return scores.astype(np.float32, copy=False), labels.astype(np.int64, copy=False)

    # -- persistence ---------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """Write the faiss index to ``path`` atomically and durably
        (:func:`heedrank.files.write_atomic`: a temporary file, fsynced, renamed, directory
        fsynced). Tombstones are not written: the owner re-derives them (see
        :class:`heedrank.index.store.Index`).

        Raises:
            OSError: the file could not be written (``path`` is unchanged).
        """
        def write(tmp: Path) -> None:
            with self._lock.read():
                self.faiss.write_index(self.index, str(tmp))

        write_atomic(path, write)

    @classmethod
    def load(cls, path: str | Path, params: DenseParams | None = None) -> DenseIndex:
        """Read a faiss index file written by :meth:`save`. Raises NotFoundError when
        missing, unreadable or of an unsupported type."""
        path = Path(path)
        if not path.is_file():
            raise NotFoundError(f"vector index not found: {path}")
        faiss = require("faiss", "index")
        try:
            index = faiss.read_index(str(path))
        except RuntimeError as exc:
            raise NotFoundError(f"vector index {path} is unreadable ({exc})") from exc
        if isinstance(index, faiss.IndexIVF) and index.direct_map.type != faiss.DirectMap.Hashtable:
            index.set_direct_map_type(faiss.DirectMap.Hashtable)
        out = cls(index.d, params, index=index)
        if params is not None:  # search-time defaults come from the saved params
            if out.kind == "hnsw":
                inner_index(faiss, out.index, out.kind).hnsw.efSearch = params.ef_search
                out.params = replace(out.params, ef_search=params.ef_search)
            if out.kind == "ivf":
                out.index.nprobe = params.nprobe
                out.params = replace(out.params, nprobe=params.nprobe)
        return out

    def memory_bytes(self) -> int:
        """Approximate in-memory size: vectors, graph links / inverted lists, labels."""
        n, d = len(self), self.dim
        size: float = n * d * (1 if self.params.ivf_storage == "sq8" else 4) + n * 8
        if self.kind == "hnsw":
            size += n * self.params.hnsw_m * 2 * 4 * 1.05 + n * 8
        if self.kind == "ivf":
            size += int(self.index.nlist) * d * 4 + n * 16
        return int(size)

    def describe(self) -> dict[str, Any]:
        faiss_type = {"flat": INDEX_TYPE, "hnsw": "IndexIDMap2(IndexHNSWFlat)", "ivf": "IndexIVFFlat"}[self.kind]
        if self.params.ivf_storage == "sq8":
            faiss_type = "IndexIVFScalarQuantizer(QT_8bit)"
        return {
            "index_type": faiss_type,
            "kind": self.kind,
            "params": self.params.to_dict(),
            "dim": self.dim,
            "ntotal": len(self),
            "tombstones": len(self._tombstones),
            "metric": "inner_product",
        }

    def __repr__(self) -> str:
        return f"DenseIndex({self.kind}, {len(self)} vectors, dim {self.dim})"

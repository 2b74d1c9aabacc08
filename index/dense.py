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
           (``nprobe``), direct map for reconstruction
=========  ===================================================  ===========================

With L2-normalised vectors the score is the cosine similarity in ``[-1, 1]``.

Two searches (the planner in :mod:`heedrank.index.planner` picks one):

* :meth:`DenseIndex.search_exact`: brute force over the allowed labels only (faiss
  ``IDSelectorArray`` on the flat storage: ``O(m d)`` for ``m`` allowed vectors). Exact
  for every index type.
* :meth:`DenseIndex.search_ann`: the index's own search with an ``IDSelector`` passed
  through faiss ``SearchParameters`` (bitmap over positions for flat/HNSW, over labels
  for IVF), with ``efSearch`` / ``nprobe`` per call. Under a selective filter HNSW and IVF
  may return fewer than ``k`` hits: the selector only drops non-matching vectors from the
  results, it does not widen the search.

faiss pads short results with label ``-1`` and score ``-inf``; both searches strip the
padding, so ``-1`` never leaves this module. ``faiss`` is imported when an index is
created or loaded.

:class:`DenseParams` and the construction of each faiss type live in
:mod:`heedrank.index.dense_build` (re-exported here).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np

from heedrank.errors import NotFoundError, ValidationError, require
from heedrank.files import write_atomic
from heedrank.index.dense_build import (
    INDEX_TYPE,
    INDEX_TYPES,
    DenseParams,
    auto_nlist,
    create_index,
    params_of,
    train_ivf,
)
from heedrank.index.rwlock import RWLock

__all__ = ["INDEX_TYPE", "INDEX_TYPES", "VECTORS_FILE", "DenseIndex", "DenseParams", "auto_nlist", "strip_padding"]

logger = logging.getLogger(__name__)

VECTORS_FILE = "vectors.faiss"
_BITMAP_MAX_BITS = 1 << 28  # label bitmaps above this size fall back to IDSelectorBatch


def _as_matrix(x: np.ndarray, dim: int, what: str) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2 or x.shape[1] != dim:
        raise ValidationError(f"{what} must have shape (n, {dim}), got {x.shape}")
    return np.ascontiguousarray(x, dtype=np.float32)


def _as_labels(ids: Any) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(ids, dtype=np.int64).reshape(-1))


def strip_padding(scores: np.ndarray, labels: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per row ``(labels int64 (r,), scores float32 (r,))`` without faiss's ``-1`` padding."""
    out = []
    for s, lab in zip(scores, labels):
        keep = lab >= 0
        out.append((lab[keep].astype(np.int64, copy=True), s[keep].astype(np.float32, copy=True)))
    return out


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
        self._tombstones: set[int] = set()
        self._tomb_mask: np.ndarray | None = None  # positions of tombstoned vectors (HNSW)
        self._ivf_labels = self._read_ivf_labels() if params.index_type == "ivf" else None
        labels = self.labels()
        if len(labels) > 1 and not (np.diff(labels) > 0).all():
            raise NotFoundError("vector index labels are not strictly increasing; rebuild the index")

    # -- construction (faiss types: heedrank.index.dense_build) ---------------------------
    @classmethod
    def build(
        cls, vectors: np.ndarray, labels: np.ndarray, params: DenseParams | None = None, *, dim: int | None = None
    ) -> DenseIndex:
        """Create an index of ``params.index_type`` over ``vectors`` (IVF: trained on them).

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
        x = _as_matrix(vectors, d, "vectors")
        params = (params or DenseParams()).for_size(len(x))
        if params.index_type != "ivf":
            out = cls(d, params)
            out.add(x, labels)
            return out
        ivf, params = train_ivf(require("faiss", "index"), x, params)
        out = cls(d, params, index=ivf)
        out.add(x, labels)
        return out

    # -- parts ---------------------------------------------------------------------------
    @property
    def kind(self) -> str:
        """``"flat"``, ``"hnsw"`` or ``"ivf"``."""
        return self.params.index_type

    def _inner(self) -> Any:
        return self.faiss.downcast_index(self.index.index) if self.kind != "ivf" else self.index

    def _storage(self) -> np.ndarray:
        """Zero-copy float32 ``(ntotal, d)`` view of the stored vectors (flat/HNSW), by position."""
        inner = self._inner()
        flat = inner if self.kind == "flat" else self.faiss.downcast_index(inner.storage)
        n = int(flat.ntotal)
        if n == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        return self.faiss.rev_swig_ptr(flat.get_xb(), n * self.dim).reshape(n, self.dim)

    def _read_ivf_labels(self) -> np.ndarray:
        invl = self.index.invlists
        parts = []
        for lst in range(self.index.nlist):
            size = invl.list_size(lst)
            if size:
                ptr = invl.get_ids(lst)
                parts.append(self.faiss.rev_swig_ptr(ptr, size).copy())
                invl.release_ids(lst, ptr)
        return np.sort(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)

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
        return frozenset(self._tombstones)

    def positions(self, labels: np.ndarray) -> np.ndarray:
        """Positions of stored ``labels`` in :meth:`labels` order; absent labels are dropped."""
        stored = self.labels()
        labels = _as_labels(labels)
        pos = np.searchsorted(stored, labels)
        ok = pos < len(stored)
        ok[ok] = stored[pos[ok]] == labels[ok]
        return pos[ok]

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
        x = _as_matrix(vectors, self.dim, "vectors")
        labels = _as_labels(ids)
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
            if self._tomb_mask is not None:
                self._tomb_mask = np.concatenate([self._tomb_mask, np.zeros(len(labels), dtype=bool)])

    def delete(self, ids: np.ndarray) -> int:
        """Delete vectors by label: in place for flat and IVF, as tombstones for HNSW
        (excluded from every search until :meth:`rebuilt`). Unknown labels are ignored.

        Returns:
            Number of stored vectors deleted or tombstoned.
        """
        labels = np.unique(_as_labels(ids))
        with self._lock.write():
            present = self.labels()
            labels = labels[np.isin(labels, present)]
            if not len(labels):
                return 0
            if self.kind == "hnsw":
                new = [int(v) for v in labels if int(v) not in self._tombstones]
                self._tombstones.update(new)
                mask = self._tomb_mask if self._tomb_mask is not None else np.zeros(len(self), dtype=bool)
                mask[self.positions(np.asarray(new, dtype=np.int64))] = True
                self._tomb_mask = mask
                return len(new)
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
            live = self.labels().copy()
            if self._tombstones:
                live = live[~np.isin(live, np.fromiter(self._tombstones, dtype=np.int64))]
            vectors = self.vectors(live)
        if params.index_type == "ivf" and len(vectors) < (params.nlist or 1):
            from dataclasses import replace

            params = replace(params, nlist=auto_nlist(len(vectors)))
        return DenseIndex.build(vectors, live, params, dim=self.dim)

    # -- reading -------------------------------------------------------------------------
    def vectors(self, labels: np.ndarray) -> np.ndarray:
        """float32 ``(m, d)`` stored vectors of ``labels`` (all present). Raises NotFoundError."""
        labels = _as_labels(labels)
        if self.kind == "ivf":
            try:
                return np.asarray(self.index.reconstruct_batch(labels), dtype=np.float32).reshape(len(labels), self.dim)
            except RuntimeError as exc:
                raise NotFoundError(f"a vector id is not in the index ({exc})") from None
        pos = self.positions(labels)
        if len(pos) != len(labels):
            raise NotFoundError("a vector id is not in the index")
        return self._storage()[pos]

    def reconstruct(self, vid: int) -> np.ndarray:
        """The stored float32 ``(dim,)`` vector of label ``vid``. Raises NotFoundError."""
        return self.vectors(np.array([vid]))[0]

    def _bitmap_selector(self, members: np.ndarray, size: int) -> tuple[Any, np.ndarray]:
        """``IDSelectorBitmap`` whose members are the ids ``members`` (all ``< size``)."""
        bits = np.zeros(size, dtype=bool)
        bits[members] = True
        packed = np.packbits(bits, bitorder="little")
        # faiss: id i is a member iff i // 8 < n (bytes) and bit i % 8 of byte i // 8 is set
        return self.faiss.IDSelectorBitmap(len(packed), self.faiss.swig_ptr(packed)), packed

    def _label_selector(self, allowed: np.ndarray) -> tuple[Any, Any]:
        """Selector over labels: the ``allowed`` ones minus tombstones (a bitmap when it is
        small enough, else a hash set). Built in ``O(len(allowed))``, no position lookups."""
        allowed = _as_labels(allowed)
        if self._tombstones:
            allowed = allowed[~np.isin(allowed, self._tomb_labels())]
        top = int(allowed.max()) + 1 if len(allowed) else 1
        if top <= _BITMAP_MAX_BITS:
            return self._bitmap_selector(allowed, top)
        return self.faiss.IDSelectorBatch(allowed), allowed

    def _tomb_labels(self) -> np.ndarray:
        return np.fromiter(self._tombstones, dtype=np.int64, count=len(self._tombstones))

    def _position_selector(self, allowed: np.ndarray | None) -> tuple[Any, list[Any]]:
        """Selector over flat/HNSW storage positions for ``allowed`` labels (``None`` = all
        live): ``None`` when nothing is excluded, else a translated label bitmap (through
        the id map) or, without a filter, a bitmap of live positions."""
        if allowed is None:
            if self._tomb_mask is None:
                return None, []
            sel, buf = self._bitmap_selector(np.flatnonzero(~self._tomb_mask), len(self))
            return sel, [buf]
        label_sel, buf = self._label_selector(allowed)
        sel = self.faiss.IDSelectorTranslated(self.index.id_map, label_sel)
        return sel, [label_sel, buf]

    def _flat_storage(self) -> Any:
        """The ``IndexFlat`` holding the vectors by position (flat: the index; HNSW: its storage)."""
        inner = self._inner()
        return inner if self.kind == "flat" else self.faiss.downcast_index(inner.storage)

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
        q = _as_matrix(queries, self.dim, "queries")
        k = int(k)
        faiss = self.faiss
        with self._lock.read():
            if self.kind == "ivf":
                return self._exact_ivf(q, k, allowed)
            keep: list[Any] = []
            params = None
            if allowed is not None and len(allowed) <= len(self) // 8:
                pos = self.positions(allowed)  # few: faiss computes only these products
                if self._tomb_mask is not None:
                    pos = pos[~self._tomb_mask[pos]]
                n_allowed = len(pos)
                if n_allowed:
                    sel = faiss.IDSelectorArray(pos)
                    keep += [sel, pos]
                    params = faiss.SearchParameters(sel=sel)
            elif allowed is not None:  # many: scan, skipping what the label bitmap excludes
                n_allowed = len(allowed)  # an upper bound: absent labels only leave padding, stripped below
                sel, bufs = self._position_selector(allowed)
                keep += [sel, *bufs]
                params = faiss.SearchParameters(sel=sel)
            else:
                n_allowed = self.num_live
                sel, bufs = self._position_selector(None)
                keep += [sel, *bufs]
                params = faiss.SearchParameters(sel=sel) if sel is not None else None
            kk = min(k, n_allowed)
            if kk <= 0 or not len(q):
                return [(np.zeros(0, np.int64), np.zeros(0, np.float32)) for _ in range(len(q))]
            scores, pos_out = self._flat_storage().search(q, kk, params=params)
            labels = self.labels()
            return strip_padding(scores, np.where(pos_out >= 0, labels[np.maximum(pos_out, 0)], -1))

    def _exact_ivf(self, q: np.ndarray, k: int, allowed: np.ndarray | None) -> list[tuple[np.ndarray, np.ndarray]]:
        stored = self.labels()  # the IVF labels (this path runs for IVF only)
        if allowed is not None:
            allowed = _as_labels(allowed)
            allowed = allowed[np.isin(allowed, stored)]
        n_allowed = len(stored) if allowed is None else len(allowed)
        kk = min(k, n_allowed)
        if kk <= 0 or not len(q):
            return [(np.zeros(0, np.int64), np.zeros(0, np.float32)) for _ in range(len(q))]
        faiss = self.faiss
        if allowed is not None and n_allowed <= max(4096, len(stored) // 16):
            x = self.vectors(allowed)  # gather through the direct map: O(m d)
            scores, idx = faiss.knn(q, x, kk, metric=faiss.METRIC_INNER_PRODUCT)
            return strip_padding(scores, np.where(idx >= 0, allowed[np.maximum(idx, 0)], -1))
        # every cell visited: exact for IVFFlat
        keep: list[Any] = []
        if allowed is not None:
            sel, buf = self._label_selector(allowed)
            keep += [sel, buf]
            params = faiss.SearchParametersIVF(sel=sel, nprobe=int(self.index.nlist))
        else:
            params = faiss.SearchParametersIVF(nprobe=int(self.index.nlist))
        scores, labels = self.index.search(q, kk, params=params)
        return strip_padding(scores, labels)

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
        q = _as_matrix(queries, self.dim, "queries")
        faiss = self.faiss
        with self._lock.read():
            kk = min(int(k), len(self))
            if kk <= 0 or not len(q):
                return [(np.zeros(0, np.int64), np.zeros(0, np.float32)) for _ in range(len(q))]
            keep: list[Any] = []
            if self.kind == "hnsw":
                ef = max(int(ef_search or self.params.ef_search), kk)
                sel, bufs = self._position_selector(None if allowed is None else _as_labels(allowed))
                keep += [sel, *bufs]
                params = faiss.SearchParametersHNSW(sel=sel, efSearch=ef) if sel is not None else \
                    faiss.SearchParametersHNSW(efSearch=ef)
                scores, pos = self._inner().search(q, kk, params=params)
                labels = self.labels()
                return strip_padding(scores, np.where(pos >= 0, labels[np.maximum(pos, 0)], -1))
            probe = min(int(nprobe or self.params.nprobe), int(self.index.nlist))
            if allowed is None:
                params = faiss.SearchParametersIVF(nprobe=probe)
            else:
                sel, buf = self._label_selector(_as_labels(allowed))
                keep += [sel, buf]
                params = faiss.SearchParametersIVF(sel=sel, nprobe=probe)
            scores, labels = self.index.search(q, kk, params=params)
            return strip_padding(scores, labels)

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
        if isinstance(index, faiss.IndexIVFFlat) and index.direct_map.type != faiss.DirectMap.Hashtable:
            index.set_direct_map_type(faiss.DirectMap.Hashtable)
        out = cls(index.d, params, index=index)
        if params is not None:  # search-time defaults come from the saved params
            from dataclasses import replace

            if out.kind == "hnsw":
                out._inner().hnsw.efSearch = params.ef_search
                out.params = replace(out.params, ef_search=params.ef_search)
            if out.kind == "ivf":
                out.index.nprobe = params.nprobe
                out.params = replace(out.params, nprobe=params.nprobe)
        return out

    def memory_bytes(self) -> int:
        """Approximate in-memory size: vectors, graph links / inverted lists, labels."""
        n, d = len(self), self.dim
        size: float = n * d * 4 + n * 8
        if self.kind == "hnsw":
            size += n * self.params.hnsw_m * 2 * 4 * 1.05 + n * 8
        if self.kind == "ivf":
            size += int(self.index.nlist) * d * 4 + n * 16
        return int(size)

    def describe(self) -> dict[str, Any]:
        faiss_type = {"flat": INDEX_TYPE, "hnsw": "IndexIDMap2(IndexHNSWFlat)", "ivf": "IndexIVFFlat"}[self.kind]
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

"""How a :class:`heedrank.index.dense.DenseIndex` reads and searches its faiss index: the
label arrays, the stored vectors, the tombstones of deleted HNSW vectors, the faiss
``IDSelector`` objects that restrict a search, and the exact and ANN searches themselves.

* :class:`Tombstones`: labels deleted from an HNSW graph but still stored (faiss's HNSW has
  no ``remove_ids``), by label and by storage position, until the index is rebuilt.
* :class:`FaissSearch`: exact and ANN top-``k`` over one snapshot of an index's labels and
  tombstones (see the module docstring of :mod:`heedrank.index.dense` for the two searches).
* Functions shared by both and by :class:`~heedrank.index.dense.DenseIndex`: input checks
  (:func:`as_matrix`, :func:`as_labels`), label lookups (:func:`positions_of`,
  :func:`ivf_labels`), stored vectors (:func:`stored_vectors`, :func:`ivf_vectors`) and the
  removal of faiss's ``-1`` padding (:func:`strip_padding`).

Nothing here takes a lock: the :class:`~heedrank.index.dense.DenseIndex` calls these under its
own readers-writer lock. ``faiss`` is passed in, never imported here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from heedrank.errors import NotFoundError, ValidationError

if TYPE_CHECKING:
    from heedrank.index.dense_build import DenseParams

BITMAP_MAX_BITS = 1 << 28
"""Label bitmaps above this many bits fall back to ``IDSelectorBatch`` (a hash set)."""

Hits = list[tuple[np.ndarray, np.ndarray]]
"""Per query ``(labels int64 (r,), scores float32 (r,))``, sorted by descending score."""


def as_matrix(x: np.ndarray, dim: int, what: str) -> np.ndarray:
    """``x`` as a C-contiguous float32 ``(n, dim)`` array (a ``(dim,)`` vector becomes ``(1, dim)``).

    Raises:
        ValidationError: another shape (the message names ``what``).
    """
    x = np.asarray(x)
    if x.ndim == 1:
        x = x[None, :]
    if x.ndim != 2 or x.shape[1] != dim:
        raise ValidationError(f"{what} must have shape (n, {dim}), got {x.shape}")
    return np.ascontiguousarray(x, dtype=np.float32)


def as_labels(ids: Any) -> np.ndarray:
    """``ids`` as a C-contiguous int64 ``(n,)`` array."""
    return np.ascontiguousarray(np.asarray(ids, dtype=np.int64).reshape(-1))


def positions_of(stored: np.ndarray, labels: Any) -> np.ndarray:
    """int64 positions in ``stored`` (sorted int64 labels) of ``labels``; absent ones are dropped."""
    labels = as_labels(labels)
    pos = np.searchsorted(stored, labels)
    ok = pos < len(stored)
    ok[ok] = stored[pos[ok]] == labels[ok]
    return pos[ok]


def strip_padding(scores: np.ndarray, labels: np.ndarray) -> Hits:
    """Per row ``(labels int64 (r,), scores float32 (r,))`` without faiss's ``-1`` padding."""
    out = []
    for s, lab in zip(scores, labels):
        keep = lab >= 0
        out.append((lab[keep].astype(np.int64, copy=True), s[keep].astype(np.float32, copy=True)))
    return out


def _no_hits(n: int) -> Hits:
    return [(np.zeros(0, np.int64), np.zeros(0, np.float32)) for _ in range(n)]


def _hits_at(scores: np.ndarray, pos: np.ndarray, labels: np.ndarray) -> Hits:
    """:func:`strip_padding` of a search over storage positions ``pos`` (``-1``: padding)."""
    return strip_padding(scores, np.where(pos >= 0, labels[np.maximum(pos, 0)], -1))


def inner_index(faiss: Any, index: Any, kind: str) -> Any:
    """The faiss index under the ``IndexIDMap2`` (flat, HNSW); the IVF index itself for IVF."""
    return faiss.downcast_index(index.index) if kind != "ivf" else index


def flat_storage(faiss: Any, index: Any, kind: str) -> Any:
    """The ``IndexFlat`` holding the vectors by position (flat: the index; HNSW: its storage)."""
    inner = inner_index(faiss, index, kind)
    return inner if kind == "flat" else faiss.downcast_index(inner.storage)


def stored_vectors(faiss: Any, index: Any, kind: str, dim: int) -> np.ndarray:
    """Zero-copy float32 ``(ntotal, dim)`` view of the stored vectors (flat/HNSW), by position."""
    flat = flat_storage(faiss, index, kind)
    n = int(flat.ntotal)
    if n == 0:
        return np.zeros((0, dim), dtype=np.float32)
    return faiss.rev_swig_ptr(flat.get_xb(), n * dim).reshape(n, dim)


def ivf_labels(faiss: Any, index: Any) -> np.ndarray:
    """Sorted int64 labels of every vector in the inverted lists of an IVF index."""
    invl = index.invlists
    parts = []
    for lst in range(index.nlist):
        size = invl.list_size(lst)
        if size:
            ptr = invl.get_ids(lst)
            parts.append(faiss.rev_swig_ptr(ptr, size).copy())
            invl.release_ids(lst, ptr)
    return np.sort(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)


def ivf_vectors(index: Any, labels: np.ndarray, dim: int) -> np.ndarray:
    """float32 ``(m, dim)`` vectors of ``labels`` (int64) from an IVF index (through its direct
    map; ``sq8``: the decoded vectors). Raises NotFoundError for a label not in the index."""
    try:
        return np.asarray(index.reconstruct_batch(labels), dtype=np.float32).reshape(len(labels), dim)
    except RuntimeError as exc:
        raise NotFoundError(f"a vector id is not in the index ({exc})") from None


class Tombstones:
    """Labels deleted from an HNSW graph but still stored, until the index is rebuilt
    (:meth:`heedrank.index.dense.DenseIndex.rebuilt`); empty for flat and IVF indexes, which
    delete in place. Kept by label and as a mask over storage positions."""

    def __init__(self) -> None:
        self._labels: set[int] = set()
        self.mask: np.ndarray | None = None
        """bool ``(ntotal,)``, true at tombstoned storage positions; ``None`` before the first delete."""

    def __len__(self) -> int:
        return len(self._labels)

    def labels(self) -> frozenset[int]:
        """The tombstoned labels."""
        return frozenset(self._labels)

    def add(self, labels: np.ndarray, stored: np.ndarray) -> int:
        """Tombstone ``labels`` (int64, all in ``stored``, the sorted labels by position).
        Returns how many were not tombstoned already."""
        new = [int(v) for v in labels if int(v) not in self._labels]
        self._labels.update(new)
        mask = self.mask if self.mask is not None else np.zeros(len(stored), dtype=bool)
        mask[positions_of(stored, np.asarray(new, dtype=np.int64))] = True
        self.mask = mask
        return len(new)

    def grow(self, n: int) -> None:
        """Extend the position mask by ``n`` positions of vectors just added (not tombstoned)."""
        if self.mask is not None:
            self.mask = np.concatenate([self.mask, np.zeros(n, dtype=bool)])

    def drop(self, labels: np.ndarray) -> np.ndarray:
        """``labels`` (int64) without the tombstoned ones (``labels`` itself when there are none)."""
        if not self._labels:
            return labels
        return labels[~np.isin(labels, np.fromiter(self._labels, dtype=np.int64, count=len(self._labels)))]


class FaissSearch:
    """Exact and ANN top-``k`` of one faiss index, over its labels and tombstones as they are
    when it is made: make one per search, under the owning
    :class:`~heedrank.index.dense.DenseIndex`'s read lock.

    Args:
        faiss: The ``faiss`` module.
        index: The faiss index: ``IndexIDMap2`` over flat or HNSW storage, or an IVF index.
        params: Its :class:`heedrank.index.dense_build.DenseParams` (type, ``ef_search``, ``nprobe``).
        labels: Sorted int64 labels of every stored vector; position ``i`` of flat/HNSW
            storage holds ``labels[i]``.
        tombstones: The index's :class:`Tombstones` (HNSW; empty otherwise).
    """

    def __init__(self, faiss: Any, index: Any, params: DenseParams, labels: np.ndarray, tombstones: Tombstones) -> None:
        self.faiss = faiss
        self.index = index
        self.params = params
        self.kind = params.index_type
        self.labels = labels
        self.tombstones = tombstones
        self.size = int(index.ntotal)

    def exact(self, q: np.ndarray, k: int, allowed: np.ndarray | None) -> Hits:
        """See :meth:`heedrank.index.dense.DenseIndex.search_exact`; ``q`` float32 ``(n, dim)``."""
        if self.kind == "ivf":
            return self._exact_ivf(q, k, allowed)
        faiss = self.faiss
        keep: list[Any] = []  # selectors and their buffers, alive until the search returns
        params = None
        if allowed is not None and len(allowed) <= self.size // 8:
            pos = positions_of(self.labels, allowed)  # few: faiss computes only these products
            if self.tombstones.mask is not None:
                pos = pos[~self.tombstones.mask[pos]]
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
            n_allowed = self.size - len(self.tombstones)
            sel, bufs = self._position_selector(None)
            keep += [sel, *bufs]
            params = faiss.SearchParameters(sel=sel) if sel is not None else None
        kk = min(k, n_allowed)
        if kk <= 0 or not len(q):
            return _no_hits(len(q))
        scores, pos_out = flat_storage(faiss, self.index, self.kind).search(q, kk, params=params)
        return _hits_at(scores, pos_out, self.labels)

    def _exact_ivf(self, q: np.ndarray, k: int, allowed: np.ndarray | None) -> Hits:
        stored = self.labels
        if allowed is not None:
            allowed = as_labels(allowed)
            allowed = allowed[np.isin(allowed, stored)]
        n_allowed = len(stored) if allowed is None else len(allowed)
        kk = min(k, n_allowed)
        if kk <= 0 or not len(q):
            return _no_hits(len(q))
        faiss = self.faiss
        if allowed is not None and n_allowed <= max(4096, len(stored) // 16):
            x = ivf_vectors(self.index, allowed, self.index.d)  # gather through the direct map: O(m d)
            scores, idx = faiss.knn(q, x, kk, metric=faiss.METRIC_INNER_PRODUCT)
            return strip_padding(scores, np.where(idx >= 0, allowed[np.maximum(idx, 0)], -1))
        # every cell visited: exact for float32 storage, over the decoded vectors for sq8
        keep: list[Any] = []
        if allowed is not None:
            sel, buf = self._label_selector(allowed)
            keep += [sel, buf]
            params = faiss.SearchParametersIVF(sel=sel, nprobe=int(self.index.nlist))
        else:
            params = faiss.SearchParametersIVF(nprobe=int(self.index.nlist))
        scores, labels = self.index.search(q, kk, params=params)
        return strip_padding(scores, labels)

    def ann(self, q: np.ndarray, k: int, allowed: np.ndarray | None, ef_search: int | None, nprobe: int | None) -> Hits:
        """See :meth:`heedrank.index.dense.DenseIndex.search_ann` (HNSW and IVF; ``q`` float32 ``(n, dim)``)."""
        faiss = self.faiss
        kk = min(k, self.size)
        if kk <= 0 or not len(q):
            return _no_hits(len(q))
        keep: list[Any] = []
        if self.kind == "hnsw":
            ef = max(int(ef_search or self.params.ef_search), kk)
            sel, bufs = self._position_selector(None if allowed is None else as_labels(allowed))
            keep += [sel, *bufs]
            params = faiss.SearchParametersHNSW(sel=sel, efSearch=ef) if sel is not None else \
                faiss.SearchParametersHNSW(efSearch=ef)
            scores, pos = inner_index(faiss, self.index, self.kind).search(q, kk, params=params)
            return _hits_at(scores, pos, self.labels)
        probe = min(int(nprobe or self.params.nprobe), int(self.index.nlist))
        if allowed is None:
            params = faiss.SearchParametersIVF(nprobe=probe)
        else:
            sel, buf = self._label_selector(as_labels(allowed))
            keep += [sel, buf]
            params = faiss.SearchParametersIVF(sel=sel, nprobe=probe)
        scores, labels = self.index.search(q, kk, params=params)
        return strip_padding(scores, labels)

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
        allowed = self.tombstones.drop(as_labels(allowed))
        top = int(allowed.max()) + 1 if len(allowed) else 1
        if top <= BITMAP_MAX_BITS:
            return self._bitmap_selector(allowed, top)
        return self.faiss.IDSelectorBatch(allowed), allowed

    def _position_selector(self, allowed: np.ndarray | None) -> tuple[Any, list[Any]]:
        """Selector over flat/HNSW storage positions for ``allowed`` labels (``None`` = all
        live): ``None`` when nothing is excluded, else a translated label bitmap (through
        the id map) or, without a filter, a bitmap of live positions."""
        if allowed is None:
            if self.tombstones.mask is None:
                return None, []
            sel, buf = self._bitmap_selector(np.flatnonzero(~self.tombstones.mask), self.size)
            return sel, [buf]
        label_sel, buf = self._label_selector(allowed)
        sel = self.faiss.IDSelectorTranslated(self.index.id_map, label_sel)
        return sel, [label_sel, buf]

"""Which faiss index a :class:`heedrank.index.dense.DenseIndex` holds: its parameters
(:class:`DenseParams`), creating the empty flat / HNSW index, training an IVF index on its
vectors, and reading the parameters back from a loaded faiss index.

Re-exported by :mod:`heedrank.index.dense`, where the types are described. ``faiss`` is
passed in by the caller (imported when an index is created or loaded).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from heedrank.errors import NotFoundError, ValidationError
from heedrank.textrules import is_int

INDEX_TYPES = ("flat", "hnsw", "ivf")
AUTO = "auto"
"""``index_type`` resolved by the number of vectors at build (:meth:`DenseParams.for_size`)."""
FLAT_MAX = 100_000
"""Largest ``auto`` index kept exact (flat): 100k x 384 float32 inner products per query take a few
ms on 2 cores; above it ``auto`` builds IVF (trained in seconds, unlike HNSW's graph)."""
IVF_STORAGES = ("float32", "sq8")
"""How an IVF index stores its vectors: ``float32`` (``IndexIVFFlat``, 4 bytes a dimension) or
``sq8`` (``IndexIVFScalarQuantizer`` with faiss's ``QT_8bit``: one byte a dimension, each
dimension's range learnt at training; 4x less disk and RAM, scores from the decoded vectors)."""
SQ8_MIN = 1_000_000
"""``auto`` stores an IVF index of more than this many vectors as ``sq8``: at 384 dimensions
float32 vectors take 1.5 GB a million (``docs/results/scale.md``)."""
TRAIN_POINTS_PER_CELL = 256
"""Training vectors per IVF cell that :func:`training_sample` keeps: faiss's k-means default
(``ClusteringParameters.max_points_per_centroid``), past which faiss itself subsamples."""
INDEX_TYPE = "IndexIDMap2(IndexFlatIP)"
"""faiss class of the default (flat) index, as recorded in version-1 index directories."""


@dataclass(frozen=True)
class DenseParams:
    """Which vector index to build, and its default search parameters (saved with the index).

    Attributes:
        index_type: ``"flat"`` (exact), ``"hnsw"`` or ``"ivf"``; ``"auto"`` until built
            (:meth:`for_size`: flat up to :data:`FLAT_MAX` vectors, else IVF).
        hnsw_m: HNSW graph degree ``M`` (links per node; memory ~ ``2 * M * 4`` bytes/vector).
        ef_construction: HNSW candidate list size while building.
        ef_search: HNSW candidate list size while searching (default per query).
        nlist: IVF cells; ``None`` = ``round(sqrt(n))`` at build (at most ``n / 39``).
        nprobe: IVF cells visited per query (default).
        ivf_storage: how IVF stores its vectors: ``"float32"`` or ``"sq8"`` (:data:`IVF_STORAGES`);
            ``"auto"`` until built (:meth:`for_size`: ``sq8`` above :data:`SQ8_MIN` vectors).
            Flat and HNSW indexes store float32.
    """

    index_type: str = "flat"
    hnsw_m: int = 32
    ef_construction: int = 100
    ef_search: int = 128
    nlist: int | None = None
    nprobe: int = 32
    ivf_storage: str = AUTO

    def __post_init__(self) -> None:
        if self.index_type not in INDEX_TYPES + (AUTO,):
            raise ValidationError(f"unknown index type {self.index_type!r}; choose one of {list(INDEX_TYPES + (AUTO,))}")
        if self.ivf_storage not in IVF_STORAGES + (AUTO,):
            raise ValidationError(f"unknown IVF storage {self.ivf_storage!r}; choose one of {list(IVF_STORAGES + (AUTO,))}")
        if self.ivf_storage == "sq8" and self.index_type not in ("ivf", AUTO):
            raise ValidationError(f"ivf_storage 'sq8' needs an IVF index, not {self.index_type!r}: pass index_type 'ivf' or 'auto'")
        for name in ("hnsw_m", "ef_construction", "ef_search", "nprobe"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise ValidationError(f"{name} must be a positive integer, got {value!r}")
        if self.nlist is not None and (isinstance(self.nlist, bool) or not isinstance(self.nlist, int) or self.nlist < 1):
            raise ValidationError(f"nlist must be a positive integer or None, got {self.nlist!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def for_size(self, n: int) -> DenseParams:
        """These parameters with ``"auto"`` resolved for ``n`` vectors: flat up to
        :data:`FLAT_MAX`, else IVF with ``nlist`` :func:`auto_nlist` ``(n)`` and ``nprobe`` at least
        ``nlist / 16`` (about 6% of the cells per query); other types unchanged. An ``auto``
        ``ivf_storage`` becomes ``sq8`` for an IVF index over more than :data:`SQ8_MIN` vectors,
        else ``float32``."""
        params = self
        if self.index_type == AUTO:
            if n <= FLAT_MAX:
                params = replace(self, index_type="flat")
            else:
                nlist = self.nlist or auto_nlist(n)
                params = replace(self, index_type="ivf", nlist=nlist, nprobe=max(self.nprobe, nlist // 16))
        if params.ivf_storage == AUTO:
            params = replace(params, ivf_storage="sq8" if params.index_type == "ivf" and n > SQ8_MIN else "float32")
        return params

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DenseParams:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})


def auto_nlist(n: int) -> int:
    """IVF cells for ``n`` vectors: ``round(sqrt(n))``, at most ``n // 39`` (faiss wants
    39 training points per cell), at least 1."""
    return max(1, min(int(round(math.sqrt(max(n, 1)))), n // 39))


def create_index(faiss: Any, dim: int, params: DenseParams) -> Any:
    """An empty faiss index of ``params.index_type`` (``flat`` or ``hnsw``, wrapped in
    ``IndexIDMap2``) for ``dim``-dimensional vectors.

    Raises:
        ValidationError: ``ivf``, which must be trained first (:func:`train_ivf`).
    """
    if params.index_type in ("flat", AUTO):  # an empty index: auto is flat until rebuilt with vectors
        return faiss.IndexIDMap2(faiss.IndexFlatIP(dim))
    if params.index_type == "hnsw":
        hnsw = faiss.IndexHNSWFlat(dim, params.hnsw_m, faiss.METRIC_INNER_PRODUCT)
        hnsw.hnsw.efConstruction = params.ef_construction
        hnsw.hnsw.efSearch = params.ef_search
        return faiss.IndexIDMap2(hnsw)
    raise ValidationError("an IVF index must be trained on vectors: use DenseIndex.build(vectors, labels, params)")


def params_of(faiss: Any, index: Any, given: DenseParams | None) -> DenseParams:
    """The :class:`DenseParams` of a faiss ``index``: its type and build parameters read from
    it, the other fields from ``given`` (defaults when ``None``).

    Raises:
        NotFoundError: a faiss index type this module does not write.
    """
    inner = faiss.downcast_index(index.index) if isinstance(index, faiss.IndexIDMap2) else index
    base = asdict(given) if given is not None else {}
    if isinstance(inner, faiss.IndexHNSWFlat):
        base.update(index_type="hnsw", ivf_storage="float32", hnsw_m=int(inner.hnsw.nb_neighbors(1)),
                    ef_construction=int(inner.hnsw.efConstruction), ef_search=int(inner.hnsw.efSearch))
        return DenseParams.from_dict(base)
    if isinstance(inner, (faiss.IndexIVFFlat, faiss.IndexIVFScalarQuantizer)):
        storage = "sq8" if isinstance(inner, faiss.IndexIVFScalarQuantizer) else "float32"
        base.update(index_type="ivf", nlist=int(inner.nlist), nprobe=int(inner.nprobe), ivf_storage=storage)
        return DenseParams.from_dict(base)
    if isinstance(inner, faiss.IndexFlat) and isinstance(index, faiss.IndexIDMap2):
        base.update(index_type="flat", ivf_storage="float32")
        return DenseParams.from_dict(base)
    raise NotFoundError(f"unsupported faiss index {type(inner).__name__}; rebuild the index")


def train_ivf(faiss: Any, x: np.ndarray, params: DenseParams) -> tuple[Any, DenseParams]:
    """An empty IVF index (inner product, seed 1234, hash-table direct map for reconstruction)
    trained on ``x`` (float32 ``(n, d)``), and ``params`` with its ``nlist`` (``params.nlist``,
    else :func:`auto_nlist`) and storage resolved. ``ivf_storage`` ``float32``: ``IndexIVFFlat``;
    ``sq8``: ``IndexIVFScalarQuantizer`` (``QT_8bit``, one byte a dimension; Jégou et al.,
    "Product quantization for nearest neighbor search", TPAMI 2011, for the inverted file).

    Raises:
        ValidationError: fewer vectors than ``nlist``.
    """
    d = int(x.shape[1])
    nlist = params.nlist or auto_nlist(len(x))
    if len(x) < nlist:
        raise ValidationError(f"an IVF index with nlist={nlist} needs at least {nlist} vectors, got {len(x)}")
    params = params.for_size(len(x)) if params.ivf_storage == AUTO else params
    quantizer = faiss.IndexFlatIP(d)
    if params.ivf_storage == "sq8":
        ivf = faiss.IndexIVFScalarQuantizer(quantizer, d, nlist, faiss.ScalarQuantizer.QT_8bit,
                                            faiss.METRIC_INNER_PRODUCT)
    else:
        ivf = faiss.IndexIVFFlat(quantizer, d, nlist, faiss.METRIC_INNER_PRODUCT)
    ivf.cp.seed = 1234
    ivf.train(x)
    ivf.nprobe = params.nprobe
    ivf.set_direct_map_type(faiss.DirectMap.Hashtable)
    return ivf, replace(params, nlist=nlist)


def training_sample(parts: Iterable[tuple[np.ndarray, np.ndarray]], n: int, size: int, seed: int = 1234) -> np.ndarray:
    """A uniform sample, without replacement and seeded, of ``size`` of the ``n`` vectors that
    ``parts`` yields in order (``(vectors, labels)`` pairs, float32 ``(p, d)``); every vector when
    ``n <= size``. Only the sample is held: float32 ``(min(n, size), d)``, in the parts' order.

    Raises:
        ValidationError: ``parts`` yields other than ``n`` vectors, or none.
    """
    take = None if n <= size else np.sort(np.random.default_rng(seed).choice(n, size, replace=False))
    out, start = [], 0
    for x, _ in parts:
        x = np.asarray(x, dtype=np.float32)
        if take is None:
            out.append(x)
        else:
            lo, hi = np.searchsorted(take, [start, start + len(x)])
            out.append(x[take[lo:hi] - start])
        start += len(x)
    if start != n or not out:
        raise ValidationError(f"expected {n} vectors to train on, the parts held {start}")
    return out[0] if len(out) == 1 else np.concatenate(out)

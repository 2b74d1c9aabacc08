"""An opened index directory: document store, BM25, optional dense vectors, lazy encoder,
metadata filters, and durable add / delete / compact while serving.

:meth:`Index.open` is what :func:`heedrank.registry.open_index` calls. The retrievers in
``retriever/`` are built over an :class:`Index` with ``from_index(index, **options)`` and
search through :meth:`Index.search_bm25` / :meth:`Index.search_dense`.

Updates (format-2 directories and in-memory indexes):

* **Durability.** The SQLite document store is the source of truth. :meth:`add_documents`
  encodes first, then writes documents (and their vectors) in one ``synchronous=FULL``
  WAL transaction; when it returns, the change is on disk and visible to searches.
  ``vectors.faiss`` and ``bm25/`` are written only by :meth:`flush`, :meth:`compact` and
  :meth:`close`; on open they are caught up from SQLite (deleted documents excluded,
  missing vectors taken from the stored copies, else re-encoded; documents absent from
  the BM25 matrix go to its delta).
* **Versions.** Each added document version gets a new int64 ``vid`` (``next_vid``, only
  growing); replacing a document deletes its old version.
* **Deletes.** Flat and IVF vectors are removed in place; HNSW (no ``remove_ids`` in
  faiss) keeps tombstones excluded by the search selector; BM25 rows are masked. All
  until :meth:`compact` rebuilds them.
* **BM25 additions** go to a small delta scored at query time and merged with the matrix
  (:class:`heedrank.index.bm25.BM25Delta`) until :meth:`compact` (or :meth:`compact_async`, the
  same in a background thread; :meth:`needs_compaction` says when it is due).
* **Concurrency.** A readers-writer lock: searches (including the filter's SQL query and
  the vector search) share it, an update holds it exclusively for the commit and the
  in-memory apply only (encoding runs before). :meth:`compact` rebuilds without the lock
  and takes it only to swap in the new parts and replay what changed meanwhile. One
  process writes an index directory at a time.

The document store's contract is :class:`heedrank.protocols.WritableDocStore`. Catching up,
compaction, flushing and the recovery of an interrupted swap live in
:mod:`heedrank.index.maintenance` (one recovery path, :func:`~heedrank.index.maintenance.reconcile`,
serves both the catch-up at open and compaction); the methods here delegate to it.
Opening a directory (its parts checked against ``params.json`` and the recorded embedder)
and building in memory live in :mod:`heedrank.index.opening`; the write path of an update in
:mod:`heedrank.index.writing`, its in-memory side in :mod:`heedrank.index.updates`; the
searches in :mod:`heedrank.index.searching`; the vid -> doc id table and the filter cache in
:mod:`heedrank.index.lookups`; the query encoder and the document KV stores, opened on first
use, in :mod:`heedrank.index.lazy_parts`; the :meth:`Index.describe` summary in
:mod:`heedrank.index.summary`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from heedrank.errors import IndexMismatchError, NotFoundError
from heedrank.index import maintenance, opening, searching, summary, writing
from heedrank.index.lazy_parts import BlockStores, LazyEncoder
from heedrank.index.lookups import DocIdTable, FilterCache
from heedrank.index.rwlock import RWLock
from heedrank.protocols import Encoder, WritableDocStore
from heedrank.types import Document

if TYPE_CHECKING:
    from heedrank.blocks import KVHeader
    from heedrank.index.kv import KVStore

logger = logging.getLogger(__name__)

FILTER_CACHE_SIZE = 128
"""Filters whose matching vid sets are kept (cleared by every update)."""


class Index:
    """The stages' shared view of one corpus; every part maps its rows to the same ``vid``.

    Attributes:
        path: Index directory (``None`` for an in-memory index).
        params: Content of ``params.json`` (see :func:`heedrank.index.builder.build_index`).
        docstore: Documents by id, the source of truth: a
            :class:`heedrank.protocols.WritableDocStore` (:class:`heedrank.index.docstore.SQLiteDocStore`
            or :class:`heedrank.index.memory.InMemoryDocStore`).
        bm25: :class:`heedrank.index.bm25.BM25Index` (with its delta and deleted rows).
        dense: :class:`heedrank.index.dense.DenseIndex`, or ``None`` when built without vectors.
        planner: :class:`heedrank.index.planner.PlannerParams` of filtered vector search.
        passages: :class:`heedrank.index.passages.PassageParams` when documents are chunked, else ``None``.

    Build with :meth:`open` (a directory) or :meth:`from_documents` (in memory).

    Raises:
        TypeError: ``docstore`` is not a :class:`heedrank.protocols.WritableDocStore`.
    """

    def __init__(
        self,
        *,
        path: Path | None,
        params: Mapping[str, Any],
        docstore: WritableDocStore,
        bm25: Any,
        dense: Any = None,
        encoder: Encoder | None = None,
        embedder_dir: Path | None = None,
        doc_ids: Sequence[str] | None = None,
        show_progress: bool = False,
        planner: Any = None,
        writable: bool = True,
        kv_cache_bytes: int | None = None,
        kv_tiers: Any = None,
    ) -> None:
        from heedrank.index.passages import PassageParams
        from heedrank.index.planner import PlannerParams

        if not isinstance(docstore, WritableDocStore):
            raise TypeError(f"an Index needs a WritableDocStore (see heedrank.protocols), got {type(docstore).__name__}")
        self.path = path
        self.params = dict(params)
        self.docstore = docstore
        self.bm25 = bm25
        self.dense = dense
        self.show_progress = show_progress
        self.planner = planner or PlannerParams.from_dict((self.params.get("dense") or {}).get("planner") or {})
        self.passages = PassageParams.from_dict((self.params.get("dense") or {}).get("passages"))
        self.writable = writable
        self._encoder = LazyEncoder(encoder, embedder_dir, self.params)
        self.rw = RWLock()
        """Searches read, updates and the swaps of maintenance write (:mod:`heedrank.index.maintenance`)."""
        self.maintenance_lock = threading.Lock()
        """Held by flush and compaction: one at a time."""
        self._block_stores = None if path is None else BlockStores(
            Path(path) / self.KV_DIR, cache_bytes=kv_cache_bytes, kv_tiers=kv_tiers)
        self._filters = FilterCache(self.docstore.filter_vids, FILTER_CACHE_SIZE)
        self.vectors_dirty = False
        """Whether the vector file lags behind memory (:meth:`flush` writes it)."""
        self._vid_table = DocIdTable(docstore, doc_ids)

    @property
    def group_bits(self) -> int:
        """Label bits of the passage number (0 without chunking)."""
        return self.passages.bits if self.passages is not None else 0

    @property
    def max_group(self) -> int:
        """Most vectors per document."""
        return self.passages.max_passages if self.passages is not None else 1

    # -- opening -----------------------------------------------------------------------
    @classmethod
    def open(
        cls, path: str | Path, *, embedder: str | None = None, encoder: Encoder | None = None,
        show_progress: bool = False, kv_cache_bytes: int | None = None, kv_tiers: Any = None,
    ) -> Index:
        """Open an index directory written by :func:`heedrank.index.builder.build_index`.

        A format-2 directory is caught up with its document store (see the module
        docstring); a format-1 directory is opened read-only (updates raise).

        Args:
            path: Index directory.
            embedder: Query encoder directory. ``None`` = the one recorded at build time
                (its path, else the packaged default when its weights hash matches).
                It must be the model the documents were encoded with.
            encoder: A ready encoder object instead (its ``describe()["sha256"]`` must
                equal the recorded one), e.g. the one given to ``build_index``.
            show_progress: Progress bars in the retrievers built over this index.
            kv_cache_bytes: RAM LRU of the document KV store, bytes (``None``: the library
                default, :data:`heedrank.config.KV_CACHE_BUDGET`; the service passes
                ``Settings.kv_cache_bytes``).
            kv_tiers: The document KV store's disk budget, eviction and admission
                (:class:`heedrank.config.KVTiers`); ``None``: unbounded.

        Raises:
            NotFoundError: missing or corrupt index (run ``heedrank index build``).
            IndexMismatchError: ``embedder`` or ``encoder`` differs (weights sha256) from
                the build's embedder, or the index format version is not supported.
            ModelLoadError: ``embedder`` is not a usable local directory.
        """
        return opening.open_index(
            cls, path, embedder=embedder, encoder=encoder, show_progress=show_progress,
            kv_cache_bytes=kv_cache_bytes, kv_tiers=kv_tiers,
        )

    def label_rows(self, vids: Sequence[int] | np.ndarray, vecs: Sequence[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Labels and stacked vectors of documents' vector arrays (see :mod:`heedrank.index.passages`)."""
        from heedrank.index.passages import label_rows

        return label_rows(vids, vecs, self.group_bits, self.dense.dim)

    @classmethod
    def from_documents(
        cls,
        docs: Iterable[Document],
        *,
        encoder: Encoder | None = None,
        bm25_params: Any = None,
        dense_params: Any = None,
        passages: Any = None,
        planner: Any = None,
        show_progress: bool = False,
    ) -> Index:
        """An in-memory index (tests, small candidate sets): BM25, plus dense vectors when
        an ``encoder`` is given. Supports updates (nothing is written to disk).

        Args:
            docs: The documents (vids 0, 1, ... in this order).
            encoder: Dense encoder; ``None`` = BM25 only.
            bm25_params: :class:`heedrank.index.bm25.BM25Params`.
            dense_params: :class:`heedrank.index.dense.DenseParams` (default: flat).
            passages: :class:`heedrank.index.passages.PassageParams` to chunk documents (MaxP).
            planner: :class:`heedrank.index.planner.PlannerParams`.
            show_progress: Progress bars.

        Raises:
            ValidationError: no documents, or a doc id repeats.
        """
        return opening.index_from_documents(
            cls, docs, encoder=encoder, bm25_params=bm25_params, dense_params=dense_params, passages=passages,
            planner=planner, show_progress=show_progress,
        )

    # -- parts -------------------------------------------------------------------------
    def set_doc_ids(self, vids: np.ndarray, ids: Sequence[str]) -> list[str | None]:
        """Replace the vid -> doc id table (:attr:`doc_ids`) with live ``vids`` (int64) and
        their ``ids`` (the document store's :meth:`vid_doc_pairs`); returns the new table."""
        return self._vid_table.replace(vids, ids)

    @property
    def doc_ids(self) -> list[str | None]:
        """Doc id of every vid: ``doc_ids[vid]`` (``None`` for deleted or replaced versions)."""
        return self._vid_table.table

    def doc_ids_of(self, vids: Sequence[int] | np.ndarray) -> list[str]:
        """Doc ids of live vids, in order. Raises NotFoundError for a dead vid."""
        return self._vid_table.ids_of(vids)

    @property
    def encoder(self) -> Encoder:
        """The query encoder, loaded on first use.

        Raises:
            NotFoundError: the index has no dense vectors.
            ModelLoadError: the model cannot be loaded.
        """
        if self.dense is None and not self._encoder.ready:
            raise NotFoundError("this index was built without dense vectors (--no-dense); it has no encoder")
        return self._encoder.get()

    def encode_documents(self, docs: Sequence[Document]) -> list[np.ndarray]:
        """float32 ``(p, d)`` vectors per document: one, or one per passage."""
        from heedrank.index.passages import encode_documents

        return encode_documents(self.encoder, docs, self.passages)

    def provides(self) -> frozenset[str]:
        """The parts a retriever may require (its ``requires``): ``"bm25"``, and ``"dense"``
        when the index has vectors."""
        return frozenset({"bm25", "dense"}) if self.dense is not None else frozenset({"bm25"})

    def available_retrievers(self) -> list[str]:
        """The registered retrievers whose ``requires`` this index :meth:`provides`, sorted
        (:func:`heedrank.registry.retrievers_for`): ``["bm25"]``, or ``["bm25", "dense", "hybrid"]``
        when the index has vectors, plus those registered with
        :func:`heedrank.registry.register_retriever`."""
        from heedrank import registry

        return registry.retrievers_for(self.provides())

    # -- filters and search ------------------------------------------------------------
    def filter_vids(self, flt: Any) -> np.ndarray | None:
        """Sorted int64 vids matching a metadata filter; ``None`` for no filter.

        ``flt`` is a parsed :class:`heedrank.index.filters.BoolFilter` (used as it is), the
        JSON form (parsed here), or ``None``. Results are cached per filter until the next
        update.

        Raises:
            FilterError: an invalid filter (HTTP 422; the message names the clause).
        """
        return self._filters.vids(flt)

    def search_bm25(self, texts: Sequence[str], k: int, *, filter: Any = None) -> list[tuple[list[str], np.ndarray]]:
        """BM25 top-``k`` per query (see :meth:`heedrank.index.bm25.BM25Index.search`) among live
        documents matching ``filter``.

        Returns:
            Per query ``(doc_ids, scores float32)`` by descending score, only documents
            with score > 0, ties at the ``k``-th score kept (cut them by doc id).

        Raises:
            FilterError: an invalid filter.
        """
        return searching.search_bm25(self, texts, k, filter)

    def search_dense(
        self, vectors: np.ndarray, k: int, *, filter: Any = None, strategy: str = "auto"
    ) -> tuple[list[tuple[list[str], np.ndarray]], Any]:
        """Dense top-``k`` documents per query among live documents matching ``filter``.

        Args:
            vectors: float32 ``(n, dim)`` query embeddings.
            k: Documents wanted per query.
            filter: Metadata filter (JSON mapping) or ``None``.
            strategy: ``"auto"`` (planner), ``"exact"`` or ``"ann"``.

        Returns:
            ``(rows, report)``: per query ``(doc_ids, scores float32 (r,))`` sorted by
            descending cosine similarity, ``r = min(k, matching documents)``, and the
            :class:`heedrank.index.planner.SearchReport`.

        Raises:
            NotFoundError: no dense vectors. FilterError: an invalid filter.
        """
        return searching.search_dense(self, vectors, k, filter, strategy)

    # -- updates -----------------------------------------------------------------------
    def check_writable(self) -> None:
        """Raises IndexMismatchError for a read-only (format-1) index, whose updates need a rebuild."""
        if not self.writable:
            raise IndexMismatchError(
                f"index at {self.path} has format version {self.params.get('format_version')!r} and is read-only; "
                "rebuild it with `heedrank index build ... --overwrite` to add or delete documents"
            )

    def add_documents(self, docs: Iterable[Document]) -> dict[str, Any]:
        """Add or replace documents, durably, while serving.

        Documents are encoded first (no lock held), then written to SQLite in one
        transaction and applied to BM25 (delta) and the vector index under the write lock.
        When this returns the documents are durable and searchable.

        Returns:
            ``{"added": [doc ids new to the index], "replaced": [doc ids that had an
            older version], "vids": {doc_id: new vid}}``.

        Raises:
            ValidationError: a repeated or empty doc id, invalid metadata, or the index
                cannot be updated; nothing is written then.
            IndexMismatchError: a format-1 (read-only) index.
        """
        return writing.add_documents(self, docs)

    def delete_documents(self, doc_ids: Sequence[str]) -> dict[str, Any]:
        """Delete documents by id, durably (unknown ids are reported, not an error).

        Returns:
            ``{"deleted": [doc ids], "missing": [doc ids not in the index]}``.

        Raises:
            IndexMismatchError: a format-1 (read-only) index.
        """
        return writing.delete_documents(self, doc_ids)

    def clear_filter_cache(self) -> None:
        """Forget the cached vid sets of filters (every update changes them)."""
        self._filters.clear()

    # -- maintenance (see heedrank.index.maintenance) -----------------------------------
    def stats(self) -> dict[str, Any]:
        """Live documents, BM25 delta and masked rows, vectors and tombstones."""
        return maintenance.stats(self)

    def needs_compaction(self, fraction: float = 0.1) -> bool:
        """Whether the BM25 delta, masked BM25 rows or HNSW tombstones exceed ``fraction``
        of the live documents."""
        return maintenance.needs_compaction(self, fraction)

    def flush(self) -> bool:
        """Write the vector index if it lags behind memory, then forget the stored vector
        copies it now holds. Returns whether a file was written (in-memory: never)."""
        return maintenance.flush(self)

    def compact(self) -> dict[str, Any]:
        """Rebuild BM25 from the live documents (folding in the delta, dropping masked
        rows, refreshing statistics; with the current analyzer, so an index built with an
        older one is upgraded) and the vector index (HNSW: without tombstones), write
        both, and swap them in. Searches and updates continue meanwhile; updates made
        during the rebuild are replayed onto the new parts before the swap.

        Returns:
            Summary: documents, seconds, what was dropped and replayed.

        Raises:
            IndexMismatchError: a format-1 (read-only) index.
        """
        return maintenance.compact(self)

    def compact_async(self) -> Future:
        """Run :meth:`compact` in a background thread; searches and updates continue.

        Returns:
            A ``concurrent.futures.Future`` with the summary (or the exception).
        """
        return maintenance.compact_async(self)

    def live_vids(self) -> np.ndarray:
        """Sorted int64 vids of the live documents (from :attr:`doc_ids`; call it holding :attr:`rw`)."""
        return self._vid_table.live_vids()

    def describe(self) -> dict[str, Any]:
        """Summary for ``/info`` and reports (no model load); the keys are listed in
        :func:`heedrank.index.summary.describe`."""
        return summary.describe(self)

    KV_DIR = "kv"
    """Folder of the document KV store inside an index directory."""

    def block_store(self, header: KVHeader | Mapping[str, Any], *, create: bool = True) -> KVStore | None:
        """The index's document KV store (:class:`heedrank.index.kv.KVStore` at
        ``<index>/kv``) for a reranker whose blocks were computed as ``header`` says (a
        :class:`heedrank.blocks.KVHeader`, or its fields), opened once, with this index's
        ``kv_cache_bytes``, and kept until :meth:`close`; ``None`` for an in-memory index, or
        when the store does not exist and ``create`` is false.

        Raises:
            KVStoreMismatchError: the store was built with another model, layer,
                block length, dtype or adapter (the message names the rebuild command).
            KVStoreError: the store cannot be opened (e.g. another process writes it).
        """
        return None if self._block_stores is None else self._block_stores.get(header, create=create)

    def close(self) -> None:
        """Write the vector index if it lags behind (writable directories), then close
        the document store's connections and the document KV store."""
        try:
            self.flush()
        finally:
            if self._block_stores is not None:
                self._block_stores.close()
            self.docstore.close()

    def __repr__(self) -> str:
        return f"Index({str(self.path) if self.path else 'in-memory'!r}, {len(self.docstore)} docs, {self.available_retrievers()})"

"""An opened index directory: document store, BM25, optional dense vectors, lazy encoder.

:meth:`Index.open` is what :func:`attnrank.registry.open_index` calls. The retrievers in
``retriever/`` are built over an :class:`Index` with ``from_index(index, **options)``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from attnrank.errors import IndexMismatchError, ModelLoadError, NotFoundError
from attnrank.protocols import DocStore, Encoder
from attnrank.types import Document

logger = logging.getLogger(__name__)


class Index:
    """The stages' shared view of one corpus; row ``vid`` of every part is the same document.

    Attributes:
        path: Index directory (``None`` for an in-memory index).
        params: Content of ``params.json`` (see :func:`index.builder.build_index`).
        docstore: Documents by id.
        bm25: :class:`index.bm25.BM25Index`.
        dense: :class:`index.dense.DenseIndex`, or ``None`` when built without vectors.

    Build with :meth:`open` (a directory) or :meth:`from_documents` (in memory).
    """

    def __init__(
        self,
        *,
        path: Path | None,
        params: Mapping[str, Any],
        docstore: DocStore,
        bm25: Any,
        dense: Any = None,
        encoder: Encoder | None = None,
        embedder_dir: Path | None = None,
        doc_ids: Sequence[str] | None = None,
        show_progress: bool = False,
    ) -> None:
        self.path = path
        self.params = params
        self.docstore = docstore
        self.bm25 = bm25
        self.dense = dense
        self.show_progress = show_progress
        self._encoder = encoder
        self._embedder_dir = embedder_dir
        self._doc_ids = list(doc_ids) if doc_ids is not None else None
        self._lock = threading.Lock()

    # -- opening -----------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | Path, *, embedder: str | None = None, show_progress: bool = False) -> Index:
        """Open an index directory written by :func:`index.builder.build_index`.

        Args:
            path: Index directory.
            embedder: Query encoder directory. ``None`` = the one recorded at build time
                (its path, else the packaged default when its weights hash matches).
                It must be the model the documents were encoded with.
            show_progress: Progress bars in the retrievers built over this index.

        Raises:
            NotFoundError: missing or corrupt index (run ``attnrank index build``).
            IndexMismatchError: ``embedder`` differs (weights sha256) from the build's
                embedder, or the index format version is not supported.
            ModelLoadError: ``embedder`` is not a usable local directory.
        """
        from index.bm25 import BM25Index
        from index.builder import BM25_DIR, DOCS_FILE, FORMAT_VERSION, read_params
        from index.dense import VECTORS_FILE, DenseIndex
        from index.docstore import SQLiteDocStore

        root = Path(path).expanduser().absolute()
        params = read_params(root)
        hint = f"; rebuild it with `attnrank index build --corpus DATA --out {root} --overwrite`"
        version = params.get("format_version")
        if version != FORMAT_VERSION:
            raise IndexMismatchError(
                f"index at {root} has format version {version!r}; this attnrank reads version {FORMAT_VERSION}{hint}"
            )
        try:
            dense_params = params.get("dense")
            embedder_dir = _check_embedder(root, dense_params, embedder) if dense_params else None
            docstore = SQLiteDocStore(root / DOCS_FILE)
            bm25 = BM25Index.load(root / BM25_DIR)
            dense = DenseIndex.load(root / VECTORS_FILE) if dense_params else None
        except NotFoundError as exc:
            raise NotFoundError(f"index at {root} is incomplete or corrupt: {exc}{hint}") from exc
        n = params.get("num_docs")
        sizes = {"params.json": n, "docs.sqlite": len(docstore), "bm25": bm25.num_docs}
        if dense is not None:
            sizes["vectors.faiss"] = len(dense)
            if dense_params.get("dim") not in (None, dense.dim):
                raise NotFoundError(f"index at {root} is corrupt: vector dim {dense.dim} != {dense_params['dim']}{hint}")
        if len(set(sizes.values())) != 1:
            docstore.close()
            raise NotFoundError(f"index at {root} is corrupt: document counts disagree {sizes}{hint}")
        if embedder is not None and not dense_params:
            logger.warning("index at %s has no dense vectors; embedder %r is ignored", root, embedder)
        return cls(
            path=root, params=params, docstore=docstore, bm25=bm25, dense=dense,
            embedder_dir=embedder_dir, show_progress=show_progress,
        )

    @classmethod
    def from_documents(
        cls,
        docs: Iterable[Document],
        *,
        encoder: Encoder | None = None,
        bm25_params: Any = None,
        show_progress: bool = False,
    ) -> Index:
        """An in-memory index (tests, small candidate sets): BM25, plus dense vectors when
        an ``encoder`` is given.

        Raises:
            ValidationError: no documents, or a doc id repeats.
        """
        import numpy as np

        from index.bm25 import BM25Builder, BM25Params
        from index.dense import INDEX_TYPE, DenseIndex
        from index.memory import InMemoryDocStore

        store = InMemoryDocStore(docs)
        ids = store.doc_ids()
        builder = BM25Builder(bm25_params or BM25Params())
        texts = [d.content for d in store.iter_documents()]
        builder.add(texts)
        bm25 = builder.build()
        dense = None
        if encoder is not None:
            vectors = np.asarray(encoder.encode_documents(texts), dtype=np.float32)
            dense = DenseIndex(vectors.shape[1])
            dense.add(vectors, np.arange(len(ids), dtype=np.int64))
        params = {
            "format_version": None,
            "num_docs": len(ids),
            "bm25": bm25.describe(),
            "dense": (
                {"index_type": INDEX_TYPE, "dim": dense.dim, "metric": "inner_product", "embedder": dict(encoder.describe())}
                if dense is not None and encoder is not None else None
            ),
        }
        return cls(path=None, params=params, docstore=store, bm25=bm25, dense=dense, encoder=encoder,
                   doc_ids=ids, show_progress=show_progress)

    # -- parts -------------------------------------------------------------------------
    @property
    def doc_ids(self) -> list[str]:
        """Doc id of every row: ``doc_ids[vid]`` (loaded from the document store once)."""
        if self._doc_ids is None:
            with self._lock:
                if self._doc_ids is None:
                    self._doc_ids = self.docstore.doc_ids()  # type: ignore[attr-defined]
        return self._doc_ids

    @property
    def encoder(self) -> Encoder:
        """The query encoder, loaded on first use.

        Raises:
            NotFoundError: the index has no dense vectors.
        """
        if self._encoder is None:
            if self.dense is None:
                raise NotFoundError("this index was built without dense vectors (--no-dense); it has no encoder")
            with self._lock:
                if self._encoder is None:
                    from index.encoder import SentenceTransformerEncoder

                    emb = (self.params.get("dense") or {}).get("embedder") or {}
                    self._encoder = SentenceTransformerEncoder(
                        self._embedder_dir,
                        query_prefix=emb.get("query_prefix", ""),
                        document_prefix=emb.get("document_prefix", ""),
                    )
        return self._encoder

    def available_retrievers(self) -> list[str]:
        """``["bm25"]``, or ``["bm25", "dense", "hybrid"]`` when the index has vectors."""
        return ["bm25", "dense", "hybrid"] if self.dense is not None else ["bm25"]

    def describe(self) -> dict[str, Any]:
        """Summary for ``/info`` and reports (no model load)."""
        dense = self.params.get("dense") or None
        emb = (dense or {}).get("embedder") or {}
        return {
            "path": str(self.path) if self.path is not None else None,
            "num_docs": len(self.docstore),
            "retrievers": self.available_retrievers(),
            "created": self.params.get("created"),
            "format_version": self.params.get("format_version"),
            "corpus": self.params.get("corpus"),
            "bm25": self.params.get("bm25"),
            "dense": (
                {
                    "index_type": dense.get("index_type"),
                    "dim": dense.get("dim"),
                    "embedder": emb.get("name"),
                    "embedder_sha256": emb.get("sha256"),
                }
                if dense else None
            ),
        }

    def close(self) -> None:
        """Close the document store's connections."""
        close = getattr(self.docstore, "close", None)
        if close is not None:
            close()

    def __repr__(self) -> str:
        return f"Index({str(self.path) if self.path else 'in-memory'!r}, {len(self.docstore)} docs, {self.available_retrievers()})"


def _check_embedder(root: Path, dense_params: Mapping[str, Any], embedder: str | None) -> Path:
    """The embedder directory to encode queries with; raises IndexMismatchError on a different model."""
    from index.encoder import model_sha256, packaged_model_dir, resolve_model_dir

    recorded = dense_params.get("embedder") or {}
    want = recorded.get("sha256")
    built_with = f"{recorded.get('name')!r} (sha256 {str(want)[:12]}...)"
    if embedder is not None:
        model_dir = resolve_model_dir(embedder)
        got = model_sha256(model_dir)
        if want and got != want:
            raise IndexMismatchError(
                f"index at {root} was built with embedder {built_with}, but {str(embedder)!r} has weights "
                f"sha256 {got[:12]}...; open it with the same embedder or rebuild the index with this one"
            )
        return model_dir
    candidates: list[Path] = []
    if recorded.get("path"):
        candidates.append(Path(recorded["path"]))
    try:
        candidates.append(packaged_model_dir())
    except ModelLoadError:
        pass
    for cand in candidates:
        try:
            if cand.is_dir() and (not want or model_sha256(cand) == want):
                return cand
        except ModelLoadError:
            continue
    raise IndexMismatchError(
        f"index at {root} was built with embedder {built_with}, which is not available here "
        f"(recorded path {recorded.get('path')!r}); pass embedder=<directory of that model>"
    )

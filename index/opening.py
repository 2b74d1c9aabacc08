"""Opening and building an :class:`heedrank.index.store.Index`: an index directory's parts
(document store, BM25, vectors) checked against its ``params.json`` and the recorded
embedder, an in-memory index from documents, and the lazily opened query encoder and
document KV store.

:class:`~heedrank.index.store.Index` delegates :meth:`~heedrank.index.store.Index.open`,
:meth:`~heedrank.index.store.Index.from_documents`, its ``encoder`` and its
:meth:`~heedrank.index.store.Index.block_store` here; their docstrings are the contract.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heedrank.errors import IndexMismatchError, ModelLoadError, NotFoundError
from heedrank.index import maintenance
from heedrank.protocols import Encoder
from heedrank.types import Document

if TYPE_CHECKING:
    from heedrank.blocks import KVHeader
    from heedrank.index.bm25 import BM25Index
    from heedrank.index.dense import DenseIndex
    from heedrank.index.docstore import SQLiteDocStore
    from heedrank.index.kv import KVStore
    from heedrank.index.store import Index

logger = logging.getLogger("heedrank.index.store")  # the warnings of opening keep the logger they always had


def open_index(
    cls: type[Index], path: str | Path, *, embedder: str | None, encoder: Encoder | None,
    show_progress: bool, kv_cache_bytes: int | None, kv_tiers: Any,
) -> Index:
    """:meth:`heedrank.index.store.Index.open` (see it for the arguments and errors), as an
    instance of ``cls``."""
    from heedrank.index.builder import BM25_DIR, FORMAT_VERSION, READABLE_VERSIONS, read_params

    root = Path(path).expanduser().absolute()
    params = read_params(root)
    hint = f"; rebuild it with `heedrank index build --corpus DATA --out {root} --overwrite`"
    version = params.get("format_version")
    if version not in READABLE_VERSIONS:
        raise IndexMismatchError(
            f"index at {root} has format version {version!r}; this heedrank reads versions "
            f"{list(READABLE_VERSIONS)} (writes {FORMAT_VERSION}){hint}"
        )
    maintenance.recover_swapped_dir(root, BM25_DIR)
    writable = version == FORMAT_VERSION
    docstore, bm25, dense, embedder_dir = _open_parts(root, params, embedder, encoder, writable=writable, hint=hint)
    index = cls(
        path=root, params=params, docstore=docstore, bm25=bm25, dense=dense, encoder=encoder,
        embedder_dir=embedder_dir, show_progress=show_progress, writable=writable, kv_cache_bytes=kv_cache_bytes,
        kv_tiers=kv_tiers,
    )
    if writable:
        maintenance.catch_up(index)
    return index


def index_from_documents(
    cls: type[Index], docs: Iterable[Document], *, encoder: Encoder | None, bm25_params: Any,
    dense_params: Any, passages: Any, planner: Any, show_progress: bool,
) -> Index:
    """:meth:`heedrank.index.store.Index.from_documents` (see it for the arguments and
    errors), as an instance of ``cls``."""
    from heedrank.index.bm25 import BM25Builder, BM25Params
    from heedrank.index.dense import DenseIndex, DenseParams
    from heedrank.index.memory import InMemoryDocStore
    from heedrank.index.passages import label_rows

    store = InMemoryDocStore(docs)
    vids, ids = store.vid_doc_pairs()
    builder = BM25Builder(bm25_params or BM25Params())
    all_docs = list(store.iter_documents())
    builder.add([d.content for d in all_docs])
    bm25 = builder.build(row_vids=vids)
    dense_params = dense_params or DenseParams()
    params: dict[str, Any] = {"format_version": None, "num_docs": len(ids), "bm25": bm25.describe(), "dense": None}
    index = cls(path=None, params=params, docstore=store, bm25=bm25, encoder=encoder,
                show_progress=show_progress, planner=planner)
    index.passages = passages
    index.set_doc_ids(vids, ids)
    if encoder is not None:
        vecs = index.encode_documents(all_docs)
        dim = int(vecs[0].shape[-1]) if vecs else int(encoder.dim)
        labels, x = label_rows(vids, vecs, index.group_bits, dim)
        index.dense = DenseIndex.build(x, labels, dense_params, dim=dim)
        params["dense"] = {
            "index_type": index.dense.describe()["index_type"], "dim": dim, "metric": "inner_product",
            "params": index.dense.params.to_dict(), "embedder": dict(encoder.describe()),
            "passages": passages.to_dict() if passages is not None else None,
            "planner": index.planner.to_dict(),
        }
    return index


def load_encoder(embedder_dir: Path | None, params: Mapping[str, Any]) -> Encoder:
    """The query encoder of the model directory ``embedder_dir`` with the query and document
    prefixes and the runtime recorded in the index ``params`` (``params["dense"]["embedder"]``;
    an index from before runtimes were recorded was built on ``torch``).

    Raises:
        ModelLoadError: the model cannot be loaded.
    """
    from heedrank.index.encoder import SentenceTransformerEncoder

    emb = (params.get("dense") or {}).get("embedder") or {}
    return SentenceTransformerEncoder(
        embedder_dir,
        query_prefix=emb.get("query_prefix", ""),
        document_prefix=emb.get("document_prefix", ""),
        runtime=emb.get("runtime", "torch"),
    )


def open_kv_store(path: Path, want: KVHeader, *, cache_bytes: int | None, kv_tiers: Any) -> KVStore:
    """Open (or create) the document KV store at ``path`` for blocks described by ``want``,
    with a RAM cache of ``cache_bytes`` (``None``: the library default) and the disk tiers
    ``kv_tiers`` (:class:`heedrank.config.KVTiers`, ``None``: unbounded).

    Raises:
        KVStoreMismatchError: the store was built for another header.
        KVStoreError: the store cannot be opened.
    """
    from heedrank.index.kv import KVStore

    # float16 blocks come out as float16 (the RAM cache holds half the bytes; they are
    # widened while copied into a query's context); int8 ones as float32, decoded in
    # one pass (a float16 copy would cost a slow float32 -> float16 conversion per read)
    out = "float32" if want.dtype == "int8" else "float16"
    tiers = {} if kv_tiers is None else kv_tiers.store_options()
    return KVStore.open_or_create(path, want, out_dtype=out, cache_bytes=cache_bytes, **tiers)


def _open_parts(root: Path, params: Mapping[str, Any], embedder: str | None, encoder: Encoder | None, *,
                writable: bool, hint: str) -> tuple[SQLiteDocStore, BM25Index, DenseIndex | None, Path | None]:
    """The document store, BM25 and vector index (``None`` without vectors) of the index
    directory ``root``, checked against its ``params``, and the query encoder directory to
    load on first use (``None`` when ``encoder`` is given or there are no vectors). See
    :meth:`heedrank.index.store.Index.open` for the arguments; ``hint`` ends the error messages (the rebuild
    command). Closes the document store before it raises.

    Raises:
        NotFoundError: a missing or corrupt part (for a read-only ``writable=False`` index,
            also parts that disagree on the document count).
        IndexMismatchError: ``encoder`` differs from the build's embedder.
        ModelLoadError: ``embedder`` is not a usable local directory.
    """
    from heedrank.index.bm25 import BM25Index
    from heedrank.index.builder import BM25_DIR, DOCS_FILE
    from heedrank.index.dense import VECTORS_FILE, DenseIndex, DenseParams
    from heedrank.index.docstore import SQLiteDocStore

    docstore: SQLiteDocStore | None = None
    try:
        dense_params = params.get("dense")
        embedder_dir = None
        if dense_params and encoder is not None:
            want = (dense_params.get("embedder") or {}).get("sha256")
            got = dict(encoder.describe()).get("sha256")
            if want != got:
                raise IndexMismatchError(
                    f"index at {root} was built with embedder sha256 {str(want)[:12]}..., "
                    f"but the given encoder has {str(got)[:12]}..."
                )
        elif dense_params:
            embedder_dir = _check_embedder(root, dense_params, embedder)
        docstore = SQLiteDocStore(root / DOCS_FILE)
        bm25 = BM25Index.load(root / BM25_DIR)
        dense = None
        if dense_params:
            dense = DenseIndex.load(root / VECTORS_FILE, DenseParams.from_dict(dense_params.get("params") or {}))
    except NotFoundError as exc:
        if docstore is not None:
            docstore.close()
        raise NotFoundError(f"index at {root} is incomplete or corrupt: {exc}{hint}") from exc
    if dense is not None and dense_params and dense_params.get("dim") not in (None, dense.dim):
        docstore.close()
        raise NotFoundError(f"index at {root} is corrupt: vector dim {dense.dim} != {dense_params['dim']}{hint}")
    if embedder is not None and not dense_params:
        logger.warning("index at %s has no dense vectors; embedder %r is ignored", root, embedder)
    _warn_old_analyzer(root, bm25.params.analyzer_version, writable)
    if not writable:
        n = params.get("num_docs")
        sizes = {"params.json": n, "docs.sqlite": len(docstore), "bm25": bm25.num_docs}
        if dense is not None:
            sizes["vectors.faiss"] = len(dense)
        if len(set(sizes.values())) != 1:
            docstore.close()
            raise NotFoundError(f"index at {root} is corrupt: document counts disagree {sizes}{hint}")
    return docstore, bm25, dense, embedder_dir


def _warn_old_analyzer(root: Path, version: int, writable: bool) -> None:
    """Log that the index's BM25 predates the current analyzer, and how to upgrade it: its
    queries are analysed as its documents were (so it answers as before), without the Unicode
    folding of :data:`heedrank.index.bm25.ANALYZER_VERSION`."""
    from heedrank.index.bm25 import ANALYZER_VERSION

    if version >= ANALYZER_VERSION:
        return
    how = (f"`heedrank index compact {root}` (rebuilds BM25 only, keeps documents and vectors)" if writable
           else f"`heedrank index build --corpus DATA --out {root} --overwrite`")
    logger.warning(
        "index at %s: its BM25 was built with analyzer version %s, before Unicode folding (version %s): NFC/NFD "
        "accents, full-width letters, ligatures, zero-width characters and soft hyphens do not match their plain "
        "spelling; upgrade it with %s", root, version, ANALYZER_VERSION, how,
    )


def _check_embedder(root: Path, dense_params: Mapping[str, Any], embedder: str | None) -> Path:
    """The embedder directory to encode queries with; raises IndexMismatchError on a different model."""
    from heedrank.index.encoder import model_sha256, packaged_model_dir, resolve_model_dir

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

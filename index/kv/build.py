"""Filling a document KV store: the resumable build driver (``heedrank index kv build``).

:func:`put_batches` commits one shard per batch, so a build stopped at any point (even
``kill -9``) resumes where it stopped. :func:`plan_build` is the one planner of both
engines (open the index's store, adopt what an interrupted distributed build left, key
every live document's block with a cached-mode reranker,
:class:`heedrank.blocks.BlockCachingReranker`, and leave out the stored ones);
:func:`build_index_blocks` plans, has an engine (:mod:`heedrank.engine`) encode what is
missing, and prunes with :func:`prune_blocks`. :func:`build_missing` is the same loop over
any keys, and :func:`build_part` one part of a distributed build.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heedrank.blocks import BlockCachingReranker, BlockKey, KVHeader
from heedrank.errors import KVStoreError, ValidationError
from heedrank.index.kv.store import KVStore
from heedrank.progress import Progress, track
from heedrank.textrules import is_int

if TYPE_CHECKING:
    from heedrank.config import RerankerConfig
    from heedrank.engine import Engine
    from heedrank.index.store import Index

logger = logging.getLogger(__name__)

__all__ = [
    "BlockBuildPlan",
    "BuildReport",
    "build_index_blocks",
    "build_missing",
    "build_part",
    "index_block_texts",
    "open_index_store",
    "plan_build",
    "prune_blocks",
    "put_batches",
]


@dataclass(frozen=True)
class BuildReport:
    """What :func:`build_missing` did (counts of blocks).

    Attributes:
        requested: Distinct blocks asked for.
        skipped: Already stored (not recomputed).
        computed: Computed and committed now.
        shards: Shards committed (one per batch).
        seconds: Wall time.
    """

    requested: int
    skipped: int
    computed: int
    shards: int
    seconds: float


def build_missing(
    store: KVStore,
    keys: Iterable[BlockKey],
    compute_fn: Callable[[list[BlockKey]], Mapping[BlockKey, tuple[Any, Any]]],
    *,
    batch_size: int = 32,
    show_progress: bool = False,
    verify_existing: bool = False,
) -> BuildReport:
    """Resumable build: compute and store the blocks of ``keys`` not stored yet.

    Each batch is committed as its own shard, so after a crash (even ``kill -9``) a rerun
    skips every finished batch and recomputes only the rest.

    Args:
        store: A writable store.
        keys: Blocks wanted (duplicates ignored).
        compute_fn: ``compute_fn([key, ...]) -> {key: (keys, values)}`` for exactly those
            keys; arrays float ``(n_layers, kv_heads, T, head_dim)``.
        batch_size: Blocks per call and per shard (at SmolLM2's shape, 32 fp16 blocks of
            96 tokens make a ~38 MB shard).
        show_progress: tqdm bar (blocks/s, ETA), or log lines every ~10% instead when stderr is not a TTY.
        verify_existing: crc32-check the already stored blocks first and recompute bad ones
            (reads them all once).

    Returns:
        A :class:`BuildReport`.

    Raises:
        KVStoreError: ``compute_fn`` left out requested keys, or the store cannot be written.
        Whatever ``compute_fn`` raises (the batches committed before it stay).
    """
    _check_batch_size(batch_size)
    t0 = time.perf_counter()
    wanted = list(dict.fromkeys(keys))
    todo = _missing(store, wanted, verify_existing=verify_existing, show_progress=show_progress)
    skipped = len(wanted) - len(todo)
    with Progress(total=len(todo), desc="kv build", unit="block", show_progress=show_progress, log=logger,
                  dynamic_ncols=True) as bar:
        bar.set_postfix(skipped=skipped)
        shards = put_batches(store, todo, compute_fn, batch_size=batch_size, progress=bar.update)
    return BuildReport(len(wanted), skipped, len(todo), shards, time.perf_counter() - t0)


def _check_batch_size(batch_size: int) -> None:
    if not is_int(batch_size) or batch_size < 1:
        raise ValidationError(f"batch_size must be an integer >= 1, got {batch_size!r}")


def _missing(store: KVStore, keys: list[BlockKey], *, verify_existing: bool, show_progress: bool) -> list[BlockKey]:
    """The keys of ``keys`` (distinct) not stored yet, after an optional crc32 check of the
    stored ones (:meth:`KVStore.verify`: bad entries are dropped, so they count as missing)."""
    if verify_existing:
        store.verify(keys, show_progress=show_progress)
    todo = [k for k in keys if not store.contains(k)]
    if len(keys) > len(todo):
        logger.info("kv build: %d of %d blocks already stored, computing %d", len(keys) - len(todo), len(keys),
                    len(todo))
    return todo


def put_batches(
    store: KVStore,
    todo: Sequence[BlockKey],
    compute_fn: Callable[[list[BlockKey]], Mapping[BlockKey, tuple[Any, Any]]],
    *,
    batch_size: int,
    progress: Callable[[int], Any] | None = None,
) -> int:
    """Compute ``todo`` in batches of ``batch_size`` blocks and commit each batch as one shard
    (:meth:`KVStore.put_many`); ``progress(n)`` after each.

    Returns:
        The shards committed.

    Raises:
        KVStoreError: ``compute_fn`` left out requested keys, or the store cannot be written.
        Whatever ``compute_fn`` raises (the batches committed before it stay).
    """
    shards = 0
    for b in range(0, len(todo), batch_size):
        batch = list(todo[b : b + batch_size])
        out = compute_fn(list(batch))
        absent = [k for k in batch if k not in out]
        if absent:
            raise KVStoreError(f"compute_fn returned no keys/values for {len(absent)} requested blocks, e.g. {absent[:3]}")
        extra = len(out) - len(batch)
        if extra:
            logger.warning("kv build: compute_fn returned %d blocks that were not asked for; ignored", extra)
        store.put_many({k: out[k] for k in batch}, admit=False)  # a build is asked for: no admission rule
        shards += 1
        if progress is not None:
            progress(len(batch))
    return shards


def build_part(
    store_dir: str | os.PathLike[str],
    header: KVHeader,
    keys: Sequence[BlockKey],
    compute_fn: Callable[[list[BlockKey]], Mapping[BlockKey, tuple[Any, Any]]],
    *,
    batch_size: int = 32,
) -> dict[str, Any]:
    """One part of a distributed document KV store build (``heedrank index kv build
    --engine ray``, :meth:`heedrank.engine.ray.RayEngine.build_blocks`): compute and store
    one part's blocks in a store of its own.

    Opens (or creates) the KV store at ``store_dir`` for ``header`` and runs
    :func:`build_missing` over ``keys`` with ``compute_fn`` (the BlockRank block encoder:
    ``compute_fn([key, ...]) -> {key: (keys, values)}``). It is resumable (a rerun skips what
    was committed). A store has one writer, so each part writes its own directory
    (``<kv>/parts/part-00000``, ...; :meth:`BlockBuildPlan.part_dirs`); each actor runs this
    per part, and the driver adopts the part into the index's store (:meth:`KVStore.adopt`).

    Returns:
        The :class:`BuildReport` as a dict, with ``store``.

    Raises:
        KVStoreError, KVStoreMismatchError: from the store (another header, a held lock).
    """
    store = KVStore.open_or_create(store_dir, header)
    try:
        report = build_missing(store, list(keys), compute_fn, batch_size=batch_size)
    finally:
        store.close()
    return {**asdict(report), "store": str(Path(store_dir))}


def index_block_texts(index: Index, encoder: BlockCachingReranker, *, show_progress: bool = False) -> dict[BlockKey, str]:
    """The block key of every live document of ``index`` and one text per key.

    Args:
        index: The index (its document store is read in chunks of 1,000 documents).
        encoder: A cached-mode reranker; only its ``block_keys(texts)`` (tokenisation) runs.
        show_progress: tqdm bar over the documents; log lines every ~10% instead when stderr is not a TTY.

    Returns:
        ``{block key: document text}`` in document order; documents whose blocks have the
        same tokens share one key (the first text is kept).
    """
    texts: dict[BlockKey, str] = {}
    docs: Iterable[Any] = index.docstore.iter_documents()
    if show_progress:
        docs = track(docs, total=len(index.docstore), desc="tokenise", unit="doc", log=logger)
    chunk: list[str] = []

    def flush() -> None:
        for key, text in zip(encoder.block_keys(chunk), chunk):
            texts.setdefault(key, text)
        chunk.clear()

    for doc in docs:
        chunk.append(doc.content)
        if len(chunk) >= 1000:
            flush()
    flush()
    return texts


def prune_blocks(store: KVStore, keep: Iterable[BlockKey], *, show_progress: bool = False) -> int:
    """Delete the blocks of ``store`` not in ``keep`` (those of deleted or replaced documents)
    and compact the store when any were deleted.

    Returns:
        The blocks deleted.

    Raises:
        KVStoreError: the store cannot be written.
    """
    wanted = set(keep)
    stale = [k for k in store.keys() if k not in wanted]
    if stale:
        store.delete(stale)
        store.compact(show_progress=show_progress)
    logger.info("kv build: pruned %d blocks of deleted or replaced documents", len(stale))
    return len(stale)


@dataclass
class BlockBuildPlan:
    """What a build of an index's document KV store has left to do (:func:`plan_build`),
    the same for either engine (an :class:`heedrank.engine.BlockPlan`): the engine encodes
    :attr:`todo` (:meth:`encode_here` in this process, or parts on Ray: :meth:`part_dirs`,
    :meth:`adopt`).

    Attributes:
        store: The index's store, writable (its lock keeps other builders out); parts an
            interrupted distributed build left are already adopted.
        encoder: The cached-mode reranker the plan was made with (its header; tokenisation;
            the LM that :meth:`encode_here` runs).
        texts: ``{block key: text}`` of every live document, in document order; documents
            whose blocks have the same tokens share one key.
        todo: The keys of :attr:`texts` not stored yet, in order.
        started: ``time.perf_counter()`` when planning began (:meth:`report` counts from it).
    """

    store: KVStore
    encoder: BlockCachingReranker
    texts: dict[BlockKey, str]
    todo: list[BlockKey]
    started: float

    @property
    def skipped(self) -> int:
        """Blocks stored before this build (adopted leftover parts included)."""
        return len(self.texts) - len(self.todo)

    @property
    def header(self) -> dict[str, Any]:
        """The encoder's store header as its fields (:meth:`heedrank.blocks.KVHeader.to_dict`):
        what every encoded block must match, in a form that crosses to workers as it is."""
        return self.store.header.to_dict()  # the store was opened for the encoder's header

    def encode_here(self, *, batch_size: int, progress: Callable[[int], Any] | None = None) -> int:
        """Encode :attr:`todo` with :attr:`encoder` in this process, one committed shard per
        batch (:func:`put_batches`); returns the shards committed."""
        texts, encoder = self.texts, self.encoder

        def compute(keys: list[BlockKey]) -> dict[BlockKey, tuple[Any, Any]]:
            return {k: (kk, vv) for k, kk, vv in encoder.encode_block_arrays([texts[k] for k in keys])}

        return put_batches(self.store, self.todo, compute, batch_size=batch_size, progress=progress)

    def part_dirs(self, n: int) -> list[Path]:
        """``n`` part store directories under :meth:`KVStore.parts_dir` for a distributed
        build (not created), numbered after every part already there: a part left behind by
        an earlier run (still locked by a dying actor) never has its name reused."""
        parts_dir = self.store.parts_dir()
        parts_dir.mkdir(exist_ok=True)
        first = 1 + max((int(p.name[5:]) for p in parts_dir.glob("part-*") if p.name[5:].isdigit()), default=-1)
        return [parts_dir / f"part-{first + i:05d}" for i in range(n)]

    def adopt(self, part: str | os.PathLike[str]) -> None:
        """Commit a finished part store into :attr:`store` (:meth:`KVStore.adopt`: one atomic
        manifest commit, hard links, the part removed after it)."""
        self.store.adopt(part)

    def report(self, shards: int) -> BuildReport:
        """The build's :class:`BuildReport` (``seconds`` since planning began)."""
        return BuildReport(len(self.texts), self.skipped, len(self.todo), shards, time.perf_counter() - self.started)


def plan_build(index: Index, encoder: BlockCachingReranker, *, verify_existing: bool = False,
               show_progress: bool = False) -> BlockBuildPlan:
    """Plan the build of ``index``'s document KV store (the one planner of both engines):
    open the store writable for ``encoder``'s header, adopt the parts an interrupted
    distributed build left (:meth:`KVStore.adopt_parts`), key every live document's block
    (:func:`index_block_texts`), crc32-check the stored blocks with ``verify_existing``, and
    leave out the committed ones.

    Raises:
        ValidationError: the encoder is not in cached mode, or the index is in memory.
        KVStoreMismatchError: the index's store was built for another configuration.
        KVStoreError: another process writes the store.
    """
    started = time.perf_counter()
    store = open_index_store(index, encoder)
    store.adopt_parts(verify=verify_existing, show_progress=show_progress)
    texts = index_block_texts(index, encoder, show_progress=show_progress)
    todo = _missing(store, list(texts), verify_existing=verify_existing, show_progress=show_progress)
    return BlockBuildPlan(store, encoder, texts, todo, started)


def build_index_blocks(
    index: Index, encoder: BlockCachingReranker, *, engine: Engine | None = None, config: RerankerConfig | None = None,
    batch_size: int = 32, show_progress: bool = False, verify_existing: bool = False, prune: bool = False,
) -> tuple[KVStore, BuildReport]:
    """Fill an index's document KV store (``heedrank index kv build``) with every live
    document's block, resumably: :func:`plan_build`, then the engine encodes what is missing
    (one committed shard per batch; a rerun after ``kill -9`` skips finished shards; a
    corrupt entry is recomputed, never read), then the optional prune. Parts left by an
    interrupted distributed build (``--engine ray``) are adopted first, so either engine
    resumes the other's build.

    Args:
        index: The index, opened from a directory (with the Ray engine: a directory every
            Ray node sees at the same path, e.g. a shared filesystem; always true of a local Ray).
        encoder: A cached-mode reranker (method ``blockrank-cached``); its
            ``encode_block_arrays(texts)`` computes the blocks. With an engine that encodes
            elsewhere it only gives the header and tokenises.
        engine: Where the blocks are encoded (:class:`heedrank.engine.Engine`); default:
            this process, with ``encoder``.
        config: The encoder's :class:`~heedrank.config.RerankerConfig`: an engine that encodes
            elsewhere builds its encoders from it (the Ray engine needs it).
        batch_size: Blocks per LM batch and per shard.
        show_progress: tqdm bars (tokenising; blocks committed); log lines every ~10% instead when stderr is not a TTY.
        verify_existing: crc32-check stored blocks first (and adopted parts), recompute bad ones.
        prune: Afterwards delete the blocks no live document has any more (deleted or
            replaced documents) and compact the store, reclaiming their bytes.

    Returns:
        ``(store, report)``; blocks are keyed by the hash of their token ids, so documents
        with the same text share one block. ``report.skipped`` counts blocks stored before
        this build (adopted leftover parts included), ``report.seconds`` the whole build.

    Raises:
        ValidationError: the encoder is not in cached mode, the index is in memory, or bad sizes.
        KVStoreMismatchError: the index's store (or a Ray worker's reranker) is for another configuration.
        KVStoreError: a full disk, another writer, or Ray workers that cannot see the index directory.
        Whatever the engine raises (e.g. RayExecutionError; what was committed stays, rerun to resume).
    """
    _check_batch_size(batch_size)
    plan = plan_build(index, encoder, verify_existing=verify_existing, show_progress=show_progress)
    label = f" ({engine.label})" if engine is not None and engine.label else ""
    with Progress(total=len(plan.todo), desc=f"kv build{label}", unit="block", show_progress=show_progress,
                  log=logger, dynamic_ncols=True) as bar:
        bar.set_postfix(skipped=plan.skipped)
        if engine is None:
            shards = plan.encode_here(batch_size=batch_size, progress=bar.update)
        else:
            shards = engine.build_blocks(plan, config, batch_size=batch_size, progress=bar.update)
    report = plan.report(shards)
    if prune:
        prune_blocks(plan.store, plan.texts, show_progress=show_progress)
    return plan.store, report


def open_index_store(index: Index, encoder: BlockCachingReranker) -> KVStore:
    """The writable document KV store of ``index`` for ``encoder``'s header (created when absent).

    Raises:
        ValidationError: the encoder is not in cached mode, or the index is in memory.
        KVStoreMismatchError: the index's store was built for another configuration.
        KVStoreError: another process writes the store.
    """
    header = encoder.block_store_header()
    if header is None:
        raise ValidationError("the reranker is not in cached mode: build blocks with method 'blockrank-cached'")
    store = index.block_store(header)
    if store is None:
        raise ValidationError("an in-memory index keeps no document KV store; build the index into a directory")
    return store

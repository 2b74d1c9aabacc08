"""The document KV store: a persistent, append-only, checksummed store of blocks.

With cached BlockRank (method ``blockrank-cached``) a candidate block depends only on the
fixed instruction (block 0) and the document itself (docs/results/store.md, "Exactness, index
time, bytes per block, int8"), so its keys and values for layers ``0..l*`` can be computed once
per distinct block at index time and reused by every query. This module is the *storage* for
them; the LM code that fills it calls :meth:`KVStore.put_many` /
:func:`heedrank.index.kv.build.build_missing` with numpy arrays.

Per block the payload is ``keys`` and ``values``, each ``(n_layers, kv_heads, T, head_dim)``
with ``n_layers = l* + 1`` and ``1 <= T <= max_doc_tokens`` (``T`` varies per block), keyed
by :data:`heedrank.blocks.BlockKey` (the hash of its token ids). The files and the commit
rule are :mod:`heedrank.index.kv.format`'s, the payload bytes its dtype's codec's
(:mod:`heedrank.index.kv.codec`); a put's and a delete's commits are
:mod:`heedrank.index.kv.writes`'s; compaction, verification and the adoption of a
distributed build's parts are :mod:`heedrank.index.kv.maintenance`'s.

Integrity: every read from disk verifies the entry's crc32 (zlib.crc32, ~6 GB/s on one
core: ~0.2 ms for a 1.2 MB entry, small next to decoding it to float32; LRU hits skip it).
A bad entry (checksum, truncated file, wrong length) is logged, dropped from the in-memory
index and reported as missing, so a build recomputes it; it is never returned. Reads
memory-map each shard (``numpy.memmap``), lazily, and keep it mapped. What a read returns
is always a new array decoded from the mapped bytes, never a view of a mapping, so arrays a
caller holds stay intact whatever happens to the shards later (eviction, compaction, close).

Bounded cache tier (``disk_budget``): by default a store only grows (a full prebuild is the
unbounded special case). With a disk budget it behaves as a cache:

* Budget: after :meth:`KVStore.put_many` (and :meth:`KVStore.enforce_budget`, a writable
  open, :meth:`KVStore.adopt`) returns, the live blocks take at most ``disk_budget`` bytes,
  each counted as its payload rounded up to the 64-byte entry alignment (what it occupies
  in its shard; so ``stats().live_bytes <= disk_budget``). A put first picks victims
  (:mod:`heedrank.index.kv.tiers`: ``eviction="lru" | "lfu" | "fifo"``) and tombstones them
  in the SAME manifest commit that adds its shard: a crash leaves the store before or after
  the whole put, never over budget and never with a victim half gone. The blocks being put
  are never victims. A put larger than the budget by itself writes, in the given order,
  each block that still fits (the others are logged and counted in
  ``stats().over_budget``); it never raises for that.
* Disk bytes: evicted and replaced entries stay in their shards as dead bytes. When the dead
  bytes exceed ``compact_slack * disk_budget`` (default 25%) the put (or delete) reclaims
  them before returning (:func:`heedrank.index.kv.maintenance.reclaim`: it rewrites the live
  blocks of the shards with the largest share of dead bytes until at most half that slack is
  left). So once a write returns, the shard files hold at most
  ``disk_budget * (1 + compact_slack)`` bytes, plus the index files and the manifest (about
  the key's length + 50 bytes per block and per tombstone). While a put runs, its new shard (at most
  ``disk_budget``) comes on top, and while a reclaim runs, the copies it writes (at most the
  live bytes of the shards it rewrites).
* Admission (``admit_after``): with ``admit_after=n > 1`` a block is written only on its
  n-th offer while it is among the last ``admit_window`` distinct keys offered
  (:class:`heedrank.index.kv.tiers.Admission`), so a one-off candidate never evicts a block
  that is asked for again. The rule applies only where a write would evict: a put that fits in
  a bounded store's free room is written whole. Blocks not admitted are not written (``put_many`` does not count
  them; the caller keeps them in RAM). A block already stored is always rewritten, and
  ``put_many(..., admit=False)`` (an explicit fill or prebuild) skips admission, never the
  budget.
* Access statistics (last access, access count) live in memory, updated by every read hit
  (RAM-cache hits too) and put; after a reopen (or :meth:`KVStore.refresh`) they are seeded
  from the shard order: an older shard counts as an older access, every count as 1.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import numpy as np

from heedrank.blocks import BlockKey, KVHeader
from heedrank.errors import KVStoreError, ValidationError
from heedrank.index.kv import maintenance, writes
from heedrank.index.kv.budget import Budget, Encoded
from heedrank.index.kv.codec import codec_for
from heedrank.index.kv.directory import WriterLock, make_store_dir, read_header
from heedrank.index.kv.format import FORMAT_VERSION, HEADER_FILE, PARTS_DIR, io_error
from heedrank.index.kv.maintenance import DEFAULT_SHARD_MAX_BYTES, CompactReport
from heedrank.index.kv.manifest import Manifest
from heedrank.index.kv.ramcache import RamCache
from heedrank.lru import CacheStats

logger = logging.getLogger(__name__)

__all__ = ["FORMAT_VERSION", "KVHeader", "KVStore", "KVStoreStats"]


@dataclass(frozen=True)
class KVStoreStats:
    """What :meth:`KVStore.stats` reports.

    Attributes:
        blocks: Live blocks (documents with the same text share one).
        shards: Committed shards.
        bytes_on_disk: Bytes of every file in the store directory.
        live_bytes: Payload bytes of the live blocks.
        tombstones: Deletions not yet compacted away.
        dropped_entries: Entries found corrupt or truncated since open (served as misses).
        cache: The RAM LRU's counters.
        disk_budget: The budget of live bytes (``None``: unbounded).
        evictions: Blocks evicted to stay within the budget since open.
        not_admitted: Blocks offered to :meth:`KVStore.put_many` and not written by the
            admission rule since open.
        over_budget: Blocks not written since open because their put alone exceeded the budget.
    """

    blocks: int
    shards: int
    bytes_on_disk: int
    live_bytes: int
    tombstones: int
    dropped_entries: int
    cache: CacheStats
    disk_budget: int | None = None
    evictions: int = 0
    not_admitted: int = 0
    over_budget: int = 0


class KVStore:
    """A persistent, append-only, checksummed store of BlockRank document blocks
    (an :class:`heedrank.blocks.BlockStore`).

    Open it with :meth:`create`, :meth:`open` or :meth:`open_or_create`. One process at a
    time may open a store writable (an ``flock`` on ``LOCK``); any number may open it
    ``readonly=True`` and pick up new commits with :meth:`refresh`. Within a process all
    methods are thread-safe: reads run concurrently, writers are serialised and only block
    readers for the in-memory swap after their files are durable.

    The store composes two parts with public methods, which
    :mod:`heedrank.index.kv.maintenance` uses too: :attr:`manifest`
    (:class:`heedrank.index.kv.manifest.Manifest`: the commit point, the live index, the
    shard files) and :attr:`budget` (:class:`heedrank.index.kv.budget.Budget`: admission,
    eviction, reclaim). Its own parts: the RAM cache of decoded blocks
    (:class:`heedrank.index.kv.ramcache.RamCache`) and the writer lock
    (:class:`heedrank.index.kv.directory.WriterLock`). It checks what callers pass and runs
    the write transactions (:mod:`heedrank.index.kv.writes`) under that lock.

    Args (of the constructors):
        cache_bytes: RAM LRU budget in bytes for decoded blocks (0 disables it; ``None``:
            :data:`heedrank.config.KV_CACHE_BUDGET`, i.e. ``$HEEDRANK_KV_CACHE_BYTES`` or
            512 MiB; the service passes its ``Settings.kv_cache_bytes``).
        out_dtype: What reads return: ``"float32"`` (default) or ``"float16"`` (half the RAM
            in the LRU, and for a float16 store a plain copy instead of a conversion: ~3x
            faster reads; what a fp16/bf16 model consumes anyway).
        readonly: Open without the writer lock; writes raise :class:`KVStoreError`.
        disk_budget: Bytes of live blocks on disk (each counted 64-byte aligned), ``> 0``, or
            ``None`` (default): unbounded. See the module docstring for the eviction and
            the bound on the bytes of the directory. A readonly opener only reports it.
        eviction: Which block goes first when the budget is full: ``"lru"`` (default),
            ``"lfu"`` or ``"fifo"`` (:mod:`heedrank.index.kv.tiers`). Used with a budget only.
        admit_after: Offers of a block before :meth:`put_many` writes it, ``>= 1``
            (default 1: every put is written).
        admit_window: Distinct keys the admission rule remembers, ``>= 1`` (default 100,000).
        compact_slack: Dead bytes allowed in the shards, as a fraction of ``disk_budget``,
            ``>= 0`` (default 0.25), before a write reclaims them. Used with a budget only.

    Raises (of the constructors):
        ValidationError: a bad ``out_dtype``, ``disk_budget``, ``admit_after``,
            ``admit_window`` or ``compact_slack``, or ``$HEEDRANK_KV_CACHE_BYTES`` is not a
            byte count.
        UnknownNameError: an unknown ``eviction`` (a :class:`ValidationError`).
    """

    def __init__(
        self, path: Path, header: KVHeader, *, lock: WriterLock, cache_bytes: int | None, out_dtype: str = "float32",
        disk_budget: int | None = None, eviction: str = "lru", admit_after: int = 1, admit_window: int = 100_000,
        compact_slack: float = 0.25,
    ) -> None:
        try:
            codec = codec_for(header)
            cache = RamCache(codec, cache_bytes=cache_bytes, out_dtype=out_dtype)
            manifest = Manifest(path, header, codec, invalidate=cache.invalidate)
            budget = Budget(manifest, disk_budget=disk_budget, eviction=eviction, admit_after=admit_after,
                            admit_window=admit_window, compact_slack=compact_slack, readonly=lock.readonly)
        except BaseException:
            lock.release()
            raise
        self.out_dtype = out_dtype
        self.path = path
        self.header = header
        self.codec = codec
        """The payload layout of :attr:`header`'s dtype (:mod:`heedrank.index.kv.codec`)."""
        self.readonly = lock.readonly
        self._lock = lock  # the writer lock: flock, in-process mutex, readonly/closed state
        self._cache = cache
        self.manifest = manifest
        """The committed state: manifest, shards, live index (:class:`heedrank.index.kv.manifest.Manifest`)."""
        self.budget = budget
        """The disk budget, eviction policy and admission rule (:class:`heedrank.index.kv.budget.Budget`)."""

    @property
    def disk_budget(self) -> int | None:
        """Bytes of live blocks allowed on disk (``None``: unbounded)."""
        return self.budget.disk_budget

    @property
    def eviction(self) -> str:
        """The eviction policy's name (``"lru"``, ``"lfu"``, ``"fifo"``)."""
        return self.budget.eviction

    @property
    def compact_slack(self) -> float:
        """Dead bytes allowed in the shards, as a fraction of :attr:`disk_budget`."""
        return self.budget.compact_slack

    # ---- constructors

    @classmethod
    def create(
        cls, path: str | os.PathLike[str], header: KVHeader, *, cache_bytes: int | None = None, out_dtype: str = "float32",
        disk_budget: int | None = None, eviction: str = "lru", admit_after: int = 1, admit_window: int = 100_000,
        compact_slack: float = 0.25,
    ) -> KVStore:
        """Create an empty store at ``path`` (a new or empty directory). The keywords are
        the class's (see :class:`KVStore`).

        Raises:
            KVStoreError: ``path`` exists and is not empty, or cannot be written.
            ValidationError: a bad keyword.
        """
        path = Path(path).expanduser().absolute()
        make_store_dir(path)
        store = cls(
            path, header, lock=WriterLock(path, readonly=False), cache_bytes=cache_bytes, out_dtype=out_dtype,
            disk_budget=disk_budget, eviction=eviction, admit_after=admit_after, admit_window=admit_window,
            compact_slack=compact_slack,
        )
        try:
            store.manifest.create()
        except OSError as exc:
            store.close()
            raise io_error("writing the header", path, exc) from exc
        logger.info("created KV store at %s (%s, layers 0..%d, block %d tokens)", path, header.dtype, header.layer, header.max_doc_tokens)
        return store

    @classmethod
    def open(
        cls, path: str | os.PathLike[str], expected_header: KVHeader, *, readonly: bool = False,
        cache_bytes: int | None = None, out_dtype: str = "float32", disk_budget: int | None = None,
        eviction: str = "lru", admit_after: int = 1, admit_window: int = 100_000, compact_slack: float = 0.25,
    ) -> KVStore:
        """Open an existing store, checking it was built for ``expected_header``. The keywords
        are the class's (see :class:`KVStore`).

        A writable open also removes uncommitted files (shards of a writer that died, tmp
        files) and, with a ``disk_budget`` smaller than what the store holds, evicts down to
        it (the oldest shards' blocks first: there are no access statistics yet) and reclaims
        the dead bytes (:meth:`enforce_budget`; an I/O error there is logged, not raised:
        the next write tries again).

        Raises:
            KVStoreMismatchError: the stored header differs (the message names the fields and
                the rebuild command).
            KVStoreError: no store at ``path``, damaged header/manifest, or another process
                holds the writer lock.
            ValidationError: a bad keyword.
        """
        path = Path(path).expanduser().absolute()
        stored = read_header(path, expected_header)
        store = cls(
            path, stored, lock=WriterLock(path, readonly=readonly), cache_bytes=cache_bytes, out_dtype=out_dtype,
            disk_budget=disk_budget, eviction=eviction, admit_after=admit_after, admit_window=admit_window,
            compact_slack=compact_slack,
        )
        try:
            store._load()
            if not readonly:
                store.manifest.remove_orphans()
        except BaseException:
            store.close()
            raise
        if store.budget.bounded:
            try:
                store.enforce_budget()
            except KVStoreError as exc:
                logger.warning("KV store %s: could not shrink to its disk budget at open (%s); the next write tries again", path, exc)
        return store

    @classmethod
    def open_or_create(cls, path: str | os.PathLike[str], header: KVHeader, **kwargs: Any) -> KVStore:
        """:meth:`open` when ``path`` holds a store, else :meth:`create` (writable)."""
        p = Path(path).expanduser()
        if (p / HEADER_FILE).is_file():
            return cls.open(p, header, **kwargs)
        kwargs.pop("readonly", None)
        return cls.create(p, header, **kwargs)

    def close(self) -> None:
        """Release the mmaps, the RAM cache and the writer lock. Idempotent."""
        if self._lock.closed:
            return
        self._lock.closed = True  # writes are refused from now on
        self.manifest.close()
        self._cache.clear()
        self._lock.release()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _load(self) -> None:
        index = self.manifest.load()
        self._cache.clear()
        self.budget.seed(index)  # no access statistics survive a reopen: shard order it is

    def refresh(self) -> None:
        """Reload the committed manifest (for ``readonly`` openers; another process writes)."""
        with self._lock.mutex:
            self._load()

    # ---- reads

    def get_many(self, keys: Iterable[BlockKey]) -> tuple[dict[BlockKey, tuple[np.ndarray, np.ndarray]], list[BlockKey]]:
        """Keys/values of the stored blocks among ``keys``.

        Returns:
            ``(found, missing)``: ``found`` maps a block key to read-only ``(keys, values)``,
            each ``(n_layers, kv_heads, T, head_dim)`` float32 (float16 with ``out_dtype``), in
            request order; ``missing`` lists the others (never stored, deleted, or found
            corrupt now: these are dropped from the index with a warning so that a rebuild
            recomputes them), in request order. Duplicate keys are answered once.
        """
        wanted = list(dict.fromkeys(keys))
        got, need = self._cache.lookup(wanted)
        if need:
            read, bad = self.manifest.read_many(need, self._cache.load)
            got.update(read)
            if bad:
                self.budget.forget(self.manifest.drop(bad))
        found = {key: got[key] for key in wanted if key in got}
        if found:
            self.budget.touch(found)
        return found, [key for key in wanted if key not in got]

    def get(self, key: BlockKey) -> tuple[np.ndarray, np.ndarray] | None:
        """One block's ``(keys, values)`` (see :meth:`get_many`), or ``None``."""
        found, _ = self.get_many([key])
        return found.get(key)

    def contains(self, key: BlockKey) -> bool:
        """Whether block ``key`` is stored (its checksum is checked on read, not here)."""
        return self.manifest.contains(key)

    __contains__ = contains

    def __len__(self) -> int:
        return len(self.manifest)

    def keys(self) -> list[BlockKey]:
        """Live block keys, in no particular order."""
        return self.manifest.keys()

    def tokens(self, key: BlockKey) -> int | None:
        """``T`` of a stored block, or ``None``."""
        loc = self.manifest.get(key)
        return None if loc is None else loc.tokens

    # ---- writes

    def check_writable(self) -> None:
        """Raises KVStoreError when the store is closed or was opened readonly."""
        self._lock.check()

    def writing(self) -> AbstractContextManager[None]:
        """Hold the store's writer lock (puts, deletes, compaction, adoption and evictions run
        one at a time), checking that the store is writable before and after waiting for it.

        Raises:
            KVStoreError: a readonly or closed store.
        """
        return self._lock.hold()

    def enforce_budget(self) -> int:
        """Evict blocks (in the policy's order) until the live ones fit in ``disk_budget``,
        in one manifest commit, then reclaim dead bytes if they exceed the slack. A no-op
        without a budget (or readonly). :meth:`put_many` keeps the budget by itself; this is
        for a store opened with a smaller budget than it holds (the writable open calls it)
        and after :meth:`adopt` (:meth:`heedrank.index.kv.budget.Budget.enforce`).

        Returns:
            Blocks evicted.

        Raises:
            KVStoreError: I/O error (nothing evicted) or a closed store.
        """
        if not self.budget.bounded:
            return 0
        with self.writing():
            return self.budget.enforce()

    def put_many(self, items: Mapping[BlockKey, tuple[Any, Any]], *, admit: bool = True) -> int:
        """Store blocks as ONE new shard, committed atomically (all or none), together with
        the eviction of the blocks that make room for them when the store has a
        ``disk_budget``; then, with a budget, reclaim dead bytes past the slack (see the
        module docstring).

        Args:
            items: ``{key: (keys, values)}``, each float ``(n_layers, kv_heads, T, head_dim)``
                (float16/float32/...; converted to the store's dtype). A stored key is replaced.
                Every array is checked, admitted or not.
            admit: Apply the admission rule (``admit_after``). ``False`` (an explicit fill or
                prebuild) writes every block, still within the budget.

        Returns:
            Blocks written: the admitted ones that fit in the budget (the others are not
            written, and not an error: see :meth:`stats`).

        Raises:
            ValidationError: a bad key or array (nothing written).
            KVStoreError: disk full or another I/O error (nothing committed, partial files
                removed, nothing evicted), or a readonly/closed store. A failed reclaim after
                the commit is only logged.
        """
        self.check_writable()
        encoded: list[Encoded] = []
        for key, (keys, values) in items.items():
            if not isinstance(key, str) or not key:
                raise ValidationError(f"block keys must be non-empty strings, got {key!r}")
            T, parts = self.codec.encode(key, keys, values)
            encoded.append((key, T, parts))
        if not encoded:
            return 0
        with self.writing():
            return writes.put(self.manifest, self.budget, encoded, admit=admit)

    def delete(self, keys: Iterable[BlockKey]) -> int:
        """Delete blocks (tombstones, committed atomically; bytes come back on :meth:`compact`,
        or at once past the slack with a ``disk_budget``).

        Returns:
            Blocks that were stored and are now deleted.

        Raises:
            KVStoreError: I/O error (nothing deleted) or a readonly/closed store.
        """
        with self.writing():
            return writes.delete(self.manifest, self.budget, keys)

    # ---- maintenance (heedrank.index.kv.maintenance)

    def verify(self, keys: Iterable[BlockKey] | None = None, *, show_progress: bool = False) -> list[BlockKey]:
        """Check the crc32 of stored blocks (all by default) and drop the bad ones
        (:func:`heedrank.index.kv.maintenance.verify`). Returns the dropped keys."""
        return maintenance.verify(self, keys, show_progress=show_progress)

    def compact(self, *, shard_max_bytes: int = DEFAULT_SHARD_MAX_BYTES, show_progress: bool = False) -> CompactReport:
        """Rewrite the live blocks into shards of about ``shard_max_bytes`` bytes and remove
        the old ones (:func:`heedrank.index.kv.maintenance.compact`)."""
        return maintenance.compact(self, shard_max_bytes=shard_max_bytes, show_progress=show_progress)

    def adopt(self, source: str | os.PathLike[str], *, verify: bool = False, remove: bool = True) -> int:
        """Commit the blocks of another store directory built for the same header (a Ray
        actor's part of a distributed build) in one manifest commit, without rewriting their
        bytes (:func:`heedrank.index.kv.maintenance.adopt`). Returns the blocks adopted."""
        return maintenance.adopt(self, source, verify=verify, remove=remove)

    def parts_dir(self) -> Path:
        """``<store>/parts``: where the actors of a distributed build write their own stores
        (``part-00000``, ...) before :meth:`adopt_parts` commits them into this one."""
        return self.path / PARTS_DIR

    def adopt_parts(self, *, verify: bool = False, show_progress: bool = False) -> int:
        """:meth:`adopt` every part store under :meth:`parts_dir` and remove them
        (:func:`heedrank.index.kv.maintenance.adopt_parts`). Returns the blocks adopted."""
        return maintenance.adopt_parts(self, verify=verify, show_progress=show_progress)

    # ---- stats

    def budget_bytes(self) -> int:
        """Bytes the disk budget counts now: every live block's payload rounded up to its
        64-byte alignment. O(1) with a budget (the eviction policy keeps the sum), a pass over
        the index without one; unlike :meth:`stats`, no directory listing."""
        return self.budget.live_bytes()

    def stats(self) -> KVStoreStats:
        """Blocks, shards, bytes on disk (whole directory), live payload bytes, cache counters,
        the disk budget and the eviction / admission counters since open."""
        blocks, live, shards, tombstones, dropped = self.manifest.counts()
        budget = self.budget
        return KVStoreStats(
            blocks, shards, self.manifest.dir_bytes(), live, tombstones, dropped, self._cache.stats(),
            disk_budget=budget.disk_budget, evictions=budget.evictions, not_admitted=budget.not_admitted,
            over_budget=budget.over_budget,
        )

    def cache_stats(self) -> CacheStats:
        """The RAM LRU's counters (hits, misses, evictions, bytes) for /metrics."""
        return self._cache.stats()

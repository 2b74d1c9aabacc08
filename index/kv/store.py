"""The document KV store: a persistent, append-only, checksummed store of blocks.

With cached BlockRank (method ``blockrank-cached``) a candidate block depends only on the
fixed instruction (block 0) and the document itself (docs/results/store.md, "Exactness,
index time, bytes per block, int8"), so its keys and values for layers ``0..l*`` can be computed once per
distinct block at index time and reused by every query. This module is the *storage* for
them; the LM code that fills it calls :meth:`KVStore.put_many` /
:func:`heedrank.index.kv.build.build_missing` with numpy arrays.

Per block the payload is ``keys`` and ``values``, each ``(n_layers, kv_heads, T, head_dim)``
with ``n_layers = l* + 1`` and ``1 <= T <= max_doc_tokens`` (``T`` varies per block), keyed
by :data:`heedrank.blocks.BlockKey` (the hash of its token ids). The files and the commit
rule are :mod:`heedrank.index.kv.format`'s, the payload bytes its dtype's codec's
(:mod:`heedrank.index.kv.codec`); compaction, verification and the adoption of a
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
  that is asked for again; blocks not admitted are not written (``put_many`` does not count
  them; the caller keeps them in RAM). A block already stored is always rewritten, and
  ``put_many(..., admit=False)`` (an explicit fill or prebuild) skips admission, never the
  budget.
* Access statistics (last access, access count) live in memory, updated by every read hit
  (RAM-cache hits too) and put; after a reopen (or :meth:`KVStore.refresh`) they are seeded
  from the shard order: an older shard counts as an older access, every count as 1.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import numpy as np

from heedrank.blocks import BlockKey, KVHeader
from heedrank.config import KV_CACHE_BUDGET
from heedrank.errors import KVStoreError, KVStoreMismatchError, ValidationError
from heedrank.files import fsync_dir, write_all, write_atomic, write_new
from heedrank.index.kv import maintenance
from heedrank.index.kv.codec import codec_for
from heedrank.index.kv.format import (
    ALIGN,
    FORMAT_VERSION,
    HEADER_FILE,
    LOCK_FILE,
    MANIFEST_FILE,
    PARTS_DIR,
    BadEntry,
    Loc,
    header_bytes,
    io_error,
    is_orphan,
    manifest_bytes,
    new_manifest,
    read_manifest,
    read_shard_index,
    shard_index_bytes,
    shard_meta,
    shard_names,
    unlink_quiet,
)
from heedrank.index.kv.maintenance import DEFAULT_SHARD_MAX_BYTES, CompactReport
from heedrank.index.kv.tiers import Admission, EvictionPolicy, eviction_policy
from heedrank.index.rwlock import RWLock
from heedrank.lru import ByteLRU, CacheStats

logger = logging.getLogger(__name__)

__all__ = ["FORMAT_VERSION", "KVHeader", "KVStore", "KVStoreStats"]

_write = write_all
"""The one writer of a store's bytes (shards, shard indexes, manifest, header): ``_write(fd, data)``.
Looked up at each call, so a test can make it fail like a full disk."""


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 24 else text[:20] + "...'"


def _mismatch(path: Path, stored: KVHeader, expected: KVHeader) -> KVStoreMismatchError:
    a, b = stored.to_dict(), expected.to_dict()
    fields = stored.diff(expected)
    diffs = "; ".join(f"{k}: stored {_short(a.get(k))}, expected {_short(b.get(k))}" for k in fields)
    return KVStoreMismatchError(
        f"the document KV store at {path} was built with other parameters ({diffs}); it is not "
        f"served, as its keys/values belong to another model, adapter, prompt, layer or dtype. "
        f"Rebuild it with `heedrank index kv build --index {path.parent} --layer {expected.layer} "
        f"--dtype {expected.dtype}` and the reranker's --model and --max-doc-tokens (block length "
        f"{expected.max_doc_tokens} tokens with its markers), or delete {path}; or serve the reranker "
        f"with the store's parameters (layer {stored.layer}, dtype {stored.dtype}).",
        fields, a,
    )


def _readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


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


def _disk_size(length: int) -> int:
    """Bytes an entry of ``length`` payload bytes occupies in its shard (64-byte aligned)."""
    return length + (-length % ALIGN)


class KVStore:
    """A persistent, append-only, checksummed store of BlockRank document blocks
    (an :class:`heedrank.blocks.BlockStore`).

    Open it with :meth:`create`, :meth:`open` or :meth:`open_or_create`. One process at a
    time may open a store writable (an ``flock`` on ``LOCK``); any number may open it
    ``readonly=True`` and pick up new commits with :meth:`refresh`. Within a process all
    methods are thread-safe: reads run concurrently, writers are serialised and only block
    readers for the in-memory swap after their files are durable.

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
        self, path: Path, header: KVHeader, *, readonly: bool, cache_bytes: int | None, lock_fd: int | None,
        out_dtype: str = "float32", disk_budget: int | None = None, eviction: str = "lru", admit_after: int = 1,
        admit_window: int = 100_000, compact_slack: float = 0.25,
    ) -> None:
        try:
            if out_dtype not in ("float32", "float16"):
                raise ValidationError(f"out_dtype must be 'float32' or 'float16', got {out_dtype!r}")
            budget = KV_CACHE_BUDGET.from_env() if cache_bytes is None else int(cache_bytes)
            codec = codec_for(header)
            if disk_budget is not None and (isinstance(disk_budget, bool) or int(disk_budget) <= 0):
                raise ValidationError(f"disk_budget must be a positive number of bytes or None (unbounded), got {disk_budget!r}")
            if not compact_slack >= 0:
                raise ValidationError(f"compact_slack must be >= 0 (a fraction of disk_budget), got {compact_slack!r}")
            policy = eviction_policy(eviction)
            admission = Admission(admit_after, admit_window)
        except BaseException:
            if lock_fd is not None:
                os.close(lock_fd)
            raise
        self.out_dtype = out_dtype
        self.path = path
        self.header = header
        self.codec = codec
        """The payload layout of :attr:`header`'s dtype (:mod:`heedrank.index.kv.codec`)."""
        self.readonly = readonly
        self._lock_fd = lock_fd
        self._cache = ByteLRU(budget)
        self._rw = RWLock()  # guards _index, _manifest, _maps swaps
        self._writer = threading.Lock()  # serialises put/delete/compact/adopt
        self._map_lock = threading.Lock()  # lazy memmap opens
        self._maps: dict[int, np.memmap] = {}
        self._index: dict[BlockKey, Loc] = {}
        self._manifest: dict[str, Any] = {}
        self._next_shard = 0
        self._dropped = 0
        self._closed = False
        self.disk_budget: int | None = None if disk_budget is None else int(disk_budget)
        """Bytes of live blocks allowed on disk (``None``: unbounded)."""
        self.eviction = eviction
        self.compact_slack = float(compact_slack)
        self._policy: EvictionPolicy | None = policy if self.disk_budget is not None and not readonly else None
        self._admission = admission
        self._evictions = 0
        self._not_admitted = 0
        self._over_budget = 0

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
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise KVStoreError(f"cannot create a KV store at {path}: it exists and is not an empty directory; open it instead")
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise io_error("creating the directory", path, exc) from exc
        lock_fd = cls._acquire_lock(path)
        store = cls(
            path, header, readonly=False, cache_bytes=cache_bytes, lock_fd=lock_fd, out_dtype=out_dtype,
            disk_budget=disk_budget, eviction=eviction, admit_after=admit_after, admit_window=admit_window,
            compact_slack=compact_slack,
        )
        try:
            write_atomic(path / HEADER_FILE, header_bytes(header), write=_write)
            store._manifest = store._new_manifest([], {})
            store._commit(store._manifest)
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
        header_file = path / HEADER_FILE
        if not header_file.is_file():
            raise KVStoreError(
                f"no document KV store at {path} (no {HEADER_FILE}); build one with "
                f"`heedrank index kv build --index {path.parent} ...`"
            )
        try:
            stored = KVHeader.from_dict(json.loads(header_file.read_text()))
        except (OSError, ValueError) as exc:
            raise KVStoreError(f"unreadable KV store header {header_file}: {exc}; delete {path} and rebuild it") from exc
        if stored != expected_header:
            raise _mismatch(path, stored, expected_header)
        lock_fd = None if readonly else cls._acquire_lock(path)
        store = cls(
            path, stored, readonly=readonly, cache_bytes=cache_bytes, lock_fd=lock_fd, out_dtype=out_dtype,
            disk_budget=disk_budget, eviction=eviction, admit_after=admit_after, admit_window=admit_window,
            compact_slack=compact_slack,
        )
        try:
            store._load()
            if not readonly:
                store._remove_orphans()
        except BaseException:
            store.close()
            raise
        if store._policy is not None:
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

    @staticmethod
    def _acquire_lock(path: Path) -> int:
        fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            raise KVStoreError(
                f"the KV store at {path} is open for writing by another process (or object); "
                f"open it with readonly=True, or wait for that writer to finish"
            ) from exc
        return fd

    def close(self) -> None:
        """Release the mmaps, the RAM cache and the writer lock. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with self._rw.write():
            self._maps.clear()
            self._index = {}
        self._cache.clear()
        if self._lock_fd is not None:
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            finally:
                os.close(self._lock_fd)
                self._lock_fd = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - depends on GC
        try:
            if self._lock_fd is not None:
                os.close(self._lock_fd)
        except (OSError, AttributeError):
            return

    # ---- manifest / load

    def _new_manifest(self, shards: list[dict[str, Any]], tombstones: Mapping[str, int]) -> dict[str, Any]:
        return new_manifest(self.header, self._next_shard, shards, tombstones)

    def _commit(self, manifest: dict[str, Any]) -> None:
        """Durably replace MANIFEST.json (the commit point). Raises OSError unchanged."""
        write_atomic(self.path / MANIFEST_FILE, manifest_bytes(manifest), write=_write)

    def _write_new(self, path: Path, data: bytes) -> None:
        """Create and fsync one file of the store (a shard index). Raises OSError."""
        write_new(path, data, write=_write)

    def _load(self) -> None:
        manifest = read_manifest(self.path, self.header, self._next_shard)
        index: dict[BlockKey, Loc] = {}
        tombstones: dict[str, int] = manifest["tombstones"]
        dropped = 0
        for meta in sorted(manifest["shards"], key=lambda m: m["id"]):
            sid = meta["id"]
            entries = read_shard_index(self.path, meta)
            if entries is None:  # whole shard unusable: its blocks become misses
                for row in read_shard_index(self.path, meta, trust=True) or []:
                    index.pop(row[0], None)
                dropped += meta["entries"]
                continue
            try:
                size = (self.path / meta["bin"]).stat().st_size
            except OSError as exc:
                logger.warning("KV shard %s is missing (%s): its %d blocks will be recomputed", meta["bin"], exc, len(entries))
                size = 0
            bad = 0
            for key, offset, length, tokens, crc in entries:
                if tombstones.get(key, -1) > sid:
                    continue
                if offset + length > size or length != self.codec.nbytes(tokens) or not 1 <= tokens <= self.header.max_doc_tokens:
                    index.pop(key, None)  # never fall back to an older version
                    bad += 1
                    continue
                index[key] = Loc(sid, offset, length, tokens, crc)
            if bad:
                dropped += bad
                logger.warning(
                    "KV shard %s is truncated or damaged (%d of %d bytes): %d entries dropped, they will be recomputed",
                    meta["bin"], size, meta["bin_bytes"], bad,
                )
        with self._rw.write():
            self._manifest = manifest
            self._next_shard = max(self._next_shard, int(manifest["next_shard"]))
            self._index = index
            self._maps.clear()
            self._dropped += dropped
        self._cache.clear()
        if self._policy is not None:  # no access statistics survive a reopen: shard order it is
            ordered = sorted(index.items(), key=lambda kv: (kv[1].shard, kv[1].offset))
            self._policy.seed((key, _disk_size(loc.length)) for key, loc in ordered)

    def _remove_orphans(self) -> None:
        committed = {name for m in self._manifest["shards"] for name in (m["bin"], m["idx"])}
        for entry in os.scandir(self.path):
            if is_orphan(entry.name, committed):
                logger.warning("removing uncommitted KV store file %s (a writer stopped before committing it)", entry.path)
                unlink_quiet(Path(entry.path))

    def refresh(self) -> None:
        """Reload the committed manifest (for ``readonly`` openers; another process writes)."""
        with self._writer:
            self._load()

    # ---- reads

    def _map(self, shard: int) -> np.memmap:
        mm = self._maps.get(shard)
        if mm is not None:
            return mm
        with self._map_lock:
            mm = self._maps.get(shard)
            if mm is None:
                meta = next(m for m in self._manifest["shards"] if m["id"] == shard)
                try:
                    mm = np.memmap(self.path / meta["bin"], dtype=np.uint8, mode="r")
                except (OSError, ValueError) as exc:
                    raise BadEntry(f"cannot map shard {meta['bin']}: {exc}") from exc
                self._maps[shard] = mm
            return mm

    def _read_entry(self, loc: Loc) -> np.ndarray:
        """A uint8 view of a verified payload. Raises BadEntry."""
        mm = self._map(loc.shard)
        end = loc.offset + loc.length
        if end > len(mm):
            raise BadEntry(f"entry ends at byte {end} past the mapped shard ({len(mm)} bytes)")
        # The file may have shrunk since it was mapped; touching pages past EOF would SIGBUS.
        try:
            size = os.stat(str(mm.filename)).st_size
        except OSError:
            size = len(mm)  # unlinked (e.g. compacted by another process): the mapping stays valid
        if end > size:
            raise BadEntry(f"shard truncated to {size} bytes, entry ends at byte {end}")
        buf = mm[loc.offset : end].view(np.ndarray)  # a plain array: what is decoded from it is too
        if zlib.crc32(buf.data) != loc.crc:
            raise BadEntry("crc32 mismatch")
        return buf

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
        got: dict[BlockKey, tuple[np.ndarray, np.ndarray]] = {}
        need: list[BlockKey] = []
        for key in wanted:
            kv = self._cache.get(key)
            if kv is None:
                need.append(key)
            else:
                got[key] = kv
        bad: list[tuple[BlockKey, Loc, str]] = []
        if need:
            with self._rw.read():
                for key in need:
                    loc = self._index.get(key)
                    if loc is None:
                        continue
                    try:
                        k, v = self.codec.decode(self._read_entry(loc), loc.tokens, self.out_dtype)
                    except BadEntry as exc:
                        bad.append((key, loc, str(exc)))
                        continue
                    kv = (_readonly(k), _readonly(v))
                    got[key] = kv
                    # under the read lock: no commit can invalidate the key between read and insert
                    self._cache.put(key, kv, k.nbytes + v.nbytes)
        if bad:
            self._drop(bad)
        found = {key: got[key] for key in wanted if key in got}
        if self._policy is not None and found:
            self._policy.touch(found)
        return found, [key for key in wanted if key not in got]

    def get(self, key: BlockKey) -> tuple[np.ndarray, np.ndarray] | None:
        """One block's ``(keys, values)`` (see :meth:`get_many`), or ``None``."""
        found, _ = self.get_many([key])
        return found.get(key)

    def _drop(self, bad: Sequence[tuple[BlockKey, Loc, str]]) -> None:
        with self._rw.write():
            for key, loc, why in bad:
                if self._index.get(key) == loc:
                    del self._index[key]
                    self._forget([key])
                    self._dropped += 1
                    meta = next((m for m in self._manifest["shards"] if m["id"] == loc.shard), {"bin": loc.shard})
                    logger.warning(
                        "KV store %s: entry %r in %s is corrupt (%s); treated as missing, it will be recomputed",
                        self.path, key, meta["bin"], why,
                    )

    def contains(self, key: BlockKey) -> bool:
        """Whether block ``key`` is stored (its checksum is checked on read, not here)."""
        with self._rw.read():
            return key in self._index

    __contains__ = contains

    def __len__(self) -> int:
        with self._rw.read():
            return len(self._index)

    def keys(self) -> list[BlockKey]:
        """Live block keys, in no particular order."""
        with self._rw.read():
            return list(self._index)

    def tokens(self, key: BlockKey) -> int | None:
        """``T`` of a stored block, or ``None``."""
        with self._rw.read():
            loc = self._index.get(key)
        return None if loc is None else loc.tokens

    # ---- writes

    def _check_writable(self) -> None:
        if self._closed:
            raise KVStoreError(f"the KV store at {self.path} is closed")
        if self.readonly:
            raise KVStoreError(f"the KV store at {self.path} was opened readonly")

    def _write_shard(self, items: Iterable[tuple[BlockKey, int, Sequence[Any]]], expected: int, *,
                     progress: Any = None) -> tuple[dict[str, Any], dict[BlockKey, Loc]]:
        """Write one shard from ``(key, T, payload parts)`` and make it durable (not committed).

        Args:
            items: The entries, in order; each payload part is a bytes-like object.
            expected: How many entries ``items`` yields (checked).
            progress: Something with ``update(1)``, called per entry written.

        Returns:
            ``(manifest entry, {key: location})``.

        Raises:
            OSError: after removing the partial files.
        """
        sid = self._next_shard
        self._next_shard += 1
        bin_name, idx_name = shard_names(sid)
        bpath, ipath = self.path / bin_name, self.path / idx_name
        locs: dict[BlockKey, Loc] = {}
        rows: list[list[Any]] = []
        try:
            fd = os.open(bpath, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                offset = 0
                for key, tokens, parts in items:
                    crc, length = 0, 0
                    for part in parts:
                        crc = zlib.crc32(part, crc)
                        _write(fd, part)
                        length += part.nbytes if isinstance(part, np.ndarray) else len(part)
                    pad = -length % ALIGN
                    if pad:
                        _write(fd, b"\0" * pad)
                    locs[key] = Loc(sid, offset, length, tokens, crc)
                    rows.append([key, offset, length, tokens, crc])
                    offset += length + pad
                    if progress is not None:
                        progress.update(1)
                os.fsync(fd)
            finally:
                os.close(fd)
            if len(rows) != expected:  # pragma: no cover - internal invariant
                raise KVStoreError(f"internal error: wrote {len(rows)} entries, expected {expected}")
            idx = shard_index_bytes(self.header, sid, rows)
            self._write_new(ipath, idx)
            fsync_dir(self.path)
        except BaseException:
            unlink_quiet(bpath, ipath)
            raise
        return shard_meta(sid, offset, idx, len(rows)), locs

    def _install(self, manifest: dict[str, Any], locs: Mapping[BlockKey, Loc], evicted: Sequence[BlockKey] = ()) -> None:
        """After ``manifest`` is committed: serve it, with ``locs`` new or moved (their RAM
        copies invalidated) and ``evicted`` gone."""
        with self._rw.write():
            self._manifest = manifest
            for key in evicted:
                self._index.pop(key, None)
                self._cache.pop(key)
            self._index.update(locs)
            for key in locs:
                self._cache.pop(key)
            if self._policy is not None:
                self._policy.remove(evicted)
                self._policy.put((key, _disk_size(loc.length)) for key, loc in locs.items())
            self._evictions += len(evicted)

    # ---- the budget (see the module docstring and heedrank.index.kv.tiers)

    def _forget(self, keys: Iterable[BlockKey]) -> None:
        """Blocks no longer live (dropped as corrupt): out of the eviction bookkeeping."""
        if self._policy is not None:
            self._policy.remove(keys)

    def _eviction_rank(self) -> dict[BlockKey, int]:
        """``{key: position}`` in the eviction order (first victim 0); ``{}`` without a budget.
        Compaction writes blocks in this order, so a reopened store seeds a similar one."""
        if self._policy is None:
            return {}
        return {key: i for i, key in enumerate(self._policy.order())}

    def _admit(self, encoded: list[tuple[BlockKey, int, list[np.ndarray]]], admit: bool) -> list[tuple[BlockKey, int, list[np.ndarray]]]:
        """The blocks the admission rule lets through (all with ``admit=False`` or ``admit_after=1``;
        a block already stored always passes). Counts the others."""
        if self._admission.after <= 1:
            return encoded
        if not admit:
            self._admission.forget(key for key, _, _ in encoded)
            return encoded
        with self._rw.read():
            stored = {key for key, _, _ in encoded if key in self._index}
        kept = [e for e in encoded if e[0] in stored or self._admission.offer(e[0])]
        refused = len(encoded) - len(kept)
        if refused:
            self._not_admitted += refused
            logger.debug("KV store %s: %d of %d blocks not admitted (admit_after=%d)", self.path, refused, len(encoded),
                         self._admission.after)
        return kept

    def _make_room(self, encoded: list[tuple[BlockKey, int, list[np.ndarray]]]) -> tuple[list[tuple[BlockKey, int, list[np.ndarray]]], list[BlockKey]]:
        """With a budget: ``(blocks to write, victims to evict in the same commit)``. Blocks
        are taken in the given order while they fit in the budget by themselves; the others
        are counted and logged."""
        budget, policy = self.disk_budget, self._policy
        if budget is None or policy is None:
            return encoded, []
        kept: list[tuple[BlockKey, int, list[np.ndarray]]] = []
        room = budget
        for entry in encoded:
            size = _disk_size(self.codec.nbytes(entry[1]))
            if size <= room:
                kept.append(entry)
                room -= size
        skipped = len(encoded) - len(kept)
        if skipped:
            self._over_budget += skipped
            logger.warning(
                "KV store %s: a put of %d blocks exceeds the disk budget of %d bytes by itself; %d blocks not written",
                self.path, len(encoded), budget, skipped,
            )
        keys = {key for key, _, _ in kept}
        replaced = sum(policy.size(key) or 0 for key in keys)
        need = policy.total_bytes - replaced + (budget - room) - budget
        return kept, policy.victims(need, protect=keys)

    def _tombstone_locked(self, keys: Sequence[BlockKey], what: str) -> dict[str, Any]:
        """Commit tombstones for live ``keys`` (the writer lock held); the new manifest.
        Raises KVStoreError (nothing committed)."""
        tomb = dict(self._manifest["tombstones"])
        for key in keys:
            tomb[key] = self._next_shard
        manifest = self._new_manifest(list(self._manifest["shards"]), tomb)
        try:
            self._commit(manifest)
        except OSError as exc:
            raise io_error(what, self.path, exc) from exc
        return manifest

    def _reclaim_locked(self) -> None:
        """With a budget: when the shards' dead bytes exceed ``compact_slack * disk_budget``,
        rewrite the most-dead shards until at most half that is left (the writer lock held).
        A failure (disk full) is logged: the store stays as it was and the next write retries."""
        if self._policy is None or self.disk_budget is None:
            return
        bins = sum(int(m["bin_bytes"]) for m in self._manifest["shards"])
        slack = self.compact_slack * self.disk_budget
        if bins - self._policy.total_bytes <= slack:
            return
        try:
            maintenance.reclaim(self, int(slack / 2))
        except KVStoreError as exc:
            logger.warning("KV store %s: reclaiming dead bytes failed (%s); the next write tries again", self.path, exc)

    def _enforce_budget_locked(self) -> int:
        """Evict down to the budget and reclaim dead bytes (the writer lock held). Returns the
        blocks evicted. Raises KVStoreError when the eviction cannot be committed."""
        if self._policy is None or self.disk_budget is None:
            return 0
        victims = self._policy.victims(self._policy.total_bytes - self.disk_budget)
        if victims:
            manifest = self._tombstone_locked(victims, "committing an eviction")
            self._install(manifest, {}, victims)
            logger.info("KV store %s: evicted %d blocks to stay within its disk budget of %d bytes", self.path,
                        len(victims), self.disk_budget)
        self._reclaim_locked()
        return len(victims)

    def enforce_budget(self) -> int:
        """Evict blocks (in the policy's order) until the live ones fit in ``disk_budget``,
        in one manifest commit, then reclaim dead bytes if they exceed the slack. A no-op
        without a budget (or readonly). :meth:`put_many` keeps the budget by itself; this is
        for a store opened with a smaller budget than it holds (the writable open calls it)
        and after :meth:`adopt`.

        Returns:
            Blocks evicted.

        Raises:
            KVStoreError: I/O error (nothing evicted) or a closed store.
        """
        if self._policy is None:
            return 0
        self._check_writable()
        with self._writer:
            self._check_writable()
            return self._enforce_budget_locked()

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
        self._check_writable()
        encoded: list[tuple[BlockKey, int, list[np.ndarray]]] = []
        for key, (keys, values) in items.items():
            if not isinstance(key, str) or not key:
                raise ValidationError(f"block keys must be non-empty strings, got {key!r}")
            T, parts = self.codec.encode(key, keys, values)
            encoded.append((key, T, parts))
        if not encoded:
            return 0
        with self._writer:
            self._check_writable()
            encoded = self._admit(encoded, admit)
            encoded, evict = self._make_room(encoded)
            if not encoded:
                return 0
            bin_path = ""
            try:
                meta, locs = self._write_shard(iter(encoded), len(encoded))
                bin_path = meta["bin"]
                tomb = {k: s for k, s in self._manifest["tombstones"].items() if k not in locs}
                for key in evict:  # hides them in every shard so far, this one included
                    tomb[key] = self._next_shard
                manifest = self._new_manifest(self._manifest["shards"] + [meta], tomb)
                try:
                    self._commit(manifest)
                except BaseException:
                    unlink_quiet(self.path / meta["bin"], self.path / meta["idx"])
                    raise
            except OSError as exc:
                raise io_error(f"writing shard {bin_path or 'of ' + str(len(encoded)) + ' blocks'}", self.path, exc) from exc
            self._install(manifest, locs, evict)
            self._reclaim_locked()
        logger.debug("KV store %s: committed %s (%d blocks, %d bytes; %d evicted)", self.path, meta["bin"], meta["entries"],
                     meta["bin_bytes"], len(evict))
        return len(encoded)

    def delete(self, keys: Iterable[BlockKey]) -> int:
        """Delete blocks (tombstones, committed atomically; bytes come back on :meth:`compact`,
        or at once past the slack with a ``disk_budget``).

        Returns:
            Blocks that were stored and are now deleted.

        Raises:
            KVStoreError: I/O error (nothing deleted) or a readonly/closed store.
        """
        self._check_writable()
        with self._writer:
            with self._rw.read():
                live = [k for k in dict.fromkeys(keys) if k in self._index]
            if not live:
                return 0
            manifest = self._tombstone_locked(live, "committing a deletion")
            with self._rw.write():
                self._manifest = manifest
                for key in live:
                    self._index.pop(key, None)
                    self._cache.pop(key)
                self._forget(live)
            self._reclaim_locked()
        return len(live)

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

    def _dir_bytes(self) -> int:
        total = 0
        for entry in os.scandir(self.path):
            if entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
        return total

    def budget_bytes(self) -> int:
        """Bytes the disk budget counts now: every live block's payload rounded up to its
        64-byte alignment. O(1) with a budget (the eviction policy keeps the sum), a pass over
        the index without one; unlike :meth:`stats`, no directory listing."""
        if self._policy is not None:
            return int(self._policy.total_bytes)
        with self._rw.read():
            return sum(_disk_size(loc.length) for loc in self._index.values())

    def stats(self) -> KVStoreStats:
        """Blocks, shards, bytes on disk (whole directory), live payload bytes, cache counters,
        the disk budget and the eviction / admission counters since open."""
        with self._rw.read():
            blocks = len(self._index)
            live = sum(loc.length for loc in self._index.values())
            shards = len(self._manifest.get("shards", []))
            tombstones = len(self._manifest.get("tombstones", {}))
            dropped = self._dropped
        return KVStoreStats(
            blocks, shards, self._dir_bytes(), live, tombstones, dropped, self._cache.stats(),
            disk_budget=self.disk_budget, evictions=self._evictions, not_admitted=self._not_admitted,
            over_budget=self._over_budget,
        )

    def cache_stats(self) -> CacheStats:
        """The RAM LRU's counters (hits, misses, evictions, bytes) for /metrics."""
        return self._cache.stats()


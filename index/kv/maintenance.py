"""Upkeep of a document KV store: checksum verification, compaction, and the adoption of
the part stores a distributed build writes.

Each function works on an open, writable :class:`heedrank.index.kv.KVStore` (the store's
methods of the same names call them) under the store's writer lock, and keeps its commit
rule (:mod:`heedrank.index.kv.format`): new files are orphans until one manifest commit
lists them, so a crash at any point leaves the store as it was before or after, never in
between.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heedrank.blocks import BlockKey
from heedrank.errors import KVStoreError
from heedrank.files import fsync_dir
from heedrank.index.kv.format import (
    ALIGN,
    HEADER_FILE,
    BadEntry,
    Loc,
    io_error,
    read_shard_index,
    shard_index_bytes,
    shard_meta,
    shard_names,
    unlink_quiet,
)

if TYPE_CHECKING:  # the store calls these functions; they never import it
    from heedrank.index.kv.store import KVStore

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_SHARD_MAX_BYTES", "CompactReport", "adopt", "adopt_parts", "compact", "dead_bytes_by_shard", "reclaim", "verify"]

DEFAULT_SHARD_MAX_BYTES = 256 * 2**20
"""Payload bytes per shard that :func:`compact` writes (256 MiB)."""


@dataclass(frozen=True)
class CompactReport:
    """What :func:`compact` did. Byte counts are whole-directory sizes.

    Attributes:
        blocks: Live blocks rewritten.
        shards_before, shards_after: Committed shards before and after.
        bytes_before, bytes_after: Bytes of every file of the store directory.
        dropped_entries: Corrupt entries met and dropped (they will be recomputed).
        seconds: Wall time.
    """

    blocks: int
    shards_before: int
    shards_after: int
    bytes_before: int
    bytes_after: int
    dropped_entries: int
    seconds: float


def verify(store: KVStore, keys: Iterable[BlockKey] | None = None, *, show_progress: bool = False) -> list[BlockKey]:
    """Check the crc32 of stored blocks (all by default) and drop the bad ones (logged; they
    read as missing, so a build recomputes them).

    Cost: reads every checked byte once (~6 GB/s crc32 plus the disk).

    Returns:
        The dropped keys.
    """
    from tqdm.auto import tqdm

    with store._rw.read():
        index = store._index
        targets = list(index.items()) if keys is None else [(k, index[k]) for k in dict.fromkeys(keys) if k in index]
    bad: list[tuple[BlockKey, Loc, str]] = []
    with tqdm(total=len(targets), desc="verify kv", unit="block", disable=not show_progress) as bar:
        for key, loc in targets:
            with store._rw.read():
                if store._index.get(key) == loc:
                    try:
                        store._read_entry(loc)
                    except BadEntry as exc:
                        bad.append((key, loc, str(exc)))
            bar.update(1)
    if bad:
        store._drop(bad)
    return [key for key, _, _ in bad]


def compact(store: KVStore, *, shard_max_bytes: int = DEFAULT_SHARD_MAX_BYTES, show_progress: bool = False) -> CompactReport:
    """Rewrite the live blocks into new shards of about ``shard_max_bytes`` payload bytes,
    commit a manifest listing only those (tombstones cleared), then remove the old shards.

    A crash before the commit leaves the old store intact (the new files are orphans);
    after it, the old files are orphans. Corrupt entries met on the way are dropped.

    Raises:
        KVStoreError: disk full / I/O error (the store is unchanged) or readonly/closed.
    """
    store._check_writable()
    with store._writer:
        store._check_writable()
        return _rewrite(store, None, shard_max_bytes=shard_max_bytes, show_progress=show_progress)


def dead_bytes_by_shard(store: KVStore) -> dict[int, int]:
    """Bytes of each committed shard's ``.bin`` that no live block uses: deleted, evicted or
    replaced entries, entries dropped as corrupt, and the alignment padding of those
    (``bin_bytes`` minus the live entries' payload rounded up to :data:`ALIGN`). ``O(blocks)``."""
    with store._rw.read():
        metas = list(store._manifest["shards"])
        live: dict[int, int] = {}
        for loc in store._index.values():
            live[loc.shard] = live.get(loc.shard, 0) + loc.length + (-loc.length % ALIGN)
    return {m["id"]: max(0, int(m["bin_bytes"]) - live.get(m["id"], 0)) for m in metas}


def reclaim(store: KVStore, max_dead_bytes: int, *, shard_max_bytes: int = DEFAULT_SHARD_MAX_BYTES) -> CompactReport | None:
    """Partial compaction, with the store's writer lock HELD by the caller (a bounded store's
    :meth:`~heedrank.index.kv.KVStore.put_many` calls it): rewrite the live blocks of the
    shards with the largest share of dead bytes (:func:`dead_bytes_by_shard`), most dead
    first, until the dead bytes left in the other shards are at most ``max_dead_bytes``,
    in ONE manifest commit; then remove the rewritten shards. Shards with no live block are
    just dropped. Tombstones are kept only for keys that the untouched shards still hold.

    Cost: reads and writes the live bytes of the chosen shards once (at most the live bytes
    of the store), and parses the untouched shards' index files to prune tombstones.

    Returns:
        What was done, or ``None`` when the dead bytes are already ``<= max_dead_bytes``.

    Raises:
        KVStoreError: disk full / I/O error (nothing committed: the store is unchanged).
    """
    dead = dead_bytes_by_shard(store)
    total = sum(dead.values())
    if total <= max_dead_bytes:
        return None
    sizes = {m["id"]: max(1, int(m["bin_bytes"])) for m in store._manifest["shards"]}
    chosen: set[int] = set()
    for sid in sorted(dead, key=lambda s: (dead[s] / sizes[s], dead[s]), reverse=True):
        if total <= max_dead_bytes or dead[sid] == 0:
            break
        chosen.add(sid)
        total -= dead[sid]
    return _rewrite(store, chosen, shard_max_bytes=shard_max_bytes, show_progress=False)


def _tombstones_for(store: KVStore, kept: Sequence[dict[str, Any]]) -> dict[str, int]:
    """The tombstones still needed once only the shards ``kept`` remain of the old ones: those
    of keys one of them holds (all of them when an index file cannot be read)."""
    tomb: dict[str, int] = store._manifest["tombstones"]
    if not tomb or not kept:
        return {}
    held: set[str] = set()
    for meta in kept:
        rows = read_shard_index(store.path, meta, trust=True)
        if rows is None:  # cannot tell: keep them all (correct, just not pruned)
            return dict(tomb)
        held.update(row[0] for row in rows)
    return {key: s for key, s in tomb.items() if key in held}


def _rewrite(store: KVStore, shard_ids: set[int] | None, *, shard_max_bytes: int, show_progress: bool) -> CompactReport:
    """Rewrite the live blocks of the shards ``shard_ids`` (all: ``None``) into new shards,
    commit, remove the old ones. The writer lock is held by the caller. See :func:`compact`."""
    from tqdm.auto import tqdm

    t0 = time.perf_counter()
    bytes_before = store._dir_bytes()
    all_shards = list(store._manifest["shards"])
    old_shards = [m for m in all_shards if shard_ids is None or m["id"] in shard_ids]
    kept_shards = [m for m in all_shards if shard_ids is not None and m["id"] not in shard_ids]
    old_ids = {m["id"] for m in old_shards}
    with store._rw.read():
        live = [(key, loc) for key, loc in store._index.items() if loc.shard in old_ids]
    # eviction order first (a reopened store seeds its order from the shard order), else shard order
    rank = store._eviction_rank()
    if rank:
        live.sort(key=lambda kv: (rank.get(kv[0], -1), kv[1].shard, kv[1].offset))
    else:
        live.sort(key=lambda kv: (kv[1].shard, kv[1].offset))
    # plan new shards by payload bytes
    groups: list[list[tuple[BlockKey, Loc]]] = [[]]
    size = 0
    for key, loc in live:
        if groups[-1] and size + loc.length > shard_max_bytes:
            groups.append([])
            size = 0
        groups[-1].append((key, loc))
        size += loc.length + (-loc.length % ALIGN)
    groups = [g for g in groups if g]
    bad: list[tuple[BlockKey, Loc, str]] = []
    new_metas: list[dict[str, Any]] = []
    new_locs: dict[BlockKey, Loc] = {}

    def payloads(group: list[tuple[BlockKey, Loc]]) -> Iterator[tuple[BlockKey, int, Sequence[Any]]]:
        for key, loc in group:
            try:
                buf = store._read_entry(loc)  # old shards stay mapped: only this writer closes them
            except BadEntry as exc:
                bad.append((key, loc, str(exc)))
                bar.update(1)
                continue
            yield key, loc.tokens, [buf]

    try:
        with tqdm(total=len(live), desc="compact kv", unit="block", disable=not show_progress) as bar:
            for group in groups:
                ready = list(payloads(group))  # mmap views of verified entries: cheap
                if ready:
                    meta, locs = store._write_shard(iter(ready), len(ready), progress=bar)
                    new_metas.append(meta)
                    new_locs.update(locs)
        manifest = store._new_manifest(kept_shards + new_metas, _tombstones_for(store, kept_shards))
        store._commit(manifest)
    except BaseException as exc:  # nothing committed: remove the new shards
        unlink_quiet(*(store.path / m[k] for m in new_metas for k in ("bin", "idx")))
        if isinstance(exc, OSError):
            raise io_error("compacting", store.path, exc) from exc
        raise
    with store._rw.write():
        store._manifest = manifest
        # blocks deleted or re-put meanwhile cannot happen (writer lock held);
        # entries dropped as corrupt by readers meanwhile stay dropped
        index = {key: loc for key, loc in store._index.items() if loc.shard not in old_ids}
        index.update((key, loc) for key, loc in new_locs.items() if key in store._index)
        store._index = index
        # the store lets go of the old mappings; arrays already returned by reads are decoded
        # copies, and a mapping still referenced elsewhere stays valid after the unlink (POSIX)
        for sid in old_ids:
            store._maps.pop(sid, None)
        store._dropped += len(bad)
    store._forget([key for key, _loc, _why in bad])
    for key, _loc, why in bad:
        logger.warning("KV store %s: entry %r is corrupt (%s); dropped by compaction", store.path, key, why)
    for m in old_shards:
        unlink_quiet(store.path / m["bin"], store.path / m["idx"])
    try:
        fsync_dir(store.path)
    except OSError:  # pragma: no cover
        pass
    report = CompactReport(
        blocks=len(new_locs), shards_before=len(all_shards), shards_after=len(kept_shards) + len(new_metas),
        bytes_before=bytes_before, bytes_after=store._dir_bytes(), dropped_entries=len(bad),
        seconds=time.perf_counter() - t0,
    )
    logger.info(
        "compacted KV store %s%s: %d -> %d shards, %d -> %d bytes", store.path,
        "" if shard_ids is None else f" ({len(old_shards)} shards rewritten)",
        report.shards_before, report.shards_after, report.bytes_before, report.bytes_after,
    )
    return report


def adopt(store: KVStore, source: str | os.PathLike[str], *, verify: bool = False, remove: bool = True) -> int:
    """Commit the blocks of another store directory built for the same header (a Ray
    actor's part of a distributed build, :meth:`heedrank.engine.ray.RayEngine.build_blocks`)
    into ``store``, in ONE manifest commit, without rewriting their bytes.

    Only what ``source``'s own manifest commits is taken (its shards are fsynced before it
    lists them, and their index files are size- and crc32-checked on open), so a shard a
    writer left half-written is never adopted; every entry keeps its crc32, checked on
    each read. Each adopted shard's ``.bin`` is hard-linked (copied where the filesystem
    has no hard links) under a new shard id, with a new index file listing only its
    adopted entries. Blocks ``store`` already holds are skipped, so adopting a source
    twice (a crash after the commit, before ``source`` was removed) adds nothing.

    Crash safety: before the commit the new files are orphans (removed at the next
    writable open) and ``source`` is intact, so a rerun adopts it again; after it,
    ``source`` is redundant.

    With a ``disk_budget``, ``store`` then evicts down to it (the adopted blocks count as
    the most recent puts) and reclaims dead bytes (:meth:`~heedrank.index.kv.KVStore.enforce_budget`).

    Args:
        store: The writable store that adopts.
        source: A store directory (its ``header.json`` must equal ``store``'s header).
        verify: crc32-check every entry of ``source`` first (reads all its bytes once);
            a bad entry is not adopted (it will be recomputed).
        remove: Delete ``source`` after the commit.

    Returns:
        Blocks adopted.

    Raises:
        KVStoreMismatchError: ``source`` was built for another header.
        KVStoreError: ``source`` is missing, damaged or written by another process (nothing
            adopted), a disk or I/O error (nothing committed), or ``store`` is readonly/closed.
    """
    store._check_writable()
    src_path = Path(source).expanduser().absolute()
    with store._writer:
        store._check_writable()
        src = type(store).open(src_path, store.header, cache_bytes=0)  # writable: its lock, its orphans removed
        new_metas: list[dict[str, Any]] = []
        locs: dict[BlockKey, Loc] = {}
        try:
            if verify:
                src.verify()
            with src._rw.read():
                entries = list(src._index.items())
                src_metas = {m["id"]: m for m in src._manifest["shards"]}
            with store._rw.read():
                by_shard: dict[int, list[tuple[BlockKey, Loc]]] = {}
                for key, loc in entries:
                    if key not in store._index:
                        by_shard.setdefault(loc.shard, []).append((key, loc))
            try:
                for sid in sorted(by_shard):
                    meta, shard_locs = _link_shard(store, src.path / src_metas[sid]["bin"], by_shard[sid])
                    new_metas.append(meta)
                    locs.update(shard_locs)
                if new_metas:
                    tomb = {k: s for k, s in store._manifest["tombstones"].items() if k not in locs}
                    manifest = store._new_manifest(store._manifest["shards"] + new_metas, tomb)
                    store._commit(manifest)
            except BaseException as exc:  # nothing committed: drop the new files
                unlink_quiet(*(store.path / m[k] for m in new_metas for k in ("bin", "idx")))
                if isinstance(exc, OSError):
                    raise io_error(f"adopting {src_path}", store.path, exc) from exc
                raise
            if new_metas:
                store._install(manifest, locs)
                try:
                    store._enforce_budget_locked()  # a bounded store evicts what does not fit
                except KVStoreError as exc:
                    logger.warning("KV store %s: could not evict down to its disk budget after adopting %s (%s)",
                                   store.path, src_path, exc)
        finally:
            src.close()
    if remove:
        shutil.rmtree(src_path, ignore_errors=True)
    logger.info("KV store %s: adopted %d blocks in %d shards from %s", store.path, len(locs), len(new_metas), src_path)
    return len(locs)


def _link_shard(store: KVStore, bin_src: Path, rows: Sequence[tuple[BlockKey, Loc]]) -> tuple[dict[str, Any], dict[BlockKey, Loc]]:
    """Hard-link (or copy) ``bin_src`` into ``store`` as a new shard, write its index for
    ``rows`` and make both durable (not committed). Raises OSError after removing what it wrote."""
    sid = store._next_shard
    store._next_shard += 1
    bin_name, idx_name = shard_names(sid)
    bpath, ipath = store.path / bin_name, store.path / idx_name
    ordered = sorted(rows, key=lambda r: r[1].offset)
    try:
        try:
            os.link(bin_src, bpath)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
            shutil.copyfile(bin_src, bpath)
            fd = os.open(bpath, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        size = bpath.stat().st_size
        table = [[key, loc.offset, loc.length, loc.tokens, loc.crc] for key, loc in ordered]
        idx = shard_index_bytes(store.header, sid, table)
        store._write_new(ipath, idx)
        fsync_dir(store.path)
    except BaseException:
        unlink_quiet(bpath, ipath)
        raise
    return shard_meta(sid, size, idx, len(table)), {key: loc._replace(shard=sid) for key, loc in ordered}


def adopt_parts(store: KVStore, *, verify: bool = False, show_progress: bool = False) -> int:
    """:func:`adopt` every part store under ``store.parts_dir()`` (what an interrupted
    distributed build left: what its actors committed is kept, the rest recomputed) and
    remove them. A part with no header (its writer died while creating it) is removed; a
    part another process still writes (an actor of a build being torn down) is left for
    a later build, with a warning.

    Returns:
        Blocks adopted.

    Raises:
        See :func:`adopt`.
    """
    from tqdm.auto import tqdm

    root = store.parts_dir()
    if not root.is_dir():
        return 0
    parts = sorted(p for p in root.iterdir() if p.is_dir())
    adopted = 0
    for part in tqdm(parts, desc="adopt kv parts", unit="part", disable=not show_progress or not parts):
        try:
            os.close(store._acquire_lock(part))  # released at once: adopt() takes it again
        except (KVStoreError, OSError) as exc:
            logger.warning("KV store part %s is not adopted now (%s); a later build adopts it", part, exc)
            continue
        if (part / HEADER_FILE).is_file():
            adopted += store.adopt(part, verify=verify)
        else:
            shutil.rmtree(part, ignore_errors=True)
    if adopted:
        logger.info("KV store %s: adopted %d blocks from %d parts of an earlier distributed build", store.path,
                    adopted, len(parts))
    return adopted

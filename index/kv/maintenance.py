"""Upkeep of a document KV store: checksum verification, compaction, and the adoption of
the part stores a distributed build writes.

Each function works on an open, writable :class:`heedrank.index.kv.KVStore` (the store's
methods of the same names call them) under the store's writer lock, through the public
methods of its :class:`heedrank.index.kv.manifest.Manifest` (the commit point) and
:class:`heedrank.index.kv.budget.Budget` (the eviction bookkeeping), and keeps its commit
rule (:mod:`heedrank.index.kv.format`): new files are orphans until one manifest commit
lists them, so a crash at any point leaves the store as it was before or after, never in
between.
"""

from __future__ import annotations

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
from heedrank.index.kv.format import HEADER_FILE, BadEntry, Loc, acquire_lock, disk_size, io_error, read_shard_index
from heedrank.progress import Progress, track

if TYPE_CHECKING:  # the store and its budget call these functions; they never import them
    from heedrank.index.kv.budget import Budget
    from heedrank.index.kv.manifest import Bad, Manifest
    from heedrank.index.kv.store import KVStore

logger = logging.getLogger(__name__)

__all__ = ["DEFAULT_SHARD_MAX_BYTES", "CompactReport", "adopt", "adopt_parts", "compact", "reclaim", "verify"]

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
    manifest = store.manifest
    targets = manifest.items(keys=keys)
    bad: list[Bad] = []
    with Progress(total=len(targets), desc="verify kv", unit="block", show_progress=show_progress, log=logger) as bar:
        for key, loc in targets:
            why = manifest.check(key, loc)
            if why is not None:
                bad.append((key, loc, why))
            bar.update(1)
    if bad:
        store.budget.forget(manifest.drop(bad))
    return [key for key, _, _ in bad]


def compact(store: KVStore, *, shard_max_bytes: int = DEFAULT_SHARD_MAX_BYTES, show_progress: bool = False) -> CompactReport:
    """Rewrite the live blocks into new shards of about ``shard_max_bytes`` payload bytes,
    commit a manifest listing only those (tombstones cleared), then remove the old shards.

    A crash before the commit leaves the old store intact (the new files are orphans);
    after it, the old files are orphans. Corrupt entries met on the way are dropped.

    Raises:
        KVStoreError: disk full / I/O error (the store is unchanged) or readonly/closed.
    """
    with store.writing():
        return _rewrite(store.manifest, store.budget, None, shard_max_bytes=shard_max_bytes, show_progress=show_progress)


def reclaim(manifest: Manifest, budget: Budget, max_dead_bytes: int, *,
            shard_max_bytes: int = DEFAULT_SHARD_MAX_BYTES) -> CompactReport | None:
    """Partial compaction, with the store's writer lock HELD by the caller (a bounded store's
    :meth:`heedrank.index.kv.budget.Budget.reclaim` calls it): rewrite the live blocks of the
    shards with the largest share of dead bytes (:meth:`Manifest.dead_bytes_by_shard`), most
    dead first, until the dead bytes left in the other shards are at most ``max_dead_bytes``,
    in ONE manifest commit; then remove the rewritten shards. Shards with no live block are
    just dropped. Tombstones are kept only for keys that the untouched shards still hold.

    Cost: reads and writes the live bytes of the chosen shards once (at most the live bytes
    of the store), and parses the untouched shards' index files to prune tombstones.

    Returns:
        What was done, or ``None`` when the dead bytes are already ``<= max_dead_bytes``.

    Raises:
        KVStoreError: disk full / I/O error (nothing committed: the store is unchanged).
    """
    dead = manifest.dead_bytes_by_shard()
    total = sum(dead.values())
    if total <= max_dead_bytes:
        return None
    sizes = {m["id"]: max(1, int(m["bin_bytes"])) for m in manifest.shards}
    chosen: set[int] = set()
    for sid in sorted(dead, key=lambda s: (dead[s] / sizes[s], dead[s]), reverse=True):
        if total <= max_dead_bytes or dead[sid] == 0:
            break
        chosen.add(sid)
        total -= dead[sid]
    return _rewrite(manifest, budget, chosen, shard_max_bytes=shard_max_bytes, show_progress=False)


def _tombstones_for(manifest: Manifest, kept: Sequence[dict[str, Any]]) -> dict[str, int]:
    """The tombstones still needed once only the shards ``kept`` remain of the old ones: those
    of keys one of them holds (all of them when an index file cannot be read)."""
    tomb = manifest.tombstones
    if not tomb or not kept:
        return {}
    held: set[str] = set()
    for meta in kept:
        rows = read_shard_index(manifest.path, meta, trust=True)
        if rows is None:  # cannot tell: keep them all (correct, just not pruned)
            return tomb
        held.update(row[0] for row in rows)
    return {key: s for key, s in tomb.items() if key in held}


def _rewrite(manifest: Manifest, budget: Budget, shard_ids: set[int] | None, *, shard_max_bytes: int,
             show_progress: bool) -> CompactReport:
    """Rewrite the live blocks of the shards ``shard_ids`` (all: ``None``) into new shards,
    commit, remove the old ones. The writer lock is held by the caller. See :func:`compact`."""
    t0 = time.perf_counter()
    bytes_before = manifest.dir_bytes()
    all_shards = manifest.shards
    old_shards = [m for m in all_shards if shard_ids is None or m["id"] in shard_ids]
    kept_shards = [m for m in all_shards if shard_ids is not None and m["id"] not in shard_ids]
    old_ids = {m["id"] for m in old_shards}
    live = manifest.items(shards=old_ids)
    # eviction order first (a reopened store seeds its order from the shard order), else shard order
    rank = budget.eviction_rank()
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
        size += disk_size(loc.length)
    groups = [g for g in groups if g]
    bad: list[Bad] = []
    new_metas: list[dict[str, Any]] = []
    new_locs: dict[BlockKey, Loc] = {}

    def payloads(group: list[tuple[BlockKey, Loc]]) -> Iterator[tuple[BlockKey, int, Sequence[Any]]]:
        for key, loc in group:
            try:
                buf = manifest.read_entry(loc)  # old shards stay mapped: only this writer closes them
            except BadEntry as exc:
                bad.append((key, loc, str(exc)))
                bar.update(1)
                continue
            yield key, loc.tokens, [buf]

    try:
        with Progress(total=len(live), desc="compact kv", unit="block", show_progress=show_progress, log=logger) as bar:
            for group in groups:
                ready = list(payloads(group))  # mmap views of verified entries: cheap
                if ready:
                    meta, locs = manifest.write_shard(iter(ready), len(ready), progress=bar.update)
                    new_metas.append(meta)
                    new_locs.update(locs)
        committed = manifest.new(kept_shards + new_metas, _tombstones_for(manifest, kept_shards))
        manifest.commit(committed)
    except BaseException as exc:  # nothing committed: remove the new shards
        manifest.unlink(new_metas)
        if isinstance(exc, OSError):
            raise io_error("compacting", manifest.path, exc) from exc
        raise
    # blocks deleted or re-put meanwhile cannot happen (writer lock held)
    manifest.swap_shards(committed, old_ids, new_locs, dropped=len(bad))
    budget.forget([key for key, _loc, _why in bad])
    for key, _loc, why in bad:
        logger.warning("KV store %s: entry %r is corrupt (%s); dropped by compaction", manifest.path, key, why)
    manifest.unlink(old_shards)
    try:
        fsync_dir(manifest.path)
    except OSError:  # pragma: no cover
        pass
    report = CompactReport(
        blocks=len(new_locs), shards_before=len(all_shards), shards_after=len(kept_shards) + len(new_metas),
        bytes_before=bytes_before, bytes_after=manifest.dir_bytes(), dropped_entries=len(bad),
        seconds=time.perf_counter() - t0,
    )
    logger.info(
        "compacted KV store %s%s: %d -> %d shards, %d -> %d bytes", manifest.path,
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
    src_path = Path(source).expanduser().absolute()
    manifest = store.manifest
    with store.writing():
        src = type(store).open(src_path, store.header, cache_bytes=0)  # writable: its lock, its orphans removed
        new_metas: list[dict[str, Any]] = []
        locs: dict[BlockKey, Loc] = {}
        try:
            if verify:
                src.verify()
            entries = src.manifest.items()
            src_metas = {m["id"]: m for m in src.manifest.shards}
            stored = set(manifest.keys())
            by_shard: dict[int, list[tuple[BlockKey, Loc]]] = {}
            for key, loc in entries:
                if key not in stored:
                    by_shard.setdefault(loc.shard, []).append((key, loc))
            try:
                for sid in sorted(by_shard):
                    meta, shard_locs = manifest.link_shard(src.path / src_metas[sid]["bin"], by_shard[sid])
                    new_metas.append(meta)
                    locs.update(shard_locs)
                if new_metas:
                    committed = manifest.commit_shards(new_metas, locs)
            except BaseException as exc:  # nothing committed: drop the new files
                manifest.unlink(new_metas)
                if isinstance(exc, OSError):
                    raise io_error(f"adopting {src_path}", store.path, exc) from exc
                raise
            if new_metas:
                store.budget.install(committed, locs)
                try:
                    store.budget.enforce()  # a bounded store evicts what does not fit
                except KVStoreError as exc:
                    logger.warning("KV store %s: could not evict down to its disk budget after adopting %s (%s)",
                                   store.path, src_path, exc)
        finally:
            src.close()
    if remove:
        shutil.rmtree(src_path, ignore_errors=True)
    logger.info("KV store %s: adopted %d blocks in %d shards from %s", store.path, len(locs), len(new_metas), src_path)
    return len(locs)


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
    root = store.parts_dir()
    if not root.is_dir():
        return 0
    parts = sorted(p for p in root.iterdir() if p.is_dir())
    adopted = 0
    for part in track(parts, total=len(parts), desc="adopt kv parts", unit="part", show_progress=show_progress and bool(parts),
                      log=logger):
        try:
            os.close(acquire_lock(part))  # released at once: adopt() takes it again
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

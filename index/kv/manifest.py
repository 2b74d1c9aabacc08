"""The committed state of a document KV store and its in-memory view: the commit point.

:class:`Manifest` owns what :mod:`heedrank.index.kv.format` describes on disk (the
``MANIFEST.json`` that commits shards and tombstones, the shard files and their index
files) and what a process serves from it: the live index ``{block key: Loc}``, the
memory-mapped shards, and the count of entries dropped as corrupt. Every write of a store
goes through it: a shard is written and fsynced (:meth:`Manifest.write_shard`,
:meth:`Manifest.link_shard`: the files are :mod:`heedrank.index.kv.shards`'s, the shard ids
the manifest's), a new manifest listing it is committed (:meth:`Manifest.commit`,
:meth:`Manifest.commit_shards`: the one atomic step), and only then served
(:meth:`Manifest.install`, :meth:`Manifest.swap_shards`). So a crash at any point leaves the
store as it was before or after a write, never in between; files not yet committed are
orphans that :meth:`Manifest.remove_orphans` deletes at the next writable open.

It knows nothing of the RAM cache (it calls an ``invalidate`` hook for keys whose bytes
changed), of the disk budget (:mod:`heedrank.index.kv.budget`) or of the writer lock
(:class:`heedrank.index.kv.KVStore` holds it around every write).
"""

from __future__ import annotations

import logging
import os
import threading
import zlib
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from heedrank.blocks import BlockKey, KVHeader
from heedrank.files import write_all, write_atomic
from heedrank.index.kv.codec import Codec
from heedrank.index.kv.format import (
    HEADER_FILE,
    MANIFEST_FILE,
    BadEntry,
    Loc,
    disk_size,
    header_bytes,
    io_error,
    is_orphan,
    manifest_bytes,
    new_manifest,
    read_manifest,
    unlink_quiet,
)
from heedrank.index.kv.shards import link_shard, scan_shards, write_shard
from heedrank.index.rwlock import RWLock

logger = logging.getLogger(__name__)

__all__ = ["Bad", "Manifest"]

_write = write_all
"""The one writer of a store's bytes (shards, shard indexes, manifest, header): ``_write(fd, data)``.
Looked up at each call, so a test can make it fail like a full disk."""

Bad = tuple[BlockKey, Loc, str]
"""An entry found corrupt: ``(key, where it was, why)``."""

T = TypeVar("T")


class Manifest:
    """The committed manifest of one store directory, its live index and its shard mappings.

    Thread safety: :attr:`lock` (a readers-writer lock) guards the index, the committed
    manifest and the mappings; the methods take it themselves. Writes (``write_shard``,
    ``link_shard``, ``commit``, ``tombstone``) must be serialised by the caller (the store's
    writer lock).

    Args:
        path: The store directory.
        header: What its blocks were computed with (file fingerprints).
        codec: The payload layout of ``header``'s dtype (entry sizes, checked at load).
        invalidate: Called, under the write lock, with the keys whose stored bytes changed
            or went away (the store drops their RAM copies).
    """

    def __init__(self, path: Path, header: KVHeader, codec: Codec, *,
                 invalidate: Callable[[Iterable[BlockKey]], None] | None = None) -> None:
        self.path = path
        self.header = header
        self.codec = codec
        self.lock = RWLock()
        """Guards the index, the committed manifest and the mappings (not re-entrant)."""
        self._invalidate = invalidate
        self._map_lock = threading.Lock()  # lazy memmap opens
        self._maps: dict[int, np.memmap] = {}
        self._index: dict[BlockKey, Loc] = {}
        self._committed: dict[str, Any] = {}
        self._next_shard = 0
        self._dropped = 0

    # ---- the committed manifest

    @property
    def shards(self) -> list[dict[str, Any]]:
        """The committed shard metas (:func:`heedrank.index.kv.format.shard_meta`), a new list."""
        return list(self._committed.get("shards", []))

    @property
    def tombstones(self) -> dict[str, int]:
        """The committed tombstones ``{key: shard id}``, a new dict."""
        return dict(self._committed.get("tombstones", {}))

    @property
    def next_shard(self) -> int:
        """The id the next shard written gets (a tombstone ``{key: next_shard}`` hides ``key``
        in every shard written so far)."""
        return self._next_shard

    @property
    def dropped(self) -> int:
        """Entries found corrupt or truncated since open (served as misses)."""
        return self._dropped

    def new(self, shards: list[dict[str, Any]], tombstones: Mapping[str, int]) -> dict[str, Any]:
        """A manifest listing ``shards`` and ``tombstones`` (not committed)."""
        return new_manifest(self.header, self._next_shard, shards, tombstones)

    def commit(self, manifest: dict[str, Any]) -> None:
        """Durably replace ``MANIFEST.json`` (the commit point). Raises OSError unchanged."""
        write_atomic(self.path / MANIFEST_FILE, manifest_bytes(manifest), write=_write)

    def create(self) -> None:
        """Write ``header.json`` and commit an empty manifest (a new store). Raises OSError."""
        write_atomic(self.path / HEADER_FILE, header_bytes(self.header), write=_write)
        manifest = self.new([], {})
        self.commit(manifest)
        self._committed = manifest

    def tombstone(self, keys: Sequence[BlockKey], what: str) -> dict[str, Any]:
        """Commit tombstones for live ``keys`` (not served yet: :meth:`install` it with
        ``removed=keys``); ``what`` names the step in an error. Returns the new manifest.

        Raises:
            KVStoreError: an I/O error (nothing committed).
        """
        tomb = self.tombstones
        for key in keys:
            tomb[key] = self._next_shard
        manifest = self.new(self.shards, tomb)
        try:
            self.commit(manifest)
        except OSError as exc:
            raise io_error(what, self.path, exc) from exc
        return manifest

    def commit_shards(self, metas: Sequence[dict[str, Any]], locs: Mapping[BlockKey, Loc],
                      evict: Iterable[BlockKey] = ()) -> dict[str, Any]:
        """Commit the shards ``metas`` just written or linked (holding ``locs``: those keys
        lose their tombstones) with tombstones for ``evict`` that hide those blocks in every
        shard so far, ``metas`` included. Not served yet: :meth:`install` it.

        Returns:
            The new manifest.

        Raises:
            OSError: unchanged, after removing the files of ``metas`` (nothing committed).
        """
        tomb = {k: s for k, s in self.tombstones.items() if k not in locs}
        tomb.update(dict.fromkeys(evict, self._next_shard))
        manifest = self.new(self.shards + list(metas), tomb)
        try:
            self.commit(manifest)
        except BaseException:
            self.unlink(metas)
            raise
        return manifest

    # ---- load

    def load(self) -> dict[BlockKey, Loc]:
        """Read the committed manifest and the shard index files and serve them (mappings
        dropped). Entries past the end of their shard, of the wrong length or in an
        unreadable shard index are dropped (logged, counted in :attr:`dropped`).

        Returns:
            The live index ``{key: Loc}`` now served (read it, never change it).

        Raises:
            KVStoreError: an unreadable manifest, or one of another header or format.
        """
        manifest = read_manifest(self.path, self.header, self._next_shard)
        index, dropped = scan_shards(self.path, self.header, self.codec, manifest)
        with self.lock.write():
            self._committed = manifest
            self._next_shard = max(self._next_shard, int(manifest["next_shard"]))
            self._index = index
            self._maps.clear()
            self._dropped += dropped
        return index

    def remove_orphans(self) -> None:
        """Delete the files of the directory no commit lists (a writer stopped before
        committing them: shards, index files, temporary files); logged."""
        committed = {name for m in self.shards for name in (m["bin"], m["idx"])}
        for entry in os.scandir(self.path):
            if is_orphan(entry.name, committed):
                logger.warning("removing uncommitted KV store file %s (a writer stopped before committing it)", entry.path)
                unlink_quiet(Path(entry.path))

    def close(self) -> None:
        """Let go of the mappings and the index (arrays already read stay valid)."""
        with self.lock.write():
            self._maps.clear()
            self._index = {}

    # ---- reads

    def _map(self, shard: int) -> np.memmap:
        mm = self._maps.get(shard)
        if mm is not None:
            return mm
        with self._map_lock:
            mm = self._maps.get(shard)
            if mm is None:
                meta = next(m for m in self.shards if m["id"] == shard)
                try:
                    mm = np.memmap(self.path / meta["bin"], dtype=np.uint8, mode="r")
                except (OSError, ValueError) as exc:
                    raise BadEntry(f"cannot map shard {meta['bin']}: {exc}") from exc
                self._maps[shard] = mm
            return mm

    def read_entry(self, loc: Loc) -> np.ndarray:
        """A uint8 view (a plain array over the shard's mapping) of a verified payload.

        Raises:
            BadEntry: checksum mismatch, a truncated or unmappable shard.
        """
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

    def read_many(self, keys: Iterable[BlockKey],
                  load: Callable[[BlockKey, Loc, np.ndarray], T]) -> tuple[dict[BlockKey, T], list[Bad]]:
        """``load(key, loc, verified payload)`` for each stored key among ``keys``, all under
        the read lock (so no commit changes a key between its read and what ``load`` does
        with it, e.g. keep it in a RAM cache).

        Returns:
            ``({key: what load returned}, entries found corrupt)``; pass the latter to :meth:`drop`.
        """
        got: dict[BlockKey, T] = {}
        bad: list[Bad] = []
        with self.lock.read():
            for key in keys:
                loc = self._index.get(key)
                if loc is None:
                    continue
                try:
                    got[key] = load(key, loc, self.read_entry(loc))
                except BadEntry as exc:
                    bad.append((key, loc, str(exc)))
        return got, bad

    def check(self, key: BlockKey, loc: Loc) -> str | None:
        """Why the entry of ``key`` at ``loc`` cannot be served (its crc32 is read), or ``None``
        when it can or ``key`` no longer lives at ``loc``."""
        with self.lock.read():
            if self._index.get(key) != loc:
                return None
            try:
                self.read_entry(loc)
            except BadEntry as exc:
                return str(exc)
        return None

    def get(self, key: BlockKey) -> Loc | None:
        """Where block ``key`` lives, or ``None``."""
        with self.lock.read():
            return self._index.get(key)

    def contains(self, key: BlockKey) -> bool:
        """Whether block ``key`` is live."""
        with self.lock.read():
            return key in self._index

    def __len__(self) -> int:
        with self.lock.read():
            return len(self._index)

    def keys(self) -> list[BlockKey]:
        """Live block keys, in no particular order."""
        with self.lock.read():
            return list(self._index)

    def items(self, *, keys: Iterable[BlockKey] | None = None,
              shards: Collection[int] | None = None) -> list[tuple[BlockKey, Loc]]:
        """A snapshot of ``(key, Loc)`` of the live blocks: all, those among ``keys`` (in
        their order, once each) or those in ``shards``."""
        with self.lock.read():
            index = self._index
            if keys is not None:
                return [(k, index[k]) for k in dict.fromkeys(keys) if k in index]
            return [(k, loc) for k, loc in index.items() if shards is None or loc.shard in shards]

    def live_bytes(self, *, aligned: bool = False) -> int:
        """Payload bytes of the live blocks (each rounded up to :data:`ALIGN` with ``aligned``)."""
        with self.lock.read():
            if aligned:
                return sum(disk_size(loc.length) for loc in self._index.values())
            return sum(loc.length for loc in self._index.values())

    def dead_bytes_by_shard(self) -> dict[int, int]:
        """Bytes of each committed shard's ``.bin`` that no live block uses: deleted, evicted or
        replaced entries, entries dropped as corrupt, and the alignment padding of those
        (``bin_bytes`` minus the live entries' payload rounded up to :data:`ALIGN`). ``O(blocks)``."""
        with self.lock.read():
            metas = self.shards
            live: dict[int, int] = {}
            for loc in self._index.values():
                live[loc.shard] = live.get(loc.shard, 0) + disk_size(loc.length)
        return {m["id"]: max(0, int(m["bin_bytes"]) - live.get(m["id"], 0)) for m in metas}

    def counts(self) -> tuple[int, int, int, int, int]:
        """``(blocks, live payload bytes, shards, tombstones, dropped entries)``, consistent."""
        with self.lock.read():
            return (len(self._index), sum(loc.length for loc in self._index.values()),
                    len(self._committed.get("shards", [])), len(self._committed.get("tombstones", {})), self._dropped)

    def dir_bytes(self) -> int:
        """Bytes of every file of the store directory (one listing)."""
        total = 0
        for entry in os.scandir(self.path):
            if entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
        return total

    # ---- writing shards (not committed until a manifest lists them)

    def _take_shard_id(self) -> int:
        sid = self._next_shard
        self._next_shard += 1
        return sid

    def write_shard(self, items: Iterable[tuple[BlockKey, int, Sequence[Any]]], expected: int, *,
                    progress: Callable[[int], Any] | None = None) -> tuple[dict[str, Any], dict[BlockKey, Loc]]:
        """Write ``(key, T, payload parts)`` as the next shard and make it durable (not
        committed): :func:`heedrank.index.kv.shards.write_shard`, whose arguments these are.

        Returns:
            ``(manifest entry, {key: location})``.

        Raises:
            OSError: after removing the partial files.
        """
        return write_shard(self.path, self.header, self._take_shard_id(), items, expected, write=_write, progress=progress)

    def link_shard(self, bin_src: Path, rows: Sequence[tuple[BlockKey, Loc]]) -> tuple[dict[str, Any], dict[BlockKey, Loc]]:
        """Hard-link (or copy) another store's shard ``bin_src`` in as the next shard, with an
        index listing only ``rows`` (their ``Loc`` in the source), durable and not committed:
        :func:`heedrank.index.kv.shards.link_shard`.

        Returns:
            ``(manifest entry, {key: location here})``.

        Raises:
            OSError: after removing what it wrote.
        """
        return link_shard(self.path, self.header, self._take_shard_id(), bin_src, rows, write=_write)

    def unlink(self, metas: Iterable[Mapping[str, Any]]) -> None:
        """Remove the files of shards (uncommitted ones after a failure, or ones no commit
        lists any more); missing files are ignored."""
        unlink_quiet(*(self.path / m[k] for m in metas for k in ("bin", "idx")))

    # ---- serving a commit

    def install(self, manifest: dict[str, Any], locs: Mapping[BlockKey, Loc], removed: Iterable[BlockKey] = ()) -> None:
        """After ``manifest`` is committed: serve it, with ``locs`` new or moved and ``removed``
        gone (both passed to the ``invalidate`` hook)."""
        removed = list(removed)
        with self.lock.write():
            self._committed = manifest
            for key in removed:
                self._index.pop(key, None)
            self._index.update(locs)
            if self._invalidate is not None:
                self._invalidate(removed)
                self._invalidate(locs)

    def swap_shards(self, manifest: dict[str, Any], old_ids: Collection[int], new_locs: Mapping[BlockKey, Loc],
                    dropped: int = 0) -> None:
        """After ``manifest`` is committed by a rewrite: the blocks of shards ``old_ids`` that
        are still live now live at ``new_locs`` (same bytes, so nothing is invalidated); the
        old mappings are let go (a mapping still referenced elsewhere stays valid after its
        file is unlinked, POSIX); ``dropped`` corrupt entries met on the way are counted."""
        with self.lock.write():
            self._committed = manifest
            # entries dropped as corrupt by readers meanwhile stay dropped
            index = {key: loc for key, loc in self._index.items() if loc.shard not in old_ids}
            index.update((key, loc) for key, loc in new_locs.items() if key in self._index)
            self._index = index
            for sid in old_ids:
                self._maps.pop(sid, None)
            self._dropped += dropped

    def drop(self, bad: Sequence[Bad]) -> list[BlockKey]:
        """Stop serving entries found corrupt (logged; still at the same place), so that they
        read as missing and a build recomputes them. Returns the keys dropped."""
        dropped: list[BlockKey] = []
        with self.lock.write():
            for key, loc, why in bad:
                if self._index.get(key) == loc:
                    del self._index[key]
                    dropped.append(key)
                    self._dropped += 1
                    meta = next((m for m in self.shards if m["id"] == loc.shard), {"bin": loc.shard})
                    logger.warning(
                        "KV store %s: entry %r in %s is corrupt (%s); treated as missing, it will be recomputed",
                        self.path, key, meta["bin"], why,
                    )
        return dropped

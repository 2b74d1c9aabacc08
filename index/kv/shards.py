"""The shard files of a document KV store: writing one, linking one in, scanning the committed ones.

A shard is a ``.bin`` of 64-byte aligned payloads and an ``.idx.json`` listing its entries
(:mod:`heedrank.index.kv.format`). The functions here touch only those files:

* :func:`write_shard`: write a new shard from encoded blocks and make it durable;
* :func:`link_shard`: hard-link (or copy) another store's ``.bin`` in as a new shard, with
  an index file of the entries taken from it;
* :func:`scan_shards`: read the index files a manifest commits into the live index
  ``{key: Loc}``, dropping entries that cannot be served.

None of them commits anything: a shard they write is an orphan until
:class:`heedrank.index.kv.manifest.Manifest` commits a manifest that lists it, and the
shard ids, the commit and what is served are the manifest's. Every write goes through the
``write`` hook the caller passes (``write(fd, data)``: the manifest's ``_write``, so one
hook covers every byte of a store).
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from heedrank.blocks import BlockKey, KVHeader
from heedrank.errors import KVStoreError
from heedrank.files import Writer, fsync_dir, fsync_file, write_new
from heedrank.index.kv.codec import Codec
from heedrank.index.kv.format import (
    ALIGN,
    Loc,
    read_shard_index,
    shard_index_bytes,
    shard_meta,
    shard_names,
    unlink_quiet,
)

logger = logging.getLogger(__name__)

__all__ = ["link_shard", "scan_shards", "write_shard"]


@contextmanager
def _new_files(path: Path, shard_id: int) -> Iterator[tuple[Path, Path]]:
    """``(.bin path, .idx.json path)`` of shard ``shard_id``, both removed if the block raises."""
    bin_name, idx_name = shard_names(shard_id)
    bpath, ipath = path / bin_name, path / idx_name
    try:
        yield bpath, ipath
    except BaseException:
        unlink_quiet(bpath, ipath)
        raise


def _write_index(path: Path, header: KVHeader, shard_id: int, ipath: Path, bin_bytes: int,
                 rows: list[list[Any]], write: Writer) -> dict[str, Any]:
    """Write the index file ``ipath`` listing ``rows``, fsync it and the directory; returns the
    shard's manifest entry (its ``.bin`` already durable, of ``bin_bytes`` bytes)."""
    idx = shard_index_bytes(header, shard_id, rows)
    write_new(ipath, idx, write=write)
    fsync_dir(path)
    return shard_meta(shard_id, bin_bytes, idx, len(rows))


def write_shard(path: Path, header: KVHeader, shard_id: int, items: Iterable[tuple[BlockKey, int, Sequence[Any]]],
                expected: int, *, write: Writer,
                progress: Callable[[int], Any] | None = None) -> tuple[dict[str, Any], dict[BlockKey, Loc]]:
    """Write shard ``shard_id`` of the store at ``path`` from ``(key, T, payload parts)``:
    the ``.bin`` (each entry padded to :data:`ALIGN`, crc32 over its payload), fsynced, then
    its index file, then the directory fsynced. Not committed.

    Args:
        path: The store directory.
        header: The store's header (fingerprint of the index file).
        shard_id: A shard id no file of the store uses yet.
        items: The entries, in order; each payload part is a bytes-like object.
        expected: How many entries ``items`` yields (checked).
        write: The writer of every byte (:data:`heedrank.files.Writer`).
        progress: Called with 1 per entry written.

    Returns:
        ``(manifest entry, {key: location})``.

    Raises:
        OSError: after removing the partial files.
    """
    locs: dict[BlockKey, Loc] = {}
    rows: list[list[Any]] = []
    with _new_files(path, shard_id) as (bpath, ipath):
        fd = os.open(bpath, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            offset = 0
            for key, tokens, parts in items:
                crc, length = 0, 0
                for part in parts:
                    crc = zlib.crc32(part, crc)
                    write(fd, part)
                    length += part.nbytes if isinstance(part, np.ndarray) else len(part)
                pad = -length % ALIGN
                if pad:
                    write(fd, b"\0" * pad)
                locs[key] = Loc(shard_id, offset, length, tokens, crc)
                rows.append([key, offset, length, tokens, crc])
                offset += length + pad
                if progress is not None:
                    progress(1)
            os.fsync(fd)
        finally:
            os.close(fd)
        if len(rows) != expected:  # pragma: no cover - internal invariant
            raise KVStoreError(f"internal error: wrote {len(rows)} entries, expected {expected}")
        meta = _write_index(path, header, shard_id, ipath, offset, rows, write)
    return meta, locs


def link_shard(path: Path, header: KVHeader, shard_id: int, bin_src: Path,
               rows: Sequence[tuple[BlockKey, Loc]], *, write: Writer) -> tuple[dict[str, Any], dict[BlockKey, Loc]]:
    """Hard-link (or copy, where the filesystem cannot link) another store's shard
    ``bin_src`` in as shard ``shard_id`` of the store at ``path``, write its index listing
    only ``rows`` (their ``Loc`` in the source) and make both durable. Not committed.

    Returns:
        ``(manifest entry, {key: location here})``.

    Raises:
        OSError: after removing what it wrote.
    """
    ordered = sorted(rows, key=lambda r: r[1].offset)
    with _new_files(path, shard_id) as (bpath, ipath):
        try:
            os.link(bin_src, bpath)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP):
                raise
            shutil.copyfile(bin_src, bpath)
            fsync_file(bpath)
        size = bpath.stat().st_size
        table = [[key, loc.offset, loc.length, loc.tokens, loc.crc] for key, loc in ordered]
        meta = _write_index(path, header, shard_id, ipath, size, table, write)
    return meta, {key: loc._replace(shard=shard_id) for key, loc in ordered}


def scan_shards(path: Path, header: KVHeader, codec: Codec, manifest: Mapping[str, Any]) -> tuple[dict[BlockKey, Loc], int]:
    """The live index of the committed ``manifest`` of the store at ``path``, read from its
    shards' index files in shard order (a later shard overrides an earlier one, a tombstone
    hides older shards' entries).

    An entry past the end of its shard's ``.bin``, of the wrong length for ``codec`` or with
    ``T`` outside ``1..header.max_doc_tokens`` is dropped, and so is every entry of a shard
    whose index file is unreadable (logged: they will be recomputed); an older version of a
    dropped key is never served instead.

    Returns:
        ``({key: Loc}, entries dropped)``.
    """
    index: dict[BlockKey, Loc] = {}
    tombstones: Mapping[str, int] = manifest["tombstones"]
    dropped = 0
    for meta in sorted(manifest["shards"], key=lambda m: m["id"]):
        sid = meta["id"]
        entries = read_shard_index(path, meta)
        if entries is None:  # whole shard unusable: its blocks become misses
            for row in read_shard_index(path, meta, trust=True) or []:
                index.pop(row[0], None)
            dropped += meta["entries"]
            continue
        try:
            size = (path / meta["bin"]).stat().st_size
        except OSError as exc:
            logger.warning("KV shard %s is missing (%s): its %d blocks will be recomputed", meta["bin"], exc, len(entries))
            size = 0
        bad = 0
        for key, offset, length, tokens, crc in entries:
            if tombstones.get(key, -1) > sid:
                continue
            if offset + length > size or length != codec.nbytes(tokens) or not 1 <= tokens <= header.max_doc_tokens:
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
    return index, dropped

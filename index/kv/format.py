"""The on-disk format of a document KV store: file names, the manifest and the shard index.

Layout of a store directory (conventionally ``<index dir>/kv``)::

    header.json              KVHeader.to_dict(): what the keys/values were computed with
                             (written once; indent 2, sorted keys)
    MANIFEST.json            committed state: shard list, tombstones, next shard id
                             (replaced atomically: heedrank.files.write_atomic)
    shard-000000.bin         append-once payloads, each entry 64-byte aligned
    shard-000000.idx.json    per-shard index: [key, offset, length, T, crc32] per entry
    LOCK                     flock'ed by the one writable opener (cross-process writer lock)
    parts/part-00000/ ...    only during a distributed build: each Ray actor's own store,
                             adopted into this one by the driver (:func:`heedrank.index.kv.maintenance.adopt`)

A shard is *committed* only once the manifest lists it (with its size and the crc32 of its
index file); anything else (a writer killed mid-shard, a full disk) is an orphan that
readers never look at and a writable open deletes. A later shard overrides an earlier one
for the same key; a tombstone ``{key: s}`` hides that block in shards ``< s``.

``MANIFEST.json`` (compact JSON, one line)::

    {"format_version": 1, "header_fingerprint": <sha256 hex of header.json's content>,
     "next_shard": <int>, "shards": [<shard meta>, ...], "tombstones": {<key>: <shard id>}}

with a shard meta ``{"id", "bin", "idx", "bin_bytes", "idx_bytes", "idx_crc32", "entries"}``.
A shard index file (compact JSON, one line)::

    {"format_version": 1, "shard": <id>, "header_fingerprint": ..., "entries": [[key, offset, length, T, crc32], ...]}

The payload of an entry (``length`` bytes at ``offset`` of the ``.bin``, crc32 over exactly
these bytes) is its dtype's codec's (:mod:`heedrank.index.kv.codec`).
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import re
import zlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from heedrank.blocks import KV_FORMAT_VERSION, KVHeader
from heedrank.errors import KVStoreError

logger = logging.getLogger(__name__)

FORMAT_VERSION = KV_FORMAT_VERSION
HEADER_FILE = "header.json"
MANIFEST_FILE = "MANIFEST.json"
LOCK_FILE = "LOCK"
PARTS_DIR = "parts"
"""Part stores of a distributed build, adopted by the driver."""
ALIGN = 64
"""Entry alignment inside a shard, bytes."""
SHARD_FILE = re.compile(r"^shard-(\d+)\.(bin|idx\.json)$")


class Loc(NamedTuple):
    """Where one block lives: shard id, byte offset and payload length in its ``.bin``,
    its tokens ``T`` and the crc32 of its payload."""

    shard: int
    offset: int
    length: int
    tokens: int
    crc: int


class BadEntry(Exception):
    """An entry that cannot be served (checksum, truncated or unmappable shard); the store
    treats it as missing. Internal: never leaves the store."""


def disk_size(length: int) -> int:
    """Bytes an entry of ``length`` payload bytes occupies in its shard (rounded up to :data:`ALIGN`)."""
    return length + (-length % ALIGN)


def shard_names(shard_id: int) -> tuple[str, str]:
    """``(shard-NNNNNN.bin, shard-NNNNNN.idx.json)`` of shard ``shard_id``."""
    return f"shard-{shard_id:06d}.bin", f"shard-{shard_id:06d}.idx.json"


def header_bytes(header: KVHeader) -> bytes:
    """The content of ``header.json``."""
    return (json.dumps(header.to_dict(), indent=2, sort_keys=True) + "\n").encode()


def new_manifest(header: KVHeader, next_shard: int, shards: list[dict[str, Any]],
                 tombstones: Mapping[str, int]) -> dict[str, Any]:
    """A manifest listing ``shards`` (metas, see :func:`shard_meta`) and ``tombstones``."""
    return {
        "format_version": FORMAT_VERSION,
        "header_fingerprint": header.fingerprint(),
        "next_shard": next_shard,
        "shards": shards,
        "tombstones": dict(tombstones),
    }


def manifest_bytes(manifest: Mapping[str, Any]) -> bytes:
    """The content of ``MANIFEST.json``."""
    return (json.dumps(manifest, separators=(",", ":")) + "\n").encode()


def shard_index_bytes(header: KVHeader, shard_id: int, rows: Sequence[Sequence[Any]]) -> bytes:
    """The content of a shard's ``.idx.json``: ``rows`` are ``[key, offset, length, T, crc32]``."""
    doc = {"format_version": FORMAT_VERSION, "shard": shard_id, "header_fingerprint": header.fingerprint(),
           "entries": rows}
    return (json.dumps(doc, separators=(",", ":")) + "\n").encode()


def shard_meta(shard_id: int, bin_bytes: int, idx: bytes, entries: int) -> dict[str, Any]:
    """The manifest's entry for a shard whose ``.bin`` has ``bin_bytes`` bytes and whose index
    file holds ``idx`` (its size and crc32 are checked when the store opens)."""
    bin_name, idx_name = shard_names(shard_id)
    return {"id": shard_id, "bin": bin_name, "idx": idx_name, "bin_bytes": bin_bytes, "idx_bytes": len(idx),
            "idx_crc32": zlib.crc32(idx), "entries": entries}


def read_manifest(path: Path, header: KVHeader, next_shard: int = 0) -> dict[str, Any]:
    """The committed manifest of the store at ``path`` for ``header`` (an empty one, at
    ``next_shard``, when ``create`` died between writing ``header.json`` and the first manifest).

    Raises:
        KVStoreError: unreadable, for another ``header.json``, or of another format version.
    """
    mpath = path / MANIFEST_FILE
    if not mpath.is_file():
        logger.warning("KV store %s has a header but no manifest: treating it as empty", path)
        return new_manifest(header, next_shard, [], {})
    try:
        manifest = json.loads(mpath.read_text())
    except (OSError, ValueError) as exc:
        raise KVStoreError(f"unreadable KV store manifest {mpath}: {exc}; delete {path} and rebuild it") from exc
    if manifest.get("header_fingerprint") != header.fingerprint():
        raise KVStoreError(f"KV store manifest {mpath} belongs to another header.json; delete {path} and rebuild it")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise KVStoreError(f"KV store manifest {mpath} has format {manifest.get('format_version')}, expected {FORMAT_VERSION}")
    return manifest


def read_shard_index(path: Path, meta: Mapping[str, Any], *, trust: bool = False) -> list[list[Any]] | None:
    """The rows ``[key, offset, length, T, crc32]`` of a committed shard's index file, or
    ``None`` when it is unreadable or (unless ``trust``) its size or crc32 differ from the
    manifest's (logged: its blocks will be recomputed)."""
    ipath = path / meta["idx"]
    try:
        raw = ipath.read_bytes()
    except OSError as exc:
        if not trust:
            logger.warning("KV shard index %s unreadable (%s): its blocks will be recomputed", ipath, exc)
        return None
    if not trust and (len(raw) != meta["idx_bytes"] or zlib.crc32(raw) != meta["idx_crc32"]):
        logger.warning("KV shard index %s is corrupt (size/crc32 mismatch): its blocks will be recomputed", ipath)
        return None
    try:
        return json.loads(raw)["entries"]
    except (ValueError, KeyError, TypeError):
        return None


def is_orphan(name: str, committed: set[str]) -> bool:
    """Whether a file of a store directory is left over by a writer that stopped before
    committing it: a shard file the manifest does not list, or a temporary file."""
    return bool(SHARD_FILE.match(name) and name not in committed) or (name.startswith(".") and ".tmp-" in name)


def unlink_quiet(*paths: Path) -> None:
    """Remove files, ignoring missing ones and logging other failures (best-effort cleanup)."""
    for p in paths:
        try:
            p.unlink(missing_ok=True)
        except OSError as exc:  # pragma: no cover - best effort cleanup
            logger.warning("could not remove %s: %s", p, exc)


def acquire_lock(path: Path) -> int:
    """Take the writer lock of the store directory ``path`` (an ``flock`` on its ``LOCK``
    file, created when absent) without waiting; returns the file descriptor that holds it
    (closing it releases the lock).

    Raises:
        KVStoreError: another process (or another open store object) holds it.
    """
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


def io_error(what: str, path: Path, exc: OSError) -> KVStoreError:
    """The error for an ``OSError`` while ``what`` in the store at ``path``: a full disk says
    how to free space and that a rerun resumes; anything else that nothing was committed."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return KVStoreError(
            f"disk full while {what} in the KV store at {path} ({exc.strerror or exc}); nothing was "
            f"committed and the partial files were removed. Free disk space (or use dtype='int8', "
            f"~0.53x the bytes) and run the build again: finished shards are kept."
        )
    return KVStoreError(f"I/O error while {what} in the KV store at {path}: {exc}; nothing was committed.")

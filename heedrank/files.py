"""File helpers shared by every layer: content hashes, the cache folder and durable writes.

One home for what the index, the reranker's LM loader, the evaluator and the batch
command all need, so an index's recorded hashes and a report's agree byte for byte, and
every durable file (an index's ``params.json`` and vector file, the document KV store's
header, manifest and shard indexes) is written the same way:

* :func:`write_atomic` replaces a file: a temporary file beside it (``.<name>.tmp-<pid>-<thread>``),
  its bytes fsynced, ``os.replace`` onto the name, then the directory fsynced. A reader sees
  the old file or the new one, never a mix; after a crash (even ``kill -9`` or a power
  cut, with ``durable=True``) the name holds one of the two, and at worst a temporary file
  is left behind (the KV store deletes such files at its next writable open).
* :func:`write_new` creates a file that must not exist yet (``O_EXCL``) and fsyncs it.
* :func:`fsync_dir` makes the creations, renames and deletions inside a directory durable.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["cache_dir", "file_sha256", "fsync_dir", "write_all", "write_atomic", "write_new"]

logger = logging.getLogger(__name__)

WRITE_CHUNK = 8 * 2**20
"""Bytes per ``os.write`` call of :func:`write_all` (8 MiB)."""

Writer = Callable[[int, Any], None]
"""``write(fd, data)``: writes all of a bytes-like ``data`` to the file descriptor ``fd``
(:func:`write_all`; a caller may pass its own, e.g. one that injects a full disk in tests)."""

_HASHES: dict[tuple[str, int, int], str] = {}
_HASH_LOCK = threading.Lock()


def file_sha256(path: str | os.PathLike[str], chunk: int = 1 << 22) -> str:
    """Hex sha256 (64 characters) of a file's bytes as stored (a ``.gz`` file is hashed
    compressed), memoised per ``(resolved path, size, mtime_ns)`` in this process, so
    hashing a 500 MB model file costs once per process. Thread-safe.

    Raises:
        OSError: the file cannot be read (``FileNotFoundError`` when it does not exist).
    """
    p = Path(path)
    st = p.stat()
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
    with _HASH_LOCK:
        if key in _HASHES:
            return _HASHES[key]
    h = hashlib.sha256()
    with open(p, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    digest = h.hexdigest()
    with _HASH_LOCK:
        _HASHES[key] = digest
    return digest


def cache_dir(override: str | os.PathLike[str] | None = None) -> Path:
    """The cache folder: ``override`` when given, else ``$HEEDRANK_CACHE_DIR``, else
    ``~/.cache/heedrank`` (``~`` expanded; not created here)."""
    if override is not None:
        return Path(override).expanduser()
    env = os.environ.get("HEEDRANK_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "heedrank"


def write_all(fd: int, data: Any) -> None:
    """Write all of ``data`` (any bytes-like object: ``bytes``, a numpy array, a memoryview)
    to the file descriptor ``fd``, in calls of at most :data:`WRITE_CHUNK` bytes (a short
    write is continued).

    Raises:
        OSError: from ``os.write`` (e.g. ``ENOSPC`` on a full disk); part of ``data`` may
            have been written.
    """
    mv = memoryview(data).cast("B")
    while len(mv):
        n = os.write(fd, mv[:WRITE_CHUNK])
        mv = mv[n:]


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """fsync the directory ``path``, so that files created, renamed or deleted in it stay
    so after a crash. Does nothing on Windows, whose directories cannot be opened.

    Raises:
        OSError: the directory cannot be opened or synced.
    """
    if os.name == "nt":  # pragma: no cover - no directory fds
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_new(path: str | os.PathLike[str], data: Any, *, write: Writer = write_all, fsync: bool = True) -> None:
    """Create ``path`` (it must not exist: ``O_EXCL``, mode 0644), write ``data`` (bytes-like)
    with ``write`` and, with ``fsync``, fsync the file (not its directory: see :func:`fsync_dir`).

    Raises:
        FileExistsError: ``path`` exists.
        OSError: the write or the fsync failed; the partial file is left for the caller to remove.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        write(fd, data)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def fsync_file(path: str | os.PathLike[str]) -> None:
    """fsync the file ``path``'s data (not its directory: see :func:`fsync_dir`).

    Raises:
        OSError: the file cannot be opened or synced.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_dir(tmp: str | os.PathLike[str], final: str | os.PathLike[str]) -> None:
    """Make the directory ``tmp`` (written by the caller) durable and put it in place of
    ``final``: every file and folder under ``tmp`` fsynced, then ``final`` (when it exists)
    renamed to ``final.old``, ``tmp`` renamed to ``final``, their parent fsynced, and
    ``final.old`` removed. After a crash at any point, ``final`` or ``final.old`` is a complete
    directory (:func:`existing_dir` finds it). Used for training checkpoints.

    Raises:
        OSError: a write, fsync or rename failed (``tmp`` is left for the caller).
    """
    import shutil

    tmp, final = Path(tmp), Path(final)
    for root, dirs, files in os.walk(tmp):
        for name in files:
            fsync_file(Path(root) / name)
        fsync_dir(root)
    old = final.with_name(final.name + ".old")
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    tmp.rename(final)
    fsync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)


def existing_dir(final: str | os.PathLike[str]) -> Path | None:
    """``final`` when it exists, else the ``final.old`` that :func:`replace_dir` left when it
    stopped between its two renames, else ``None``."""
    final = Path(final)
    if final.is_dir():
        return final
    old = final.with_name(final.name + ".old")
    return old if old.is_dir() else None


def write_atomic(
    path: str | os.PathLike[str], data: Any | Callable[[Path], None], *, durable: bool = True,
    write: Writer = write_all,
) -> None:
    """Replace ``path`` atomically with new content (see the module docstring).

    Args:
        path: The file to write or replace; its directory must exist.
        data: The new bytes (any bytes-like object, written with ``write``), or a function
            that writes the new file at the temporary path it is given, for writers that take
            a path (e.g. ``faiss.write_index``).
        durable: fsync the file before the rename and the directory after it (the default:
            the new content survives a power cut once this returns). ``False`` keeps the
            atomicity, not the durability.
        write: How ``data`` bytes are written to the temporary file (:func:`write_all`).

    Raises:
        OSError: writing or renaming failed (e.g. ``ENOSPC``): ``path`` is unchanged and the
            temporary file removed. A failure to fsync the directory *after* the rename is
            only logged (the new content is in place; only its durability is unsure).
        Whatever a ``data`` function raises, after removing the temporary file.
    """
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        if callable(data):
            tmp.unlink(missing_ok=True)
            data(tmp)
            if durable:
                fsync_file(tmp)
        else:
            write_new(tmp, data, write=write, fsync=durable)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if not durable:
        return
    try:
        fsync_dir(path.parent)
    except OSError as exc:  # pragma: no cover - the rename happened; only its durability is unsure
        logger.warning("could not fsync %s after replacing %s: %s", path.parent, path.name, exc)

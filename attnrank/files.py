"""File helpers shared by every layer: content hashes and the cache folder.

One home for what the index, the reranker's LM loader, the evaluator and the batch
command all need, so an index's recorded hashes and a report's agree byte for byte.
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path

__all__ = ["cache_dir", "file_sha256"]

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
    """The cache folder: ``override`` when given, else ``$ATTNRANK_CACHE_DIR``, else
    ``~/.cache/attnrank`` (``~`` expanded; not created here)."""
    if override is not None:
        return Path(override).expanduser()
    env = os.environ.get("ATTNRANK_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "attnrank"

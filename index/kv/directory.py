"""A store directory as :class:`heedrank.index.kv.KVStore` opens it: making a new one,
checking an existing one's ``header.json``, and who may write it.

* :func:`make_store_dir`: the empty directory a new store is created in.
* :func:`read_header`: the header of an existing store, checked against the one the caller
  expects (a mismatch names the fields and the rebuild command).
* :class:`WriterLock`: the cross-process writer lock (an ``flock`` on ``LOCK``, held by the
  one writable opener) together with the in-process mutex that serialises that opener's
  writers, and the readonly / closed state that refuses writes.

The files themselves are :mod:`heedrank.index.kv.format`'s.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from heedrank.blocks import KVHeader
from heedrank.errors import KVStoreError, KVStoreMismatchError
from heedrank.index.kv.format import HEADER_FILE, acquire_lock, io_error

logger = logging.getLogger(__name__)

__all__ = ["WriterLock", "make_store_dir", "read_header"]


def make_store_dir(path: Path) -> None:
    """Create ``path`` (and its parents) for a new store; an existing empty directory is fine.

    Raises:
        KVStoreError: ``path`` exists and is not an empty directory, or cannot be created.
    """
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        raise KVStoreError(f"cannot create a KV store at {path}: it exists and is not an empty directory; open it instead")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise io_error("creating the directory", path, exc) from exc


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


def read_header(path: Path, expected: KVHeader) -> KVHeader:
    """The ``header.json`` of the store at ``path``, which must equal ``expected``.

    Raises:
        KVStoreError: no store at ``path`` (no ``header.json``) or an unreadable header.
        KVStoreMismatchError: the stored header differs (the message names the fields and
            the rebuild command).
    """
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
    if stored != expected:
        raise _mismatch(path, stored, expected)
    return stored


class WriterLock:
    """Who may write one store directory, and one writer at a time.

    A writable lock holds the directory's cross-process ``flock``
    (:func:`heedrank.index.kv.format.acquire_lock`) until :meth:`release`; within the
    process, :meth:`hold` serialises the writers (puts, deletes, compaction, adoption,
    evictions) and refuses them once the store is readonly or closed.

    Args:
        path: The store directory (named in errors).
        readonly: Take no ``flock``; every write is refused.

    Raises:
        KVStoreError: (writable) another process or open store object holds the ``flock``.
    """

    def __init__(self, path: Path, *, readonly: bool) -> None:
        self.path = path
        self.readonly = readonly
        self.closed = False
        """Set when the store closes: from then on every write is refused."""
        self.mutex = threading.Lock()
        """Serialises the writers (and reloads of the committed state)."""
        self._fd = None if readonly else acquire_lock(path)

    def check(self) -> None:
        """Raises KVStoreError when the store is closed or was opened readonly."""
        if self.closed:
            raise KVStoreError(f"the KV store at {self.path} is closed")
        if self.readonly:
            raise KVStoreError(f"the KV store at {self.path} was opened readonly")

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Hold :attr:`mutex`, checking (:meth:`check`) before and after waiting for it.

        Raises:
            KVStoreError: a readonly or closed store.
        """
        self.check()
        with self.mutex:
            self.check()
            yield

    def release(self) -> None:
        """Release the ``flock`` (a no-op when readonly or already released)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def __del__(self) -> None:  # pragma: no cover - depends on GC
        try:
            if self._fd is not None:
                os.close(self._fd)
        except (OSError, AttributeError):
            return

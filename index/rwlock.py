"""A readers-writer lock: many concurrent searches, one writer at a time, writers first."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class RWLock:
    """Shared (read) / exclusive (write) lock with writer preference.

    Readers run concurrently (faiss and numpy release the GIL while searching); a writer
    waits for running readers to finish and blocks new readers while it waits, so a
    stream of searches cannot starve an update. Not re-entrant: a thread holding the
    write lock must not take the read lock.

    Example:
        >>> lock = RWLock()
        >>> with lock.read():
        ...     pass
        >>> with lock.write():
        ...     pass
    """

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._readers = 0
        self._writer = False
        self._waiting_writers = 0

    @contextmanager
    def read(self) -> Iterator[None]:
        with self._cond:
            while self._writer or self._waiting_writers:
                self._cond.wait()
            self._readers += 1
        try:
            yield
        finally:
            with self._cond:
                self._readers -= 1
                if self._readers == 0:
                    self._cond.notify_all()

    @contextmanager
    def write(self) -> Iterator[None]:
        with self._cond:
            self._waiting_writers += 1
            try:
                while self._writer or self._readers:
                    self._cond.wait()
            finally:
                self._waiting_writers -= 1
            self._writer = True
        try:
            yield
        finally:
            with self._cond:
                self._writer = False
                self._cond.notify_all()

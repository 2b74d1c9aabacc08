"""A thread-safe LRU map bounded by a byte budget, shared by the document KV store's RAM
cache (:mod:`heedrank.index.kv`) and the reranker's cache of ad-hoc document blocks
(:mod:`heedrank.reranker.doccache`)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from heedrank.errors import ValidationError

__all__ = ["ByteLRU", "CacheStats"]


@dataclass(frozen=True)
class CacheStats:
    """Counters of a byte-bounded LRU (for /metrics).

    Attributes:
        hits, misses: Lookups answered / not answered from RAM since creation.
        evictions: Entries dropped to stay within ``max_bytes``.
        entries: Entries held now.
        bytes: Bytes held now (array ``nbytes``; Python object overhead not counted).
        max_bytes: The budget, bytes.
    """

    hits: int
    misses: int
    evictions: int
    entries: int
    bytes: int
    max_bytes: int

    @property
    def hit_ratio(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


class ByteLRU:
    """Thread-safe LRU map bounded by a byte budget.

    Args:
        max_bytes: Budget in bytes; ``0`` disables caching. An item larger than the budget is
            not cached.
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValidationError(f"cache budget must be >= 0 bytes, got {max_bytes}")
        self.max_bytes = int(max_bytes)
        self._items: OrderedDict[Any, tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()
        self._bytes = self._hits = self._misses = self._evictions = 0

    def get(self, key: Any) -> Any | None:
        """The value (now most recent), or ``None``; counts a hit or a miss."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                self._misses += 1
                return None
            self._items.move_to_end(key)
            self._hits += 1
            return item[0]

    def put(self, key: Any, value: Any, nbytes: int) -> bool:
        """Insert or replace; evicts least recent entries to fit. Returns whether it was cached."""
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            if nbytes > self.max_bytes:
                return False
            while self._items and self._bytes + nbytes > self.max_bytes:
                _, (_, size) = self._items.popitem(last=False)
                self._bytes -= size
                self._evictions += 1
            self._items[key] = (value, nbytes)
            self._bytes += nbytes
            return True

    def pop(self, key: Any) -> None:
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= old[1]

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0

    def __contains__(self, key: Any) -> bool:
        """Whether ``key`` is cached (neither a hit nor a miss, and not made most recent)."""
        with self._lock:
            return key in self._items

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def stats(self) -> CacheStats:
        with self._lock:
            return CacheStats(self._hits, self._misses, self._evictions, len(self._items), self._bytes, self.max_bytes)

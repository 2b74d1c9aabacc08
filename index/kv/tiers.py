"""The bookkeeping that makes a document KV store a bounded cache tier: which block to evict
when a disk budget is full (:class:`EvictionPolicy`: LRU, LFU, FIFO) and which offered block
is worth writing at all (:class:`Admission`).

Both are small, in-memory, thread-safe (one leaf lock each: they never call out while
holding it) and know nothing about files; :class:`heedrank.index.kv.KVStore` feeds them.

Per stored block a policy keeps its size in bytes (what it occupies in its shard: the payload
rounded up to the 64-byte entry alignment), its last access (a monotonic counter, not a
clock) and its access count. A put and every read hit (RAM-cache hits too) are accesses. The
statistics live only in memory: after a reopen :meth:`EvictionPolicy.seed` rebuilds them from
the shard order (an older shard is an older access; every block's count is 1), so the first
evictions after a restart follow write order, and a block that compaction rewrote counts as
written when it was rewritten.

Rules (first victim first; blocks with the same rank go least recently accessed first):

* ``"lru"``: least recently accessed (read hit or put).
* ``"lfu"``: fewest accesses, then least recently accessed. Counts never decay, so a block
  that was popular long ago stays until fresher blocks out-count it.
* ``"fifo"``: oldest put (a re-put block counts as new); reads do not matter.

Cost: ``O(1)`` per access; :meth:`EvictionPolicy.victims` is ``O(victims)`` for LRU/FIFO and
``O(distinct counts * log + victims)`` for LFU. Memory: about 300 bytes per tracked block
(~0.03% of a 1 MB block).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Collection, Iterable, Iterator
from typing import ClassVar

from heedrank.blocks import BlockKey
from heedrank.errors import UnknownNameError, ValidationError

__all__ = ["EVICTION_POLICIES", "Admission", "EvictionPolicy", "FIFOPolicy", "LFUPolicy", "LRUPolicy", "eviction_policy"]

_LAST, _COUNT, _SIZE = 0, 1, 2


class EvictionPolicy:
    """Per-block access statistics and sizes of a store's live blocks, and the order in
    which to evict them. Subclasses define the order (:attr:`name`).

    The store keeps it equal to its live index: :meth:`put` when a block is committed,
    :meth:`remove` when one is deleted, evicted or dropped as corrupt, :meth:`seed` at open.
    """

    name: ClassVar[str] = ""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # key -> [last access, access count, size in bytes]; insertion order is the
        # eviction order for LRU / FIFO
        self._entries: OrderedDict[BlockKey, list[int]] = OrderedDict()
        self._bytes = 0
        self._clock = 0

    # ---- order hooks (called with the lock held)

    def _added(self, key: BlockKey, entry: list[int]) -> None:
        """A new block."""

    def _accessed(self, key: BlockKey, entry: list[int], old_count: int, *, put: bool) -> None:
        """An access to a tracked block (``entry`` already updated)."""

    def _removed(self, key: BlockKey, entry: list[int]) -> None:
        """A block no longer tracked."""

    def _order(self) -> Iterator[BlockKey]:
        """All tracked keys, first victim first."""
        return iter(self._entries)

    def _reset(self) -> None:
        """Forget all order state."""

    # ---- API

    def seed(self, blocks: Iterable[tuple[BlockKey, int]]) -> None:
        """Forget everything and track ``(key, size in bytes)`` pairs given oldest first
        (a reopened store passes its blocks in shard order), each with count 1."""
        with self._lock:
            self._entries.clear()
            self._reset()
            self._bytes = 0
            for key, size in blocks:
                self._put(key, int(size))

    def _put(self, key: BlockKey, size: int) -> None:
        self._clock += 1
        entry = self._entries.get(key)
        if entry is None:
            entry = [self._clock, 1, size]
            self._entries[key] = entry
            self._bytes += size
            self._added(key, entry)
            return
        old = entry[_COUNT]
        self._bytes += size - entry[_SIZE]
        entry[_LAST], entry[_COUNT], entry[_SIZE] = self._clock, old + 1, size
        self._accessed(key, entry, old, put=True)

    def put(self, blocks: Iterable[tuple[BlockKey, int]]) -> None:
        """Blocks ``(key, size in bytes)`` committed now: new ones get count 1, re-put ones
        count one more access (and their new size)."""
        with self._lock:
            for key, size in blocks:
                self._put(key, int(size))

    def touch(self, keys: Iterable[BlockKey]) -> None:
        """Read hits: one access each. Keys not tracked (evicted meanwhile) are ignored."""
        with self._lock:
            for key in keys:
                entry = self._entries.get(key)
                if entry is None:
                    continue
                self._clock += 1
                old = entry[_COUNT]
                entry[_LAST], entry[_COUNT] = self._clock, old + 1
                self._accessed(key, entry, old, put=False)

    def remove(self, keys: Iterable[BlockKey]) -> None:
        """Stop tracking blocks (deleted, evicted, dropped). Unknown keys are ignored."""
        with self._lock:
            for key in keys:
                entry = self._entries.pop(key, None)
                if entry is not None:
                    self._bytes -= entry[_SIZE]
                    self._removed(key, entry)

    def victims(self, need_bytes: int, protect: Collection[BlockKey] = ()) -> list[BlockKey]:
        """The blocks to evict, first victim first, so that their sizes add up to at least
        ``need_bytes`` bytes (fewer when all unprotected blocks together are smaller).

        Args:
            need_bytes: Bytes to free; ``<= 0`` returns ``[]``.
            protect: Keys never chosen (the blocks being written).
        """
        out: list[BlockKey] = []
        if need_bytes <= 0:
            return out
        freed = 0
        with self._lock:
            for key in self._order():
                if key in protect:
                    continue
                out.append(key)
                freed += self._entries[key][_SIZE]
                if freed >= need_bytes:
                    break
        return out

    def size(self, key: BlockKey) -> int | None:
        """The tracked size of ``key`` in bytes, or ``None``."""
        with self._lock:
            entry = self._entries.get(key)
            return None if entry is None else entry[_SIZE]

    def access(self, key: BlockKey) -> tuple[int, int] | None:
        """``(last access, access count)`` of ``key``, or ``None`` (for tests and debugging)."""
        with self._lock:
            entry = self._entries.get(key)
            return None if entry is None else (entry[_LAST], entry[_COUNT])

    def order(self) -> list[BlockKey]:
        """Every tracked key, first victim first (``O(n)``: for tests and debugging)."""
        with self._lock:
            return list(self._order())

    @property
    def total_bytes(self) -> int:
        """Sum of the tracked sizes, bytes."""
        with self._lock:
            return self._bytes

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._entries


class LRUPolicy(EvictionPolicy):
    """Evict the least recently accessed block (read hit or put) first."""

    name = "lru"

    def _accessed(self, key: BlockKey, entry: list[int], old_count: int, *, put: bool) -> None:
        self._entries.move_to_end(key)


class FIFOPolicy(EvictionPolicy):
    """Evict the oldest put first; reads do not change the order (a re-put block is new)."""

    name = "fifo"

    def _accessed(self, key: BlockKey, entry: list[int], old_count: int, *, put: bool) -> None:
        if put:
            self._entries.move_to_end(key)


class LFUPolicy(EvictionPolicy):
    """Evict the least often accessed block first; ties: least recently accessed first.

    One bucket per access count, each ordered by when its blocks reached that count (which is
    their last access), so an access moves one key between two buckets in ``O(1)``.
    """

    name = "lfu"

    def __init__(self) -> None:
        self._buckets: dict[int, OrderedDict[BlockKey, None]] = {}
        super().__init__()

    def _reset(self) -> None:
        self._buckets = {}

    def _bucket_del(self, count: int, key: BlockKey) -> None:
        bucket = self._buckets[count]
        del bucket[key]
        if not bucket:
            del self._buckets[count]

    def _added(self, key: BlockKey, entry: list[int]) -> None:
        self._buckets.setdefault(entry[_COUNT], OrderedDict())[key] = None

    def _accessed(self, key: BlockKey, entry: list[int], old_count: int, *, put: bool) -> None:
        self._bucket_del(old_count, key)
        self._buckets.setdefault(entry[_COUNT], OrderedDict())[key] = None

    def _removed(self, key: BlockKey, entry: list[int]) -> None:
        self._bucket_del(entry[_COUNT], key)

    def _order(self) -> Iterator[BlockKey]:
        for count in sorted(self._buckets):
            yield from self._buckets[count]


EVICTION_POLICIES: dict[str, type[EvictionPolicy]] = {c.name: c for c in (LRUPolicy, LFUPolicy, FIFOPolicy)}
"""The policy class of each ``eviction=`` name."""


def eviction_policy(name: str) -> EvictionPolicy:
    """A new, empty policy named ``name`` (``"lru"``, ``"lfu"`` or ``"fifo"``).

    Raises:
        UnknownNameError: another name (the message lists the known ones).
    """
    try:
        cls = EVICTION_POLICIES[name]
    except (KeyError, TypeError):
        raise UnknownNameError(f"unknown KV store eviction policy {name!r}; choose one of {sorted(EVICTION_POLICIES)}") from None
    return cls()


class Admission:
    """Which offered blocks a store writes: a block is admitted on its ``after``-th offer
    (put) while it is among the last ``window`` distinct keys offered and not admitted, so a
    one-off candidate never displaces a block that is asked for again.

    ``after=1`` admits everything (and keeps no state). The window is an in-memory
    ``OrderedDict`` of at most ``window`` keys with their offer counts (about 150 bytes per
    key); the least recently offered key falls out first, and an admitted key leaves it.

    Args:
        after: Offers needed, ``>= 1``.
        window: Distinct keys remembered, ``>= 1``.

    Raises:
        ValidationError: ``after < 1`` or ``window < 1``.
    """

    def __init__(self, after: int = 1, window: int = 100_000) -> None:
        if int(after) < 1:
            raise ValidationError(f"admit_after must be >= 1 (offers before a block is written), got {after}")
        if int(window) < 1:
            raise ValidationError(f"admit_window must be >= 1 (distinct keys remembered), got {window}")
        self.after = int(after)
        self.window = int(window)
        self._seen: OrderedDict[BlockKey, int] = OrderedDict()
        self._lock = threading.Lock()

    def offer(self, key: BlockKey) -> bool:
        """Count one offer of ``key``; whether it is admitted now."""
        if self.after <= 1:
            return True
        with self._lock:
            n = self._seen.pop(key, 0) + 1
            if n >= self.after:
                return True
            self._seen[key] = n
            if len(self._seen) > self.window:
                self._seen.popitem(last=False)
            return False

    def forget(self, keys: Iterable[BlockKey]) -> None:
        """Drop keys from the window (written without admission: ``admit=False``)."""
        if self.after <= 1:
            return
        with self._lock:
            for key in keys:
                self._seen.pop(key, None)

    def offers(self, key: BlockKey) -> int:
        """Offers of ``key`` counted in the window now (0 when not in it)."""
        with self._lock:
            return self._seen.get(key, 0)

    def __len__(self) -> int:
        with self._lock:
            return len(self._seen)

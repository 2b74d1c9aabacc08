"""The disk budget of a document KV store: admission, eviction and the reclaim of dead bytes.

A :class:`Budget` turns the bookkeeping of :mod:`heedrank.index.kv.tiers` (which block to
evict, which offered block to write at all) into commits of a store's
:class:`heedrank.index.kv.manifest.Manifest`. The rules (the module docstring of
:mod:`heedrank.index.kv.store` states them for the store's users):

* :meth:`Budget.admit`: with ``admit_after=n > 1`` a block is written only on its n-th offer
  (:class:`heedrank.index.kv.tiers.Admission`) when writing it would evict; a block already
  stored always passes, and so does a put that fits in the budget's free room (nothing is
  displaced, and the LM's work is kept).
* :meth:`Budget.make_room`: the blocks of a put that fit in the budget by themselves, and the
  victims to tombstone in the SAME manifest commit that adds their shard.
* :meth:`Budget.enforce`: evict down to the budget in one commit (a store opened with a
  smaller budget than it holds, after an adoption), then :meth:`Budget.reclaim`.
* :meth:`Budget.reclaim`: when the shards' dead bytes exceed ``compact_slack * disk_budget``,
  rewrite the most-dead shards (:func:`heedrank.index.kv.maintenance.reclaim`) until at most
  half that is left.

Without a ``disk_budget`` (or opened readonly) there is no eviction policy: every method but
:meth:`Budget.admit` is a no-op and :meth:`Budget.live_bytes` sums the index.

The writes (:meth:`make_room`'s caller, :meth:`evict`, :meth:`enforce`, :meth:`reclaim`) run
with the store's writer lock held; the counters are read without a lock (ints).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from heedrank.blocks import BlockKey
from heedrank.errors import KVStoreError, ValidationError
from heedrank.index.kv import maintenance
from heedrank.index.kv.format import Loc, disk_size
from heedrank.index.kv.manifest import Manifest
from heedrank.index.kv.tiers import Admission, EvictionPolicy, eviction_policy

logger = logging.getLogger(__name__)

__all__ = ["Budget", "Encoded"]

Encoded = tuple[BlockKey, int, list[np.ndarray]]
"""A block ready to write: ``(key, T, payload parts)`` (:meth:`heedrank.index.kv.codec.Codec.encode`)."""


class Budget:
    """The disk budget, eviction policy and admission rule of one store.

    Args:
        manifest: The store's committed state (evictions are committed through it).
        disk_budget: Bytes of live blocks on disk (each counted 64-byte aligned), ``> 0``, or
            ``None``: unbounded.
        eviction: ``"lru"``, ``"lfu"`` or ``"fifo"`` (:mod:`heedrank.index.kv.tiers`).
        admit_after: Offers of a block before a put writes it, ``>= 1``.
        admit_window: Distinct keys the admission rule remembers, ``>= 1``.
        compact_slack: Dead bytes allowed in the shards, as a fraction of ``disk_budget``, ``>= 0``.
        readonly: A readonly opener only reports the budget (no policy).

    Raises:
        ValidationError: a bad ``disk_budget``, ``compact_slack``, ``admit_after`` or ``admit_window``.
        UnknownNameError: an unknown ``eviction`` (a :class:`ValidationError`).
    """

    def __init__(self, manifest: Manifest, *, disk_budget: int | None = None, eviction: str = "lru",
                 admit_after: int = 1, admit_window: int = 100_000, compact_slack: float = 0.25,
                 readonly: bool = False) -> None:
        if disk_budget is not None and (isinstance(disk_budget, bool) or int(disk_budget) <= 0):
            raise ValidationError(f"disk_budget must be a positive number of bytes or None (unbounded), got {disk_budget!r}")
        if not compact_slack >= 0:
            raise ValidationError(f"compact_slack must be >= 0 (a fraction of disk_budget), got {compact_slack!r}")
        policy = eviction_policy(eviction)
        self.admission = Admission(admit_after, admit_window)
        """The admission rule (offers per key)."""
        self.manifest = manifest
        self.disk_budget: int | None = None if disk_budget is None else int(disk_budget)
        """Bytes of live blocks allowed on disk (``None``: unbounded)."""
        self.eviction = eviction
        self.compact_slack = float(compact_slack)
        self.policy: EvictionPolicy | None = policy if self.disk_budget is not None and not readonly else None
        """The eviction bookkeeping, kept equal to the live index; ``None`` without a budget or readonly."""
        self.evictions = 0
        """Blocks evicted to stay within the budget since open."""
        self.not_admitted = 0
        """Blocks offered to a put and not written by the admission rule since open."""
        self.over_budget = 0
        """Blocks not written since open because their put alone exceeded the budget."""

    @property
    def bounded(self) -> bool:
        """Whether this store evicts (a ``disk_budget``, opened writable)."""
        return self.policy is not None

    # ---- bookkeeping

    def seed(self, index: Mapping[BlockKey, Loc]) -> None:
        """After a (re)load: no access statistics survive it, so the shard order stands for
        the access order (an older shard is an older access)."""
        if self.policy is not None:
            ordered = sorted(index.items(), key=lambda kv: (kv[1].shard, kv[1].offset))
            self.policy.seed((key, disk_size(loc.length)) for key, loc in ordered)

    def touch(self, keys: Iterable[BlockKey]) -> None:
        """Read hits (RAM-cache hits too): one access each."""
        if self.policy is not None:
            self.policy.touch(keys)

    def forget(self, keys: Iterable[BlockKey]) -> None:
        """Blocks no longer live (deleted, dropped as corrupt): out of the bookkeeping."""
        if self.policy is not None:
            self.policy.remove(keys)

    def install(self, manifest: dict[str, Any], locs: Mapping[BlockKey, Loc], evicted: Sequence[BlockKey] = ()) -> None:
        """After ``manifest`` is committed: serve it (:meth:`Manifest.install`) and count
        ``locs`` as puts and ``evicted`` as evictions."""
        self.manifest.install(manifest, locs, evicted)
        if self.policy is not None:
            self.policy.remove(evicted)
            self.policy.put((key, disk_size(loc.length)) for key, loc in locs.items())
        self.evictions += len(evicted)

    def eviction_rank(self) -> dict[BlockKey, int]:
        """``{key: position}`` in the eviction order (first victim 0); ``{}`` without a budget.
        Compaction writes blocks in this order, so a reopened store seeds a similar one."""
        if self.policy is None:
            return {}
        return {key: i for i, key in enumerate(self.policy.order())}

    def live_bytes(self) -> int:
        """Bytes the budget counts now: every live block's payload rounded up to its 64-byte
        alignment. O(1) with a budget (the policy keeps the sum), a pass over the index without."""
        if self.policy is not None:
            return int(self.policy.total_bytes)
        return self.manifest.live_bytes(aligned=True)

    # ---- a put

    def admit(self, encoded: list[Encoded], admit: bool) -> list[Encoded]:
        """The blocks the admission rule lets through (all with ``admit=False`` or
        ``admit_after=1``, or when the whole put fits in a bounded store's free room: the rule
        guards against displacing a block asked for again, and with room nothing is displaced; a
        block already stored always passes). Counts the others."""
        if self.admission.after <= 1:
            return encoded
        if not admit or self.has_room(encoded):
            self.admission.forget(key for key, _, _ in encoded)
            return encoded
        stored = {key for key, _ in self.manifest.items(keys=[key for key, _, _ in encoded])}
        kept = [e for e in encoded if e[0] in stored or self.admission.offer(e[0])]
        refused = len(encoded) - len(kept)
        if refused:
            self.not_admitted += refused
            logger.debug("KV store %s: %d of %d blocks not admitted (admit_after=%d)", self.manifest.path, refused,
                         len(encoded), self.admission.after)
        return kept

    def has_room(self, encoded: list[Encoded]) -> bool:
        """Whether a bounded store can write every block of ``encoded`` without evicting
        (False without a budget: an unbounded store with ``admit_after > 1`` keeps its rule)."""
        if self.policy is None or self.disk_budget is None:
            return False
        need = sum(disk_size(self.manifest.codec.nbytes(t)) for _, t, _ in encoded)
        return self.policy.total_bytes + need <= self.disk_budget

    def make_room(self, encoded: list[Encoded]) -> tuple[list[Encoded], list[BlockKey]]:
        """With a budget: ``(blocks to write, victims to evict in the same commit)``. Blocks
        are taken in the given order while they fit in the budget by themselves; the others
        are counted and logged. The blocks written are never victims."""
        budget, policy = self.disk_budget, self.policy
        if budget is None or policy is None:
            return encoded, []
        kept: list[Encoded] = []
        room = budget
        for entry in encoded:
            size = disk_size(self.manifest.codec.nbytes(entry[1]))
            if size <= room:
                kept.append(entry)
                room -= size
        skipped = len(encoded) - len(kept)
        if skipped:
            self.over_budget += skipped
            logger.warning(
                "KV store %s: a put of %d blocks exceeds the disk budget of %d bytes by itself; %d blocks not written",
                self.manifest.path, len(encoded), budget, skipped,
            )
        keys = {key for key, _, _ in kept}
        replaced = sum(policy.size(key) or 0 for key in keys)
        need = policy.total_bytes - replaced + (budget - room) - budget
        return kept, policy.victims(need, protect=keys)

    # ---- eviction and reclaim (the writer lock held)

    def evict(self, victims: Sequence[BlockKey]) -> None:
        """Tombstone ``victims`` in one manifest commit and serve it.

        Raises:
            KVStoreError: an I/O error (nothing evicted).
        """
        manifest = self.manifest.tombstone(victims, "committing an eviction")
        self.install(manifest, {}, victims)

    def reclaim(self) -> None:
        """With a budget: when the shards' dead bytes exceed ``compact_slack * disk_budget``,
        rewrite the most-dead shards until at most half that is left. A failure (disk full)
        is logged: the store stays as it was and the next write retries."""
        if self.policy is None or self.disk_budget is None:
            return
        bins = sum(int(m["bin_bytes"]) for m in self.manifest.shards)
        slack = self.compact_slack * self.disk_budget
        if bins - self.policy.total_bytes <= slack:
            return
        try:
            maintenance.reclaim(self.manifest, self, int(slack / 2))
        except KVStoreError as exc:
            logger.warning("KV store %s: reclaiming dead bytes failed (%s); the next write tries again",
                           self.manifest.path, exc)

    def enforce(self) -> int:
        """Evict down to the budget (in the policy's order, one commit) and reclaim dead
        bytes. Returns the blocks evicted (0 without a budget).

        Raises:
            KVStoreError: the eviction cannot be committed.
        """
        if self.policy is None or self.disk_budget is None:
            return 0
        victims = self.policy.victims(self.policy.total_bytes - self.disk_budget)
        if victims:
            self.evict(victims)
            logger.info("KV store %s: evicted %d blocks to stay within its disk budget of %d bytes",
                        self.manifest.path, len(victims), self.disk_budget)
        self.reclaim()
        return len(victims)

"""The write transactions of a document KV store: a put and a delete.

Each is ONE manifest commit of a store's :class:`heedrank.index.kv.manifest.Manifest`,
served only once durable, then followed by the reclaim of dead bytes past the slack
(:meth:`heedrank.index.kv.budget.Budget.reclaim`):

* :func:`put`: the admitted blocks that fit in the disk budget as one new shard, and the
  eviction of the blocks that make room for them, tombstoned in the same commit (a crash
  leaves the store before or after the whole put, never over budget);
* :func:`delete`: tombstones for the live blocks among some keys.

:class:`heedrank.index.kv.KVStore` checks what its callers pass and holds its writer lock
around both; the budget's rules are :mod:`heedrank.index.kv.budget`'s.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from heedrank.blocks import BlockKey
from heedrank.index.kv.budget import Budget, Encoded
from heedrank.index.kv.format import io_error
from heedrank.index.kv.manifest import Manifest

logger = logging.getLogger(__name__)

__all__ = ["delete", "put"]


def put(manifest: Manifest, budget: Budget, encoded: list[Encoded], *, admit: bool) -> int:
    """Commit the blocks of ``encoded`` that ``budget`` admits (:meth:`Budget.admit`, with
    ``admit``) and has room for (:meth:`Budget.make_room`) as one new shard, tombstoning the
    victims in the same commit; serve it, then reclaim dead bytes. Run it with the store's
    writer lock held.

    Args:
        manifest: The store's committed state.
        budget: The store's budget (it counts what it refuses).
        encoded: Checked and encoded blocks ``(key, T, payload parts)``
            (:meth:`heedrank.index.kv.codec.Codec.encode`), in the order given to the put.
        admit: Apply the admission rule (``False``: every block, still within the budget).

    Returns:
        Blocks written.

    Raises:
        KVStoreError: disk full or another I/O error (nothing committed, partial files
            removed, nothing evicted). A failed reclaim after the commit is only logged.
    """
    encoded = budget.admit(encoded, admit)
    encoded, evict = budget.make_room(encoded)
    if not encoded:
        return 0
    bin_path = ""
    try:
        meta, locs = manifest.write_shard(iter(encoded), len(encoded))
        bin_path = meta["bin"]
        committed = manifest.commit_shards([meta], locs, evict)  # evict: hidden in this shard too
    except OSError as exc:
        raise io_error(f"writing shard {bin_path or 'of ' + str(len(encoded)) + ' blocks'}", manifest.path, exc) from exc
    budget.install(committed, locs, evict)
    budget.reclaim()
    logger.debug("KV store %s: committed %s (%d blocks, %d bytes; %d evicted)", manifest.path, meta["bin"],
                 meta["entries"], meta["bin_bytes"], len(evict))
    return len(encoded)


def delete(manifest: Manifest, budget: Budget, keys: Iterable[BlockKey]) -> int:
    """Tombstone the live blocks among ``keys`` in one manifest commit, serve it, then
    reclaim dead bytes. Run it with the store's writer lock held.

    Returns:
        Blocks that were live and are now deleted.

    Raises:
        KVStoreError: an I/O error (nothing deleted).
    """
    live = [key for key, _ in manifest.items(keys=keys)]
    if not live:
        return 0
    committed = manifest.tombstone(live, "committing a deletion")
    manifest.install(committed, {}, live)
    budget.forget(live)
    budget.reclaim()
    return len(live)

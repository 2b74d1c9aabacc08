"""The document KV store of an index (``<index>/kv``): cached BlockRank's blocks, computed
once per distinct document text and read by every query.

* :mod:`~heedrank.index.kv.format`: the files, the manifest (the commit point), the shard index.
* :mod:`~heedrank.index.kv.codec`: one codec per dtype (:class:`Float16Codec`, :class:`Int8Codec`).
* :mod:`~heedrank.index.kv.shards`: the shard files: writing one, linking another store's in,
  scanning the committed ones into the live index.
* :mod:`~heedrank.index.kv.manifest`: :class:`Manifest`, the commit point: the committed
  manifest, the live index, shard ids, mapping shards.
* :mod:`~heedrank.index.kv.directory`: a store directory: making it, checking its header, the
  writer lock.
* :mod:`~heedrank.index.kv.ramcache`: the RAM tier of decoded blocks.
* :mod:`~heedrank.index.kv.writes`: a put's and a delete's manifest commits.
* :mod:`~heedrank.index.kv.store`: :class:`KVStore` (open, lock, read, put, delete, refresh),
  over a :class:`Manifest` and a :class:`Budget`.
* :mod:`~heedrank.index.kv.maintenance`: verify, compact (whole or the most-dead shards), adopt a
  distributed build's parts.
* :mod:`~heedrank.index.kv.tiers`: a bounded store's eviction policies (LRU, LFU, FIFO) and
  admission rule (``KVStore(..., disk_budget=, eviction=, admit_after=)``).
* :mod:`~heedrank.index.kv.budget`: :class:`Budget`, which applies them: admission, room for a
  put, eviction commits, the reclaim of dead bytes.
* :mod:`~heedrank.index.kv.build`: the resumable build driver (``heedrank index kv build``).

The header (:class:`KVHeader`) and the block key (:data:`BlockKey`) are the core package's
(:mod:`heedrank.blocks`), which the reranker speaks too.
"""

from __future__ import annotations

from heedrank.blocks import BlockKey, KVHeader
from heedrank.index.kv.budget import Budget
from heedrank.index.kv.build import (
    BlockBuildPlan,
    BuildReport,
    build_index_blocks,
    build_missing,
    build_part,
    index_block_texts,
    open_index_store,
    plan_build,
    prune_blocks,
    put_batches,
)
from heedrank.index.kv.codec import CODECS, Codec, Float16Codec, Int8Codec, codec_for, dequantize_int8, quantize_int8
from heedrank.index.kv.format import FORMAT_VERSION
from heedrank.index.kv.maintenance import DEFAULT_SHARD_MAX_BYTES, CompactReport
from heedrank.index.kv.manifest import Manifest
from heedrank.index.kv.store import KVStore, KVStoreStats
from heedrank.index.kv.tiers import EVICTION_POLICIES, Admission, EvictionPolicy, eviction_policy

__all__ = [
    "CODECS",
    "DEFAULT_SHARD_MAX_BYTES",
    "EVICTION_POLICIES",
    "Admission",
    "FORMAT_VERSION",
    "BlockBuildPlan",
    "BlockKey",
    "Budget",
    "BuildReport",
    "Codec",
    "CompactReport",
    "EvictionPolicy",
    "Float16Codec",
    "Int8Codec",
    "KVHeader",
    "KVStore",
    "KVStoreStats",
    "Manifest",
    "build_index_blocks",
    "build_missing",
    "build_part",
    "codec_for",
    "dequantize_int8",
    "eviction_policy",
    "index_block_texts",
    "open_index_store",
    "plan_build",
    "prune_blocks",
    "put_batches",
    "quantize_int8",
]

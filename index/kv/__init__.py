"""The document KV store of an index (``<index>/kv``): cached BlockRank's blocks, computed
once per distinct document text and read by every query.

* :mod:`~heedrank.index.kv.format`: the files, the manifest (the commit point), the shard index.
* :mod:`~heedrank.index.kv.codec`: one codec per dtype (:class:`Float16Codec`, :class:`Int8Codec`).
* :mod:`~heedrank.index.kv.store`: :class:`KVStore` (open, lock, read, put, delete, refresh).
* :mod:`~heedrank.index.kv.maintenance`: verify, compact, adopt a distributed build's parts.
* :mod:`~heedrank.index.kv.build`: the resumable build driver (``heedrank index kv build``).

The header (:class:`KVHeader`) and the block key (:data:`BlockKey`) are the core package's
(:mod:`heedrank.blocks`), which the reranker speaks too.
"""

from __future__ import annotations

from heedrank.blocks import BlockKey, KVHeader
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
from heedrank.index.kv.store import KVStore, KVStoreStats

__all__ = [
    "CODECS",
    "DEFAULT_SHARD_MAX_BYTES",
    "FORMAT_VERSION",
    "BlockBuildPlan",
    "BlockKey",
    "BuildReport",
    "Codec",
    "CompactReport",
    "Float16Codec",
    "Int8Codec",
    "KVHeader",
    "KVStore",
    "KVStoreStats",
    "build_index_blocks",
    "build_missing",
    "build_part",
    "codec_for",
    "dequantize_int8",
    "index_block_texts",
    "open_index_store",
    "plan_build",
    "prune_blocks",
    "put_batches",
    "quantize_int8",
]

"""Compatibility module: the document KV store is the package :mod:`heedrank.index.kv`
(format, codecs, store, maintenance, build), with the header and the block key in the core
(:mod:`heedrank.blocks`). Import from those; this module only re-exports their public names.
"""

from __future__ import annotations

from heedrank.index.kv import (
    DEFAULT_CACHE_BYTES,
    ENV_CACHE_BYTES,
    FORMAT_VERSION,
    BlockBuildPlan,
    BuildReport,
    CompactReport,
    KVHeader,
    KVStore,
    KVStoreStats,
    build_index_blocks,
    build_missing,
    build_part,
    dequantize_int8,
    index_block_texts,
    open_index_store,
    plan_build,
    prune_blocks,
    put_batches,
    quantize_int8,
)
from heedrank.lru import ByteLRU, CacheStats

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "ENV_CACHE_BYTES",
    "FORMAT_VERSION",
    "BlockBuildPlan",
    "BuildReport",
    "ByteLRU",
    "CacheStats",
    "CompactReport",
    "KVHeader",
    "KVStore",
    "KVStoreStats",
    "build_index_blocks",
    "build_missing",
    "build_part",
    "dequantize_int8",
    "index_block_texts",
    "open_index_store",
    "plan_build",
    "prune_blocks",
    "put_batches",
    "quantize_int8",
]

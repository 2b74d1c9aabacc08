"""The document KV store's side of cached BlockRank: the header a store must carry, the
blocks' keys and arrays, and one query's context assembled from stored blocks.

Blocks are always the base model's: the block encoders switch a query adapter off
(:func:`heedrank.reranker.doccache.encode_blocks`), so a store serves a reranker with or
without one.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from heedrank.blocks import BlockKey, KVHeader
from heedrank.reranker.blockforward import BlockPrompt
from heedrank.reranker.doccache import (
    CACHE_TEMPLATE_VERSION,
    BlockLayout,
    BlockSource,
    assemble_kv,
    block_key,
    document_block,
    document_blocks,
    encode_blocks,
)


@dataclass(frozen=True)
class Context:
    """The keys/values a query block reads, with what producing them cost.

    Attributes:
        kv: Per layer ``0..kv_depth``, ``(keys, values)`` float32 ``(1, kv_heads, K, head_dim)``:
            block 0 then the candidates' tokens (no padding); on the fast path views into a
            context buffer, valid until that buffer's next use (a pass slot's, held meanwhile).
        seconds: ``blocks_fetch``, ``blocks_encode``, ``blocks_assemble``, seconds.
        cache: ``{"hits", "misses"}`` of the candidate blocks (store and RAM tiers).
    """

    kv: list[tuple[Any, Any]]
    seconds: dict[str, float]
    cache: dict[str, int]


def store_header(base_lm: Any, layout: BlockLayout, depth: int, kv_dtype: str) -> KVHeader:
    """What a document KV store must have been built with: the base model's hash, the cached
    layout's version and instruction, the depth ``l*``, the model's key/value heads and head
    dimension, the block length and ``kv_dtype``; no adapter (blocks never use one)."""
    cfg = base_lm.model.config
    n_heads = int(cfg.num_attention_heads)
    return KVHeader(
        model_hash=str(base_lm.identity.get("sha256") or base_lm.identity.get("name")),
        prompt_template_version=CACHE_TEMPLATE_VERSION,
        instruction_hash=layout.fingerprint(),
        layer=depth,
        kv_heads=int(getattr(cfg, "num_key_value_heads", None) or n_heads),
        head_dim=int(getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads),
        max_doc_tokens=layout.max_block_tokens,
        dtype=kv_dtype,
        adapter_hash=None,
    )


def block_arrays(lm: Any, layout: BlockLayout, kv0: Any, texts: Sequence[str], depth: int, *,
                 batch_size: int) -> list[tuple[BlockKey, Any, Any]]:
    """``(key, keys, values)`` per text: float32 numpy arrays ``(depth + 1, kv_heads, T,
    head_dim)`` encoded against block 0's ``kv0`` (texts sharing a block share a key). Call it
    under the LM's lock."""
    import torch

    blocks = [document_block(lm.tokenizer, layout, t)[0] for t in texts]
    with torch.inference_mode():
        kvs = encode_blocks(lm, kv0, blocks, depth, batch_size=batch_size)
    return [(block_key(b), k.float().cpu().numpy(), v.float().cpu().numpy()) for b, (k, v) in zip(blocks, kvs)]


@dataclass(frozen=True)
class Fetched:
    """A query's candidate blocks, before they are assembled into its context.

    Attributes:
        blocks: Per candidate block ``(keys, values)`` float32 ``(depth + 1, kv_heads, T_i,
            head_dim)`` (read-only views of the store's arrays, or computed now).
        seconds: ``blocks_fetch`` and ``blocks_encode``, seconds.
        cache: ``{"hits", "misses"}`` of the candidate blocks (store and RAM tiers).
    """

    blocks: list[tuple[Any, Any]]
    seconds: dict[str, float]
    cache: dict[str, int]


def fetch_blocks(lm: Any, source: BlockSource, kv0: Any, prompt: BlockPrompt, depth: int, *, store: Any,
                 batch_size: int, round_trip: Any = None) -> Fetched:
    """The candidates' blocks for layers ``0..depth``: from ``store``, the RAM tier ``source``,
    or computed by ``lm`` against block 0's ``kv0`` (then passed through ``round_trip``,
    :meth:`BlockSource.fetch`) and written back. Needs no context buffer, so a query reads its
    blocks while another query's pass runs."""
    import torch

    with torch.inference_mode():
        blocks, fetch = source.fetch(lm, kv0, prompt.doc_ids, depth, store=store, batch_size=batch_size,
                                     round_trip=round_trip)
    seconds = {"blocks_fetch": (fetch.seconds or {}).get("fetch", 0.0),
               "blocks_encode": (fetch.seconds or {}).get("encode", 0.0)}
    return Fetched(blocks, seconds, {"hits": fetch.hits, "misses": fetch.misses})


def assemble_context(kv0: Any, fetched: Fetched, depth: int, *, reserve: int, buffer: Any) -> Context:
    """Block 0's (``kv0``) and the fetched blocks' keys/values copied into ``buffer``, with
    ``reserve`` rows of room after them (:func:`heedrank.reranker.doccache.assemble_kv`); valid
    until ``buffer``'s next use."""
    import torch

    t0 = time.perf_counter()
    with torch.inference_mode():
        kv = assemble_kv(kv0, fetched.blocks, depth, reserve=reserve, buffer=buffer)
    return Context(kv, {**fetched.seconds, "blocks_assemble": time.perf_counter() - t0}, dict(fetched.cache))


class TokenizedBlocks:
    """Recent document texts' block token ids, whether each was cut to the budget, and store
    keys (an LRU of :attr:`size` texts, about 1 KB each), so that a search that asks which
    candidates are cold and then builds its prompt tokenises each text once. Thread-safe: its
    own lock; tokenisation runs outside it.

    Args:
        size: Texts kept.
    """

    def __init__(self, size: int = 8192) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, tuple[tuple[int, ...], bool, BlockKey]] = OrderedDict()

    def blocks(self, tokenizer: Any, layout: BlockLayout, texts: Sequence[str]) -> list[tuple[list[int], bool, BlockKey]]:
        """Per text: its block's token ids, whether its content was cut to the budget, and its
        store key; the texts not seen recently tokenised in one batched call
        (:func:`heedrank.reranker.doccache.document_blocks`)."""
        cache = self._cache
        with self._lock:
            missing = [t for t in dict.fromkeys(texts) if t not in cache]
        fresh = document_blocks(tokenizer, layout, missing)
        with self._lock:
            for text, (ids, cut) in zip(missing, fresh):
                cache[text] = (tuple(ids), cut, block_key(ids))
            out = []
            for text in texts:
                entry = cache.get(text)
                if entry is None:  # evicted by another thread in between: recompute alone
                    ids, cut = document_block(tokenizer, layout, text)
                    entry = cache[text] = (tuple(ids), cut, block_key(ids))
                cache.move_to_end(text)
                out.append((list(entry[0]), entry[1], entry[2]))
            while len(cache) > self.size:
                cache.popitem(last=False)
        return out


"""Document blocks encoded once: cached BlockRank's blocks (block 0 without the query).

Source: Gupta et al. 2025, "Scalable In-context Ranking with Generative Models"
(arXiv 2510.05396), Section 3, with this project's extension (docs/design/algorithms.md section 3.1): when block 0 holds only the fixed instruction (no query), a candidate block
attends to block 0 and itself only, at positions that restart at ``L0``. Its keys and
values for layers ``0..l*`` then depend on nothing but the model, the instruction, the
document's tokens and ``l*``: they are computed once per document (at index time, or on
first use) and every query runs only its own query block against them.

Layout of the cached prompt:

* block 0: ``<bos>`` + chat prefix + :data:`INSTRUCTION` + ``"\\n\\nDocuments:"``
  (``L0`` tokens, the same for every query);
* candidate block: ``"\\nDocument:"`` + content (cut to ``max_doc_tokens``) + ``" | END"``.
  No id and no position-dependent text: the block is the same wherever the document sits
  in a list, so the ranking is permutation invariant;
* query block: the final instruction, the query and the answer prefix, at the fixed
  position :attr:`BlockLayout.query_offset` ``= L0 + max block length`` (independent of
  the candidate set, so a document's score does not depend on which other documents
  happen to be long).

Keys are stored after rotary position embedding (as the model's own cache holds them),
which is exact because every block's positions are fixed (``L0 .. L0 + T - 1``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from heedrank.blocks import BlockKey
from heedrank.reranker.prompt import bos_ids, chat_wrap, encode_trusted, encode_untrusted, encode_untrusted_batch, truncate

INSTRUCTION = (
    "You will be given a list of documents and then a query. Read all of the documents carefully; "
    "your goal is to find the document(s) from the list that can help answer the query."
)
FINAL = "\n====== Now let's start! ======\nWhich document is most relevant to answer the query?\nQuery:"
ANSWER = "\nThe following document(s) can help answer the query:"
DOC_OPEN = "\nDocument:"
DOC_CLOSE = " | END"
CACHE_TEMPLATE_VERSION = "blockrank-cached-v1"
"""Version of the cached prompt layout; part of every document KV store's header."""

BlockKV = tuple[Any, Any]
"""One document block's keys and values: two float tensors ``(n_layers, kv_heads, T, head_dim)``."""


@dataclass(frozen=True)
class BlockLayout:
    """The query-independent part of the cached prompt.

    Attributes:
        instruction_ids: Block 0 (``L0`` token ids).
        open_ids: Token ids that open every candidate block.
        close_ids: Token ids that close every candidate block.
        max_doc_tokens: Content budget per document, in LM tokens.
        query_offset: Position of the query block's first token,
            ``L0 + len(open) + max_doc_tokens + len(close)``.
        chat_template: Whether the chat template wraps the prompt.
    """

    instruction_ids: tuple[int, ...]
    open_ids: tuple[int, ...]
    close_ids: tuple[int, ...]
    max_doc_tokens: int
    query_offset: int
    chat_template: bool

    @property
    def max_block_tokens(self) -> int:
        return len(self.open_ids) + self.max_doc_tokens + len(self.close_ids)

    def fingerprint(self) -> str:
        """Hex sha256 of everything a stored block depends on besides the model and ``l*``:
        the layout version, block 0's tokens, the block markers and the content budget."""
        h = hashlib.sha256(CACHE_TEMPLATE_VERSION.encode())
        for part in (self.instruction_ids, self.open_ids, self.close_ids, (self.max_doc_tokens,)):
            h.update(b"|" + ",".join(map(str, part)).encode())
        return h.hexdigest()


def build_layout(tokenizer: Any, max_doc_tokens: int, *, chat_template: bool = True) -> BlockLayout:
    """The cached prompt's block 0 and block markers for ``tokenizer``.

    Raises:
        ValidationError: ``max_doc_tokens < 1``.
    """
    from heedrank.errors import ValidationError

    if max_doc_tokens < 1:
        raise ValidationError(f"max_doc_tokens must be >= 1, got {max_doc_tokens}")
    wrap = chat_wrap(tokenizer, chat_template)
    block0 = bos_ids(tokenizer, wrap) + encode_trusted(tokenizer, wrap.prefix + INSTRUCTION + "\n\nDocuments:")
    open_ids = encode_trusted(tokenizer, DOC_OPEN)
    close_ids = encode_trusted(tokenizer, DOC_CLOSE)
    offset = len(block0) + len(open_ids) + max_doc_tokens + len(close_ids)
    return BlockLayout(tuple(block0), tuple(open_ids), tuple(close_ids), max_doc_tokens, offset, chat_template)


def document_block(tokenizer: Any, layout: BlockLayout, content: str) -> tuple[list[int], bool]:
    """Token ids of one candidate block and whether its content was cut to the budget."""
    body, cut = truncate(encode_untrusted(tokenizer, " " + content.strip()), layout.max_doc_tokens)
    return list(layout.open_ids) + body + list(layout.close_ids), cut


def document_blocks(tokenizer: Any, layout: BlockLayout, contents: Sequence[str]) -> list[tuple[list[int], bool]]:
    """:func:`document_block` of every content, tokenised in one batched call of the Rust
    tokenizer (no per-call overhead; its threads when cores are free). Same ids as
    :func:`document_block`, in input order."""
    if not contents:
        return []
    enc = encode_untrusted_batch(tokenizer, [" " + c.strip() for c in contents])
    out = []
    for ids in enc:
        body, cut = truncate(list(ids), layout.max_doc_tokens)
        out.append((list(layout.open_ids) + body + list(layout.close_ids), cut))
    return out


def query_block(tokenizer: Any, layout: BlockLayout, query: str, answer_prefix: str = "Final Answer: [") -> list[int]:
    """Token ids of the query block: final instruction, the query (untrusted text), the
    answer prefix; its last tokens (``:`` and `` [``) are BlockRank's signal tokens."""
    wrap = chat_wrap(tokenizer, layout.chat_template)
    return (encode_trusted(tokenizer, FINAL) + encode_untrusted(tokenizer, " " + query.strip())
            + encode_trusted(tokenizer, ANSWER + wrap.suffix + answer_prefix))


def block_key(block_ids: Sequence[int]) -> BlockKey:
    """Store key of a block: hex sha256 of its token ids (64 characters). A replaced
    document's new text gets a new key, so a stale block is never served for it."""
    return BlockKey(hashlib.sha256(",".join(map(str, block_ids)).encode()).hexdigest())


def full_cache(config: Any):
    """An empty transformers ``DynamicCache`` whose every layer keeps all keys and values.

    A model with sliding-window layers (Gemma 3: window 512 in 15 of 18 layers) would get a
    sliding cache layer there, which keeps only the last ``window - 1`` keys (and refuses
    ``crop``): the query block would silently see a cut context with misaligned mask columns
    (measured on Gemma: top 5 changed at 20 candidates). With plain layers, what a row sees
    is decided by the mask alone: BlockRank's explicit block mask (all position distances in
    the cached layout stay under the window), or transformers' sliding mask built over the
    cache's full length (ICR)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    cache = DynamicCache(config=config)
    cache.layers = [DynamicLayer() if getattr(layer, "is_sliding", False) else layer for layer in cache.layers]
    return cache


def cache_from(kv: Sequence[BlockKV], config: Any):
    """A transformers ``DynamicCache`` holding ``kv`` (per layer ``(keys, values)``); every
    update concatenates (a copy of the whole layer). Differentiable."""
    cache = full_cache(config)
    for layer, (k, v) in enumerate(kv):
        cache.update(k, v, layer)
    return cache


class ReservedKV(list):
    """:func:`assemble_kv`'s output under inference: a list of per-layer ``(keys, values)``
    (each ``(1, kv_heads, K, head_dim)``, as always) that are views into a larger storage
    with :attr:`room` free positions after position ``K`` in every head, where a query pass
    writes its own keys/values in place (:func:`query_cache`) instead of concatenating.

    Attributes:
        room: Free positions after the context, per layer and head.
    """

    room: int = 0


def _in_place_layer_class():
    """A ``DynamicLayer`` whose update writes the new keys/values into the room a
    :class:`ReservedKV` leaves after its context, returning views (no copy of the context)."""
    from transformers.cache_utils import DynamicLayer

    class InPlaceLayer(DynamicLayer):
        keys: Any  # tensors set in __init__, never None here (the base class starts them at None)
        values: Any

        def __init__(self, keys: Any, values: Any, room: int) -> None:
            super().__init__()
            self.keys, self.values, self.room = keys, values, room
            self.device = keys.device
            self.is_initialized = True

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
            n = key_states.shape[-2]
            if n > self.room or key_states.shape[:2] != self.keys.shape[:2]:
                return super().update(key_states, value_states, *args, **kwargs)  # concatenates
            k, v = (_grow(t, t.shape[-2] + n) for t in (self.keys, self.values))
            k[:, :, -n:].copy_(key_states)
            v[:, :, -n:].copy_(value_states)
            self.keys, self.values, self.room = k, v, self.room - n
            return k, v

    return InPlaceLayer


_IN_PLACE_LAYER: Any = None


def _grow(t: Any, length: int) -> Any:
    """The view of ``t`` ``(B, H, T, d)`` extended to ``length`` positions in its storage."""
    return t.as_strided((t.shape[0], t.shape[1], length, t.shape[3]), t.stride(), t.storage_offset())


def query_cache(kv: Sequence[BlockKV], config: Any, rows: int):
    """The cache a query pass of ``rows`` tokens runs against.

    Under ``torch.inference_mode``/``no_grad``, with ``kv`` a :class:`ReservedKV` whose room
    holds ``rows``: every layer writes the pass's keys/values in place after the context
    (nothing of the context is copied; the room is scratch, overwritten by the next pass).
    Otherwise (gradients enabled, no room, or inference tensors outside inference mode):
    :func:`cache_from` (concatenating, as before).
    """
    import torch

    global _IN_PLACE_LAYER
    if torch.is_grad_enabled() or not isinstance(kv, ReservedKV) or kv.room < rows:
        return cache_from(kv, config)
    if kv[0][0].is_inference() and not torch.is_inference_mode_enabled():
        return cache_from(kv, config)  # inference tensors are written in inference mode only
    if _IN_PLACE_LAYER is None:
        _IN_PLACE_LAYER = _in_place_layer_class()
    cache = full_cache(config)
    if len(cache.layers) < len(kv):
        return cache_from(kv, config)
    for layer, (k, v) in enumerate(kv):
        cache.layers[layer] = _IN_PLACE_LAYER(k, v, kv.room)
    return cache


def layer_kv(cache: Any, layers: int) -> list[BlockKV]:
    """The first ``layers`` layers' ``(keys, values)`` of a ``DynamicCache``."""
    return [(cache.layers[l].keys, cache.layers[l].values) for l in range(layers)]


def neg_inf(dtype):
    """The most negative finite value of ``dtype`` (an additive mask's "blocked")."""
    import torch

    return torch.finfo(dtype).min


def instruction_kv(lm: Any, instruction_ids: Sequence[int], layer: int) -> list[BlockKV]:
    """Keys/values of block 0 for layers ``0..layer``: per layer ``(1, kv_heads, L0, head_dim)``."""
    import torch

    from heedrank.reranker.attention import AttentionCapture, run_with_capture
    from heedrank.reranker.adapters import adapter_disabled

    cache = cache_from([], lm.model.config)
    with adapter_disabled(lm.model):  # block 0 is the base model's: a query adapter never touches it
        run_with_capture(
            lm.model.base_model, AttentionCapture(layers=(), stop_after=layer),
            input_ids=torch.tensor([list(instruction_ids)], device=lm.device), cache=cache, use_cache=True,
        )
    return layer_kv(cache, layer + 1)


def encode_blocks(
    lm: Any, kv0: Sequence[BlockKV], blocks: Sequence[Sequence[int]], layer: int, *, batch_size: int = 32,
) -> list[BlockKV]:
    """Keys/values of candidate blocks, each against block 0 only, positions from ``L0``.

    Blocks are prefilled in padded batches ordered by length (DL19 passages cut to 128
    tokens: 31% of a prompt-order batch was padding), then put back in input order. Layers
    above ``layer`` never run; no LM head. Differentiable under ``torch.enable_grad``
    (training runs through it); callers that only score wrap it in ``torch.inference_mode``.

    Args:
        lm: :class:`heedrank.reranker.lm.LoadedLM`.
        kv0: :func:`instruction_kv` output (``layer + 1`` entries).
        blocks: Token ids per block (each non-empty).
        layer: Deepest layer whose keys/values are kept (``l*``).
        batch_size: Blocks per batched prefill (bounds memory).

    Returns:
        Per block ``(keys, values)``, each float ``(layer + 1, kv_heads, T_block, head_dim)``
        in the model's dtype.
    """
    import torch

    from heedrank.reranker.attention import AttentionCapture, run_with_capture
    from heedrank.reranker.adapters import adapter_disabled

    dev = lm.device
    dtype = next(lm.model.parameters()).dtype
    L0 = kv0[0][0].shape[2]
    n_layers = layer + 1
    out: list[BlockKV | None] = [None] * len(blocks)
    order = sorted(range(len(blocks)), key=lambda i: (len(blocks[i]), i))
    for b in range(0, len(order), batch_size):
        idx = order[b : b + batch_size]
        chunk = [blocks[i] for i in idx]
        n, Lb = len(chunk), max(len(d) for d in chunk)
        ids = torch.zeros((n, Lb), dtype=torch.long, device=dev)
        valid = torch.zeros((n, Lb), dtype=torch.bool, device=dev)
        for r, d in enumerate(chunk):
            ids[r, : len(d)] = torch.tensor(list(d), device=dev)
            valid[r, : len(d)] = True
        pos = (L0 + torch.arange(Lb, device=dev)).expand(n, Lb)
        causal = torch.tril(torch.ones(Lb, Lb, dtype=torch.bool, device=dev))
        allowed = torch.cat([torch.ones(n, Lb, L0, dtype=torch.bool, device=dev), causal[None] & valid[:, None, :]], -1)
        mask = torch.zeros(allowed.shape, dtype=dtype, device=dev).masked_fill(~allowed, neg_inf(dtype))[:, None]
        cache = cache_from([(k.expand(n, -1, -1, -1), v.expand(n, -1, -1, -1)) for k, v in kv0[:n_layers]],
                            lm.model.config)
        with adapter_disabled(lm.model):  # blocks are the base model's: a query adapter keeps the store valid
            run_with_capture(
                lm.model.base_model, AttentionCapture(layers=(), stop_after=layer),
                input_ids=ids, position_ids=pos, attention_mask=mask, cache=cache, use_cache=True,
            )
        keys = torch.stack([cache.layers[l].keys[:, :, L0:] for l in range(n_layers)], dim=1)  # (n, layers, kvh, Lb, hd)
        values = torch.stack([cache.layers[l].values[:, :, L0:] for l in range(n_layers)], dim=1)
        for r, (i, d) in enumerate(zip(idx, chunk)):
            out[i] = (keys[r, :, :, : len(d)].clone(), values[r, :, :, : len(d)].clone())
    return out  # type: ignore[return-value]


class ContextBuffer:
    """Float storage for a query's context (block 0 and the candidate blocks, every layer),
    kept and reused across queries so that a query neither allocates nor page-faults its
    context (at 1,000 SmolLM2 candidates and ``l* = 15``: 3.3 GB of float32).

    Reuse policy: the storage is reused while the request fits in it and it is at most
    ``max_slack`` times the request (or at most ``small_bytes``); otherwise it is released
    and a new one of the requested size is allocated. One buffer serves one query at a
    time: the keys/values :func:`assemble_kv` returns are valid until its next call on the
    same buffer (callers hold the LM's lock across both).

    Args:
        max_slack: Largest capacity / request ratio reused.
        small_bytes: Storage up to this many bytes (both sides) is always reused when it fits.
    """

    def __init__(self, *, max_slack: float = 4.0, small_bytes: int = 256 << 20) -> None:
        self.max_slack = max_slack
        self.small_bytes = small_bytes
        self._k: Any = None
        self._v: Any = None

    @property
    def nbytes(self) -> int:
        """Bytes held (keys and values)."""
        return 0 if self._k is None else 2 * self._k.numel() * self._k.element_size()

    def storage(self, n_layers: int, kv_heads: int, tokens: int, head_dim: int, dtype: Any, device: Any) -> tuple[Any, Any]:
        """Keys and values storage, each ``(n_layers, kv_heads, capacity, head_dim)`` with
        ``capacity >= tokens``, contents undefined."""
        import torch

        k = self._k
        if k is not None:
            fits = (k.shape[0], k.shape[1], k.shape[3]) == (n_layers, kv_heads, head_dim) and k.dtype == dtype \
                and k.device == torch.device(device) and k.shape[2] >= tokens \
                and (torch.is_inference_mode_enabled() or not k.is_inference())  # else not writable here
            if fits and (k.shape[2] <= self.max_slack * tokens or self.nbytes <= self.small_bytes):
                return self._k, self._v
            self.release()
        shape = (n_layers, kv_heads, tokens, head_dim)
        self._k = torch.empty(shape, dtype=dtype, device=device)
        self._v = torch.empty(shape, dtype=dtype, device=device)
        return self._k, self._v

    def release(self) -> None:
        """Drop the storage (the next request allocates)."""
        self._k = self._v = None


def assemble_kv(kv0: Sequence[BlockKV], doc_kv: Sequence[BlockKV], layer: int, *, reserve: int = 0,
                buffer: ContextBuffer | None = None) -> list[BlockKV]:
    """Block 0's and the candidates' keys/values concatenated per layer (no padding):
    per layer ``(1, kv_heads, L0 + D, head_dim)`` in block 0's dtype, the input
    :func:`heedrank.reranker.blockforward.query_pass` takes.

    Args:
        kv0: Block 0, per layer ``(1, kv_heads, L0, head_dim)`` (``layer + 1`` entries or more).
        doc_kv: Per candidate ``(keys, values)``, each ``(n_layers >= layer + 1, kv_heads,
            T_i, head_dim)``, any float dtype (a float16 block is widened while copied).
        layer: Deepest layer kept (``l*``).
        reserve: Under inference (no gradients): positions left free after the context in
            every layer and head, where a query pass of up to ``reserve`` tokens writes its
            own keys/values in place (:func:`query_cache`). Ignored with gradients enabled.
        buffer: Under inference: storage reused across queries (:class:`ContextBuffer`);
            ``None`` allocates. Ignored with gradients enabled.

    Returns:
        With gradients enabled: a list of fresh tensors (differentiable through ``kv0``).
        Otherwise a :class:`ReservedKV` (a list of the same shapes) of views into one
        storage per side, with ``room >= reserve``; each block is copied once for all its
        layers.
    """
    import torch

    L0 = kv0[0][0].shape[2]
    total = L0 + sum(int(k.shape[2]) for k, _ in doc_kv)
    n_layers = layer + 1
    if torch.is_grad_enabled():
        out: list[BlockKV] = []
        for l in range(n_layers):
            pair = []
            for side in (0, 1):
                first = kv0[l][side]
                buf = torch.empty((1, first.shape[1], total, first.shape[3]), dtype=first.dtype, device=first.device)
                buf[:, :, :L0] = first
                pos = L0
                for block in doc_kv:  # one pass per block; a float16 block is converted while copied
                    t = block[side][l]
                    buf[0, :, pos : pos + t.shape[1]].copy_(t)
                    pos += t.shape[1]
                pair.append(buf)
            out.append((pair[0], pair[1]))
        return out
    first = kv0[0][0]
    shape = (n_layers, first.shape[1], total + max(0, reserve), first.shape[3])
    if buffer is not None:
        ks, vs = buffer.storage(*shape, dtype=first.dtype, device=first.device)
    else:
        ks, vs = torch.empty(shape, dtype=first.dtype, device=first.device), \
            torch.empty(shape, dtype=first.dtype, device=first.device)
    for l in range(n_layers):
        ks[l, :, :L0].copy_(kv0[l][0][0])
        vs[l, :, :L0].copy_(kv0[l][1][0])
    pos = L0
    for bk, bv in doc_kv:  # one copy per block and side, all layers at once
        T = bk.shape[2]
        ks[:, :, pos : pos + T].copy_(bk[:n_layers])
        vs[:, :, pos : pos + T].copy_(bv[:n_layers])
        pos += T
    out = ReservedKV((ks[l : l + 1, :, :total], vs[l : l + 1, :, :total]) for l in range(n_layers))
    out.room = ks.shape[2] - total
    return out


def _as_tensor(a: Any, device: Any) -> Any:
    """A tensor over a store's array without a copy on the CPU (the array is read-only and
    is only ever read: blocks are copied into the query's context by :func:`assemble_kv`).
    Call under ``warnings.catch_warnings`` ignoring ``UserWarning`` ("non-writable array")."""
    import torch

    t = torch.from_numpy(a)
    return t if str(device) == "cpu" else t.to(device)


@dataclass
class BlockFetch:
    """Where one query's candidate blocks came from.

    Attributes:
        hits: Blocks read from the persistent store or the RAM cache.
        misses: Blocks computed now (and written back when a writable store was given).
        seconds: Wall time in seconds: ``{"fetch": ..., "encode": ...}``.
    """

    hits: int = 0
    misses: int = 0
    seconds: dict[str, float] | None = None


class BlockSource:
    """Candidate blocks for the cached path: a RAM LRU, then a persistent store (a
    collection's document KV store, :class:`heedrank.protocols.BlockStore`), then the LM.

    Blocks are keyed by :func:`block_key` (the hash of their token ids), so the same text
    shares one entry across collections and a replaced document never reads a stale block.
    Misses are encoded in one batched call and written back to the store when one is given
    (whose own RAM cache then serves them); those the store does not take (none given, readonly,
    not admitted, over its disk budget) are kept in this RAM cache. Thread-safe (the LRU and the
    store lock themselves): concurrent fetches may both encode a block cold for both, and write
    the same block twice.

    Args:
        memory_bytes: RAM budget for blocks in bytes (float32 tensors), e.g. the ad-hoc
            documents of ``/rerank``; ``0`` disables it.
    """

    def __init__(self, memory_bytes: int) -> None:
        from heedrank.lru import ByteLRU

        self.memory = ByteLRU(memory_bytes)

    def fetch(
        self, lm: Any, kv0: Sequence[BlockKV], blocks: Sequence[Sequence[int]], layer: int, *,
        store: Any = None, batch_size: int = 32, round_trip: Any = None,
    ) -> tuple[list[BlockKV], BlockFetch]:
        """Blocks ``(keys, values)`` in input order (float32 tensors on the LM's device,
        ``(layer + 1, kv_heads, T_i, head_dim)``) and where they came from. ``round_trip``
        (:meth:`heedrank.index.kv.codec.Codec.round_trip` of a quantised store dtype, or
        ``None``) is applied to the blocks encoded now, so that they are what the store gives
        back: a document's score is the same cold or warm, with or without a store.

        Raises:
            KVStoreError: the store failed to write (e.g. a full disk); reads that fail are
                misses, never errors.
        """
        import time


        t0 = time.perf_counter()
        keys = [block_key(b) for b in blocks]
        out: list[BlockKV | None] = [None] * len(blocks)
        want: dict[BlockKey, list[int]] = {}
        for i, k in enumerate(keys):
            hit = self.memory.get(k)
            if hit is not None:
                out[i] = hit
            else:
                want.setdefault(k, []).append(i)
        hits = len(blocks) - sum(len(v) for v in want.values())
        if want and store is not None:
            import warnings

            found, _ = store.get_many(list(want))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # "non-writable array": never written here
                for k, (kk, vv) in found.items():
                    kv = (_as_tensor(kk, lm.device), _as_tensor(vv, lm.device))
                    for i in want.pop(k):
                        out[i] = kv
                        hits += 1  # the store keeps its own RAM cache: not duplicated here
        t1 = time.perf_counter()
        misses = 0
        if want:
            todo = list(want)
            fresh = encode_blocks(lm, kv0, [blocks[want[k][0]] for k in todo], layer, batch_size=batch_size)
            fresh = [(k.float(), v.float()) for k, v in fresh]
            writable = store is not None and not store.readonly
            if writable:  # the store quantises the block itself: it gets it as computed
                store.put_many({k: (kv[0].cpu().numpy(), kv[1].cpu().numpy()) for k, kv in zip(todo, fresh)})
            if round_trip is not None:  # what a later read of the stored block gives
                fresh = [tuple(_as_tensor(a, lm.device) for a in round_trip(k.cpu().numpy(), v.cpu().numpy()))
                         for k, v in fresh]
            for k, kv in zip(todo, fresh):
                for i in want[k]:
                    out[i] = kv
                    misses += 1
                # kept here when the store did not take it (none, readonly, not admitted, over its budget)
                if not writable or not store.contains(k):
                    self.memory.put(k, kv, kv[0].nbytes + kv[1].nbytes)
        t2 = time.perf_counter()
        return out, BlockFetch(hits, misses, {"fetch": t1 - t0, "encode": t2 - t1})  # type: ignore[return-value]

"""Document blocks encoded once: BlockRank's cached mode (``query_in_instruction=false``).

Source: Gupta et al. 2025, "Scalable In-context Ranking with Generative Models"
(arXiv 2510.05396), Section 3; ``shared/design/ALGORITHMS.md`` section 3, "planned
extension": when block 0 holds only the fixed instruction (no query), a candidate block
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

from attnrank.reranker.prompt import bos_ids, chat_wrap, encode_trusted, encode_untrusted, truncate

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
    from attnrank.errors import ValidationError

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


def query_block(tokenizer: Any, layout: BlockLayout, query: str, answer_prefix: str = "Final Answer: [") -> list[int]:
    """Token ids of the query block: final instruction, the query (untrusted text), the
    answer prefix; its last tokens (``:`` and `` [``) are BlockRank's signal tokens."""
    wrap = chat_wrap(tokenizer, layout.chat_template)
    return (encode_trusted(tokenizer, FINAL) + encode_untrusted(tokenizer, " " + query.strip())
            + encode_trusted(tokenizer, ANSWER + wrap.suffix + answer_prefix))


def block_key(block_ids: Sequence[int]) -> str:
    """Store key of a block: hex sha256 of its token ids. A replaced document's new text
    gets a new key, so a stale block is never served for it."""
    return hashlib.sha256(",".join(map(str, block_ids)).encode()).hexdigest()


def cache_from(kv: Sequence[BlockKV], config: Any):
    """A transformers ``DynamicCache`` holding ``kv`` (per layer ``(keys, values)``)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=config)
    for layer, (k, v) in enumerate(kv):
        cache.update(k, v, layer)
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

    from attnrank.reranker.attention import AttentionCapture, run_with_capture

    cache = cache_from([], lm.model.config)
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
        lm: :class:`attnrank.reranker.lm.LoadedLM`.
        kv0: :func:`instruction_kv` output (``layer + 1`` entries).
        blocks: Token ids per block (each non-empty).
        layer: Deepest layer whose keys/values are kept (``l*``).
        batch_size: Blocks per batched prefill (bounds memory).

    Returns:
        Per block ``(keys, values)``, each float ``(layer + 1, kv_heads, T_block, head_dim)``
        in the model's dtype.
    """
    import torch

    from attnrank.reranker.attention import AttentionCapture, run_with_capture

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
        run_with_capture(
            lm.model.base_model, AttentionCapture(layers=(), stop_after=layer),
            input_ids=ids, position_ids=pos, attention_mask=mask, cache=cache, use_cache=True,
        )
        keys = torch.stack([cache.layers[l].keys[:, :, L0:] for l in range(n_layers)], dim=1)  # (n, layers, kvh, Lb, hd)
        values = torch.stack([cache.layers[l].values[:, :, L0:] for l in range(n_layers)], dim=1)
        for r, (i, d) in enumerate(zip(idx, chunk)):
            out[i] = (keys[r, :, :, : len(d)].clone(), values[r, :, :, : len(d)].clone())
    return out  # type: ignore[return-value]


def assemble_kv(kv0: Sequence[BlockKV], doc_kv: Sequence[BlockKV], layer: int) -> list[BlockKV]:
    """Block 0's and the candidates' keys/values concatenated per layer (no padding):
    per layer ``(1, kv_heads, L0 + D, head_dim)``, the input :func:`query_pass` takes."""
    import torch

    L0 = kv0[0][0].shape[2]
    total = L0 + sum(int(k.shape[2]) for k, _ in doc_kv)
    out: list[BlockKV] = []
    for l in range(layer + 1):
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




def _as_tensor(a: Any, device: Any) -> Any:
    """A tensor over a store's array without a copy on the CPU (the array is read-only and
    is only ever read: blocks are copied into the query's context by :func:`assemble_kv`)."""
    import warnings

    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "non-writable array": never written here
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
    collection's document KV store, :class:`attnrank.protocols.BlockStore`), then the LM.

    Blocks are keyed by :func:`block_key` (the hash of their token ids), so the same text
    shares one entry across collections and a replaced document never reads a stale block.
    Misses are encoded in one batched call and written back to the store when one is given
    (whose own RAM cache then serves them), else kept in this RAM cache. Thread-safe when the
    caller serialises LM use (the reranker's lock).

    Args:
        memory_bytes: RAM budget for blocks in bytes (float32 tensors), e.g. the ad-hoc
            documents of ``/rerank``; ``0`` disables it.
    """

    def __init__(self, memory_bytes: int) -> None:
        from attnrank.lru import ByteLRU

        self.memory = ByteLRU(memory_bytes)

    def fetch(
        self, lm: Any, kv0: Sequence[BlockKV], blocks: Sequence[Sequence[int]], layer: int, *,
        store: Any = None, batch_size: int = 32,
    ) -> tuple[list[BlockKV], BlockFetch]:
        """Blocks ``(keys, values)`` in input order (float32 tensors on the LM's device,
        ``(layer + 1, kv_heads, T_i, head_dim)``) and where they came from.

        Raises:
            KVStoreError: the store failed to write (e.g. a full disk); reads that fail are
                misses, never errors.
        """
        import time


        t0 = time.perf_counter()
        keys = [block_key(b) for b in blocks]
        out: list[BlockKV | None] = [None] * len(blocks)
        want: dict[str, list[int]] = {}
        for i, k in enumerate(keys):
            hit = self.memory.get(k)
            if hit is not None:
                out[i] = hit
            else:
                want.setdefault(k, []).append(i)
        hits = len(blocks) - sum(len(v) for v in want.values())
        if want and store is not None:
            found, _ = store.get_many(list(want))
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
            if store is not None and not getattr(store, "readonly", False):
                store.put_many({k: (kv[0].cpu().numpy(), kv[1].cpu().numpy()) for k, kv in zip(todo, fresh)})
            for k, kv in zip(todo, fresh):
                for i in want[k]:
                    out[i] = kv
                    misses += 1
                if store is None or getattr(store, "readonly", False):
                    self.memory.put(k, kv, kv[0].nbytes + kv[1].nbytes)
        t2 = time.perf_counter()
        return out, BlockFetch(hits, misses, {"fetch": t1 - t0, "encode": t2 - t1})  # type: ignore[return-value]

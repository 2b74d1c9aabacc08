"""BlockRank: block-sparse in-context ranking, exact and linear in the number of candidates.

Source: Gupta et al. 2025, "Scalable In-context Ranking with Generative Models"
(arXiv 2510.05396), Sections 3-4 (repo nilesh2797/BlockRank); specified in
``shared/design/ALGORITHMS.md`` section 3.

Blocks: block 0 = instruction with the query; blocks 1..N = one per candidate,
``ID: i | CONTENT: <d_i> | END ID: i`` (``i`` counts from 0 in first-stage order); block
N+1 = the query block ending in the answer prefix ``Final Answer: [`` whose last
``n_signal`` tokens (``:`` and `` [``) are the *signal tokens*.

Attention: block 0 is causal over itself; each candidate block sees all of block 0 and
itself causally, nothing of other candidates; the query block sees everything before it.
Positions: block 0 at ``0..L0-1``; every candidate block restarts at ``L0``; the query block
starts at ``query_offset`` (default ``L0 + block length``, **our choice**, inside the
trained context; the paper uses 8192/16384).

Exact linear forward (:func:`block_forward`): (1) prefill block 0 once; (2) prefill the
candidate blocks as padded batches against block 0's cached keys/values with restarted
positions; (3) concatenate block 0's and the candidates' keys/values (padding dropped) and
run the query block against them. Only layers ``0..l*`` run; no LM head. Cost is linear in
``N``. :func:`reference_forward` computes the same in one pass with the explicit 4-D
block-sparse mask (quadratic; for tests). Both are differentiable when called under
``torch.enable_grad`` (training reuses them).

Score (``scoring="signal"``): at layer ``l*`` (default ``round(0.6 L)``),
``z_ij = q_i . k_j / sqrt(d)`` from each signal token ``i`` to candidate tokens ``j``
only; ``alpha_ij = softmax_j(z_ij)``; ``S(d) = mean_heads mean_signal sum_{j in d} alpha_ij``.
Scores are probabilities: in [0, 1], summing to 1 over the candidates of one query.
``scoring="calibrated"`` reads ICR's calibrated query-span attention (layers ``0..l*``,
``N/A`` query, per-document ``mean - 2 std`` mask) through the same block structure; its
scores are unitless differences of attention mass.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from attnrank.config import RerankerConfig
from attnrank.errors import ContextOverflowError, ValidationError
from attnrank.protocols import RerankResult
from attnrank.types import Document, Query, Ranking, ScoredDoc
from reranker.base import AttentionReranker
from reranker.icr import CALIBRATION_QUERY, masked_document_scores
from reranker.prompt import bos_ids, chat_wrap, encode_trusted, encode_untrusted, truncate

logger = logging.getLogger(__name__)

INSTRUCTION = (
    "You will be given a query and a list of documents. Each document will be formatted as "
    "ID: <id> | CONTENT: <content> | END ID: <id>. You need to read carefully and understand all of "
    "them and your goal is to find all document(s) from the list that can help answer the query."
)
FINAL = (
    "\n====== Now let's start! ======\n"
    "Which document is most relevant to answer the query? Print out the ID of the document.\nQuery:"
)
ANSWER_PREFIX = "Final Answer: ["


@dataclass(frozen=True)
class BlockPrompt:
    """Token ids of a BlockRank prompt.

    Attributes:
        instruction_ids: Block 0 (``L0`` tokens), query included.
        doc_ids: Candidate blocks, first-stage order.
        query_ids: Query block; its last ``n_signal`` tokens are the signal tokens.
        calib_ids: Query block with the content-free query ``N/A`` (calibrated scoring).
        n_signal: Number of signal tokens.
        truncated: Per candidate, whether its content was cut to ``max_doc_tokens``.
        query_offset: Position of the query block's first token.
        query_text: The query (for ReAttn's query-overlap test).
    """

    instruction_ids: list[int]
    doc_ids: list[list[int]]
    query_ids: list[int]
    calib_ids: list[int]
    n_signal: int
    truncated: list[bool]
    query_offset: int
    query_text: str = ""

    @property
    def block_length(self) -> int:
        return max((len(d) for d in self.doc_ids), default=0)

    @property
    def doc_lengths(self) -> list[int]:
        return [len(d) for d in self.doc_ids]

    @property
    def total_tokens(self) -> int:
        return len(self.instruction_ids) + sum(self.doc_lengths) + len(self.query_ids)


@dataclass
class BlockAttention:
    """Attention read at the scoring layer.

    Attributes:
        logits: float32 ``(heads, rows, D)``: raw logits of the captured query-block rows
            (the signal tokens) to the ``D`` candidate tokens (concatenated, no padding).
        doc_lengths: Tokens per candidate (sums to ``D``).
        seconds: Stage timings in seconds.
    """

    logits: Any
    doc_lengths: list[int]
    seconds: dict[str, float] = field(default_factory=dict)


def _cache_from(kv: list[tuple[Any, Any]], config: Any):
    from transformers import DynamicCache

    cache = DynamicCache(config=config)
    for layer, (k, v) in enumerate(kv):
        cache.update(k, v, layer)
    return cache


def _layer_kv(cache: Any, layers: int) -> list[tuple[Any, Any]]:
    return [(cache.layers[l].keys, cache.layers[l].values) for l in range(layers)]


def _neg(dtype):
    import torch

    return torch.finfo(dtype).min


def context_kv(lm: Any, prompt: BlockPrompt, layer: int, *, doc_batch_size: int = 64) -> tuple[list[tuple[Any, Any]], dict[str, float]]:
    """Steps (1)-(2) of the linear forward: keys/values of block 0 and of every candidate
    block (each against block 0 only, positions restarting at ``L0``), for layers
    ``0..layer``, concatenated without padding.

    Candidate blocks depend only on block 0 and themselves, so this is also the part a
    document KV cache can hold (ALGORITHMS.md section 3, ``query_in_instruction=false``).

    Returns:
        ``([(keys, values)] per layer, each (1, kv_heads, L0 + D, head_dim)), timings``.
    """
    import torch

    from reranker.attention import AttentionCapture, run_with_capture

    base = lm.model.base_model
    cfg = lm.model.config
    dev = lm.device
    dtype = next(lm.model.parameters()).dtype
    n_layers = layer + 1
    timings: dict[str, float] = {}
    L0 = len(prompt.instruction_ids)

    # (1) block 0
    t0 = time.perf_counter()
    cache0 = _cache_from([], cfg)
    run_with_capture(
        base, AttentionCapture(layers=(), stop_after=layer),
        input_ids=torch.tensor([prompt.instruction_ids], device=dev), cache=cache0, use_cache=True,
    )
    kv0 = _layer_kv(cache0, n_layers)
    timings["instruction"] = time.perf_counter() - t0

    # (2) candidate blocks, batched, each against block 0 only. Blocks are batched in order
    # of length so that a batch pads little (DL19 passages cut to 128 tokens: 31% of a
    # prompt-order batch was padding), then put back in prompt order.
    t1 = time.perf_counter()
    docs = prompt.doc_ids
    per_doc: list[list[tuple[Any, Any]] | None] = [None] * len(docs)
    by_length = sorted(range(len(docs)), key=lambda i: (len(docs[i]), i))
    for b in range(0, len(docs), doc_batch_size):
        order = by_length[b : b + doc_batch_size]
        chunk = [docs[i] for i in order]
        n, Lb = len(chunk), max(len(d) for d in chunk)
        ids = torch.zeros((n, Lb), dtype=torch.long, device=dev)
        valid = torch.zeros((n, Lb), dtype=torch.bool, device=dev)
        for i, d in enumerate(chunk):
            ids[i, : len(d)] = torch.tensor(d, device=dev)
            valid[i, : len(d)] = True
        pos = (L0 + torch.arange(Lb, device=dev)).expand(n, Lb)
        causal = torch.tril(torch.ones(Lb, Lb, dtype=torch.bool, device=dev))
        allowed_self = causal[None] & valid[:, None, :]
        allowed = torch.cat([torch.ones(n, Lb, L0, dtype=torch.bool, device=dev), allowed_self], dim=-1)
        mask = torch.zeros(allowed.shape, dtype=dtype, device=dev).masked_fill(~allowed, _neg(dtype))[:, None]
        cache = _cache_from([(k.expand(n, -1, -1, -1), v.expand(n, -1, -1, -1)) for k, v in kv0], cfg)
        run_with_capture(
            base, AttentionCapture(layers=(), stop_after=layer),
            input_ids=ids, position_ids=pos, attention_mask=mask, cache=cache, use_cache=True,
        )
        for row, (i, d) in enumerate(zip(order, chunk)):
            per_doc[i] = [
                (cache.layers[l].keys[row : row + 1, :, L0 : L0 + len(d)],
                 cache.layers[l].values[row : row + 1, :, L0 : L0 + len(d)])
                for l in range(n_layers)
            ]
    timings["documents"] = time.perf_counter() - t1
    kv = [
        (torch.cat([kv0[l][0]] + [pd[l][0] for pd in per_doc], dim=2),  # type: ignore[index]
         torch.cat([kv0[l][1]] + [pd[l][1] for pd in per_doc], dim=2))  # type: ignore[index]
        for l in range(n_layers)
    ]
    return kv, timings


def query_pass(
    lm: Any, prompt: BlockPrompt, kv: list[tuple[Any, Any]], capture: Any, *,
    query_ids: list[int] | None = None, stop: bool = True,
) -> Any:
    """Step (3): the query block against block 0 and every candidate token.

    Args:
        kv: :func:`context_kv` output.
        capture: :class:`reranker.attention.AttentionCapture` (its ``stop_after`` decides
            where the pass ends).
        query_ids: Query block (default ``prompt.query_ids``), possibly followed by answer
            tokens (training).
        stop: When ``False`` the capture must not stop early and the model output (hidden
            states of the query block) is returned.

    Returns:
        The base model's output, or ``None`` when the pass stopped early.
    """
    import torch

    from reranker.attention import run_with_capture

    dev = lm.device
    dtype = next(lm.model.parameters()).dtype
    qids = prompt.query_ids if query_ids is None else query_ids
    Lq, K = len(qids), kv[0][0].shape[2]
    qcache = _cache_from(kv, lm.model.config)
    allowed = torch.cat(
        [torch.ones(Lq, K, dtype=torch.bool, device=dev), torch.tril(torch.ones(Lq, Lq, dtype=torch.bool, device=dev))],
        dim=-1,
    )
    qmask = torch.zeros(allowed.shape, dtype=dtype, device=dev).masked_fill(~allowed, _neg(dtype))[None, None]
    qpos = (prompt.query_offset + torch.arange(Lq, device=dev))[None]
    return run_with_capture(
        lm.model.base_model, capture, input_ids=torch.tensor([qids], device=dev), position_ids=qpos,
        attention_mask=qmask, cache=qcache, use_cache=True,
    )


def block_forward(
    lm: Any,
    prompt: BlockPrompt,
    layer: int,
    *,
    query_ids: list[int] | None = None,
    mode: str = "logits",
    read_layers: Sequence[int] | None = None,
    doc_batch_size: int = 64,
) -> tuple[dict[int, Any], dict[str, float]]:
    """Exact linear BlockRank forward up to ``layer`` (inclusive): :func:`context_kv` then
    :func:`query_pass`.

    Args:
        lm: :class:`reranker.lm.LoadedLM`.
        prompt: The block prompt.
        layer: Scoring layer ``l*``: no layer above it runs.
        query_ids: Query block to run (default ``prompt.query_ids``).
        mode: ``"logits"``: capture the signal rows' raw logits;
            ``"mean"``: capture all query rows' mean attention probabilities.
        read_layers: Layers captured, each ``<= layer`` (default: ``[layer]``).
        doc_batch_size: Candidate blocks per batched prefill (bounds memory).

    Returns:
        ``({layer: tensor}, timings)`` where tensors are ``(1, heads, rows, K)`` logits or
        ``(1, heads, K)`` mean probabilities over the keys ``K = L0 + D + Lq`` laid out as
        block 0, candidate tokens (concatenated in order, no padding), query block.
    """
    import torch

    from reranker.attention import AttentionCapture

    kv, timings = context_kv(lm, prompt, layer, doc_batch_size=doc_batch_size)
    t2 = time.perf_counter()
    Lq = len(prompt.query_ids if query_ids is None else query_ids)
    if mode == "logits":
        cap = AttentionCapture(
            layers=set(read_layers or [layer]), rows=slice(Lq - prompt.n_signal, Lq), mode="logits", stop_after=layer,
            detach=not torch.is_grad_enabled(),
        )
    else:
        cap = AttentionCapture(layers=set(read_layers or [layer]), mode="mean", stop_after=layer)
    query_pass(lm, prompt, kv, cap, query_ids=query_ids)
    timings["query"] = time.perf_counter() - t2
    return cap.out, timings


def reference_forward(lm: Any, prompt: BlockPrompt, layer: int) -> Any:
    """The same signal-token logits from ONE pass with the explicit block-sparse 4-D mask.

    Quadratic in the prompt length; an oracle for :func:`block_forward`.

    Returns:
        ``(1, heads, n_signal, S)`` raw logits at ``layer`` over all ``S`` prompt tokens laid
        out as block 0, candidates (in order), query block.
    """
    import torch

    from reranker.attention import AttentionCapture, run_with_capture

    dev = lm.device
    dtype = next(lm.model.parameters()).dtype
    L0 = len(prompt.instruction_ids)
    ids = list(prompt.instruction_ids)
    pos = list(range(L0))
    seg = [0] * L0  # 0 = block 0, i+1 = candidate i, -1 = query block
    for i, d in enumerate(prompt.doc_ids):
        ids += d
        pos += list(range(L0, L0 + len(d)))
        seg += [i + 1] * len(d)
    Lq = len(prompt.query_ids)
    ids += prompt.query_ids
    pos += list(range(prompt.query_offset, prompt.query_offset + Lq))
    seg += [-1] * Lq
    S = len(ids)
    s = torch.tensor(seg, device=dev)
    idx = torch.arange(S, device=dev)
    causal = idx[None, :] <= idx[:, None]
    row, col = s[:, None], s[None, :]
    allowed = causal & ((row == -1) | (col == 0) | (row == col))
    mask = torch.zeros(S, S, dtype=dtype, device=dev).masked_fill(~allowed, _neg(dtype))[None, None]
    cap = AttentionCapture(layers={layer}, rows=slice(S - prompt.n_signal, S), mode="logits", stop_after=layer)
    run_with_capture(
        lm.model.base_model, cap,
        input_ids=torch.tensor([ids], device=dev), position_ids=torch.tensor([pos], device=dev),
        attention_mask=mask,
    )
    return cap.out[layer]


def signal_scores(logits: Any, L0: int, doc_lengths: Sequence[int]) -> Any:
    """``S(d)``: document-restricted softmax of signal-token logits, summed per document,
    averaged over heads and signal tokens.

    Args:
        logits: ``(1, heads, n_signal, K)`` raw logits with keys laid out as block 0
            (``L0``), candidate tokens (``sum(doc_lengths)``), then anything after.
        L0: Block 0 length.
        doc_lengths: Tokens per candidate.

    Returns:
        float tensor ``(N,)`` summing to 1 (differentiable).
    """
    import torch

    D = sum(doc_lengths)
    z = logits[0, :, :, L0 : L0 + D]
    alpha = torch.softmax(z.float(), dim=-1)  # (H, n_signal, D)
    owner = torch.repeat_interleave(
        torch.arange(len(doc_lengths), device=z.device), torch.tensor(doc_lengths, device=z.device)
    )
    per_doc = torch.zeros(alpha.shape[0], alpha.shape[1], len(doc_lengths), device=z.device, dtype=alpha.dtype)
    per_doc = per_doc.index_add(2, owner, alpha)
    return per_doc.mean(dim=(0, 1))


def signal_token_mass(logits: Any, L0: int, n_doc_tokens: int, heads: Sequence[int] | None = None) -> Any:
    """Per-token attention mass of the signal tokens over the candidate tokens.

    Args:
        logits: ``(1, heads, n_signal, K)`` raw logits (keys: block 0, candidates, ...).
        L0: Block 0 length.
        n_doc_tokens: ``D``, total candidate tokens.
        heads: Head indices averaged (default: all).

    Returns:
        float tensor ``(D,)``: ``mean_heads mean_signal alpha_ij`` (sums to 1).
    """
    import torch

    z = logits[0, :, :, L0 : L0 + n_doc_tokens]
    if heads is not None:
        z = z[list(heads)]
    return torch.softmax(z.float(), dim=-1).mean(dim=(0, 1))


class BlockRankReranker(AttentionReranker):
    """BlockRank reranker (registry name ``"blockrank"``).

    Options (``RerankerConfig.options``):
        layer (int | None): scoring layer ``l*``; default ``round(0.6 * L)``.
        scoring ("signal" | "calibrated", default "signal"): see module docstring.
        query_offset (int | None): first position of the query block; default ``L0 + block length``.
        n_signal (int, default 2): signal tokens at the end of the answer prefix.
        chat_template (bool, default True): wrap in the model's chat template.
        doc_batch_size (int, default 64): candidate blocks per batched prefill.
        mask_std (float | None, default 2.0): token mask of the calibrated scoring.
        heads ("all" | "qr" | path | list of [layer, head]): with ``scoring="signal"``,
            average the signal attention of these heads (each read at its own layer)
            instead of all heads of ``l*``, and stop after the deepest selected layer.
        reattn (bool | {idf, entropy, gamma}): ReAttn re-weighting of the signal tokens'
            per-token attention mass (ALGORITHMS.md section 4) before summing per document.
    """

    name = "blockrank"
    template_version = "v1"

    def __init__(self, config: RerankerConfig, lm: Any = None) -> None:
        super().__init__(config, lm)
        from reranker.reattn import ReAttnConfig

        self.reattn = ReAttnConfig.parse(self.option("reattn", None))
        if self.option("heads", None) == "learned":
            raise ValidationError("heads='learned' is available for ICR only; use 'qr', a path or a list with blockrank")
        self._heads: list[tuple[int, int]] | None | bool = False

    @property
    def heads(self) -> list[tuple[int, int]] | None:
        """Selected ``(layer, head)`` pairs, or ``None`` for all heads of ``l*``."""
        if self._heads is False:
            from reranker.heads import resolve_heads

            heads, _ = resolve_heads(self.option("heads", None), self.lm.identity)
            for l, h in heads or []:
                if not (0 <= l < self.lm.num_layers and 0 <= h < self.lm.num_heads):
                    raise ValidationError(f"head ({l}, {h}) does not exist in this model")
            self._heads = heads
        return self._heads  # type: ignore[return-value]

    def token_mass(self, prompt: BlockPrompt) -> tuple[Any, dict[str, float]]:
        """Signal-token attention mass per candidate token, ``(D,)`` summing to 1, and timings."""
        import torch

        L0 = len(prompt.instruction_ids)
        D = sum(prompt.doc_lengths)
        bs = int(self.option("doc_batch_size", 64))
        heads = self.heads
        read = sorted({l for l, _ in heads}) if heads else [self.layer]
        with torch.inference_mode():
            out, t = block_forward(self.lm, prompt, max(read), read_layers=read, doc_batch_size=bs)
        if not heads:
            return signal_token_mass(out[self.layer], L0, D), t
        by_layer: dict[int, list[int]] = {}
        for l, h in heads:
            by_layer.setdefault(l, []).append(h)
        total = sum(signal_token_mass(out[l], L0, D, hs) * len(hs) for l, hs in by_layer.items())
        return total / len(heads), t

    @property
    def layer(self) -> int:
        layer = self.option("layer", None)
        n = self.lm.num_layers
        layer = round(0.6 * n) if layer is None else int(layer)
        if not 0 <= layer < n:
            raise ValidationError(f"layer must be in [0, {n - 1}] for this model, got {layer}")
        return layer

    def build_prompt(self, query: str, candidates: Sequence[Document]) -> BlockPrompt:
        """Tokenise the block prompt (candidates in first-stage order, ids from 0).

        Raises:
            ContextOverflowError: the query block would sit past the model's positions.
        """
        tok = self.lm.tokenizer
        wrap = chat_wrap(tok, self.option("chat_template", True))
        q = " " + query.strip()
        block0 = (
            bos_ids(tok, wrap)
            + encode_trusted(tok, wrap.prefix + INSTRUCTION + "\nQuery:")
            + encode_untrusted(tok, q)
            + encode_trusted(tok, "\n\nDocuments:")
        )
        docs, truncated = [], []
        for i, doc in enumerate(candidates):
            content, cut = truncate(encode_untrusted(tok, " " + doc.content.strip()), self.config.max_doc_tokens)
            docs.append(encode_trusted(tok, f"\nID: {i} | CONTENT:") + content + encode_trusted(tok, f" | END ID: {i}"))
            truncated.append(cut)

        def qblock(text: str) -> list[int]:
            return (
                encode_trusted(tok, FINAL) + encode_untrusted(tok, text)
                + encode_trusted(tok, "\nThe following document(s) can help answer the query:" + wrap.suffix + ANSWER_PREFIX)
            )

        L0 = len(block0)
        block_len = max((len(d) for d in docs), default=0)
        offset = self.option("query_offset", None)
        offset = L0 + block_len if offset is None else int(offset)
        prompt = BlockPrompt(block0, docs, qblock(q), qblock(" " + CALIBRATION_QUERY),
                             int(self.option("n_signal", 2)), truncated, offset, query.strip())
        end = offset + max(len(prompt.query_ids), len(prompt.calib_ids))
        if end > self.lm.max_positions or L0 + block_len > offset:
            raise ContextOverflowError(
                f"the query block would span positions up to {end} (offset {offset}, block 0 {L0}, block {block_len}); "
                f"the model has {self.lm.max_positions}: lower max_doc_tokens or query_offset",
                max_candidates=len(candidates) if L0 + block_len <= offset else 0,
            )
        return prompt

    def scores(self, prompt: BlockPrompt) -> tuple[list[float], dict[str, float]]:
        """Candidate scores (first-stage order) and timings in seconds."""
        import torch

        layer = self.layer
        L0 = len(prompt.instruction_ids)
        bs = int(self.option("doc_batch_size", 64))
        scoring = self.option("scoring", "signal")
        if scoring == "signal":
            mass, t = self.token_mass(prompt)
            bounds, start = [], 0
            for n in prompt.doc_lengths:
                bounds.append((start, start + n))
                start += n
            if self.reattn is not None:
                from reranker.reattn import reattn_scores, token_forms

                tok = self.lm.tokenizer
                forms = [token_forms(tok, d) for d in prompt.doc_ids]
                qforms = set(token_forms(tok, encode_untrusted(tok, " " + prompt.query_text)))
                return reattn_scores([mass[s:e].tolist() for s, e in bounds], forms, qforms, self.reattn), t
            return [float(mass[s:e].sum()) for s, e in bounds], t
        with torch.inference_mode():
            if scoring != "calibrated":
                raise ValidationError(f"scoring must be 'signal' or 'calibrated', got {scoring!r}")
            layers = list(range(layer + 1))
            D = sum(prompt.doc_lengths)
            qo, t = block_forward(self.lm, prompt, layer, mode="mean", read_layers=layers, doc_batch_size=bs)
            co, _ = block_forward(self.lm, prompt, layer, query_ids=prompt.calib_ids, mode="mean",
                                  read_layers=layers, doc_batch_size=bs)
            c = sum((qo[l][0, :, L0 : L0 + D] - co[l][0, :, L0 : L0 + D]).sum(0) for l in layers)
            bounds, start = [], 0
            for n in prompt.doc_lengths:
                bounds.append((start, start + n))
                start += n
            return masked_document_scores(c, bounds, self.option("mask_std", 2.0)), t

    def layer_scores(self, query: str, candidates: Sequence[Document], layers: Sequence[int]) -> dict[int, list[float]]:
        """Signal scores of ``candidates`` read at each of ``layers`` from ONE forward pass
        (up to the deepest of them); used to choose ``l*``.

        Returns:
            ``{layer: scores in candidate order}``.
        """
        import torch

        prompt = self.build_prompt(query, candidates)
        L0 = len(prompt.instruction_ids)
        top = max(layers)
        if not 0 <= min(layers) and top < self.lm.num_layers:
            raise ValidationError(f"layers must be in [0, {self.lm.num_layers - 1}]")
        with self.lm.lock, torch.inference_mode():
            out, _ = block_forward(self.lm, prompt, top, read_layers=layers,
                                   doc_batch_size=int(self.option("doc_batch_size", 64)))
        return {l: signal_scores(out[l], L0, prompt.doc_lengths).tolist() for l in layers}

    def rerank(self, query: Query, candidates: Sequence[Document]) -> RerankResult:
        """Rerank ``candidates`` (first-stage order) for ``query``.

        Returns:
            RerankResult; with ``scoring="signal"`` the scores are attention probabilities
            summing to 1 over the candidates. ``details["timings"]`` in seconds.

        Raises:
            ValidationError: empty query, duplicate doc ids, bad options.
            ContextOverflowError: query block past the model's positions.
        """
        if not query.text.strip():
            raise ValidationError("query is empty")
        t0 = time.perf_counter()
        if not candidates:
            return RerankResult(Ranking(query.query_id, ()))
        ids = [d.doc_id for d in candidates]
        if len(set(ids)) != len(ids):
            raise ValidationError(f"duplicate doc ids among the candidates of query {query.query_id!r}")
        prompt = self.build_prompt(query.text, candidates)
        with self.lm.lock:
            scores, timings = self.scores(prompt)
        ranking = Ranking.from_hits(query.query_id, (ScoredDoc(d, s, doc) for d, s, doc in zip(ids, scores, candidates)))
        return RerankResult(
            ranking=ranking,
            truncated=tuple(d for d, cut in zip(ids, prompt.truncated) if cut),
            prompt_tokens=prompt.total_tokens,
            seconds=time.perf_counter() - t0,
            details={"timings": timings, "layer": self.layer},
        )

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["layer"] = self.layer
        d["scoring"] = self.option("scoring", "signal")
        d["heads"] = "all" if not self.heads else [list(h) for h in self.heads]
        d["reattn"] = None if self.reattn is None else vars(self.reattn)
        return d

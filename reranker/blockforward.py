"""The linear BlockRank forward: block 0, the candidate blocks, the query passes.

Source: Gupta et al. 2025, "Scalable In-context Ranking with Generative Models"
(arXiv 2510.05396), Sections 3-4.
The prompt's blocks, attention pattern and positions are those of
:mod:`heedrank.reranker.blockrank` (which builds :class:`BlockPrompt`); this module runs them.

Exact linear forward (:func:`block_forward`): (1) prefill block 0 once; (2) prefill the
candidate blocks as padded batches against block 0's cached keys/values with restarted
positions; (3) concatenate block 0's and the candidates' keys/values (padding dropped) and
run the query block against them. Only layers ``0..l*`` run; no LM head. Cost is linear in
``N``. :func:`reference_forward` computes the same in one pass with the explicit 4-D
block-sparse mask (quadratic; for tests). Both are differentiable when called under
``torch.enable_grad`` (training reuses them).

Fast path (docs/results/speed.md, "Cached BlockRank"; without gradients only,
:attr:`heedrank.reranker.blockrank.BlockRankReranker.fast_path`): the context is copied once
into a buffer reused across queries, with room after it where the query pass writes its own
keys/values in place (no per-layer concatenation,
:func:`heedrank.reranker.doccache.query_cache`); attention splits into the unmasked
context (chunked CPU flash attention) and the block's own keys, merged by log-sum-exp
(:class:`heedrank.reranker.attention.ContextSplit`); the last layer computes only its
captured rows; calibrated and learned scoring run the query and ``N/A`` blocks as ONE pass
(:func:`merged_query_pass`, their common prefix once) and read mean attention from
log-sum-exps. Scores equal the exact path's to float32 rounding (oracle tests in
``tests/reranker/test_blockrank_fast.py``).

Signal score (:func:`signal_scores`): at layer ``l*``, ``z_ij = q_i . k_j / sqrt(d)`` from
each signal token ``i`` to candidate tokens ``j`` only; ``alpha_ij = softmax_j(z_ij)``;
``S(d) = mean_heads mean_signal sum_{j in d} alpha_ij`` (probabilities summing to 1).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from heedrank.errors import ContextOverflowError
from heedrank.reranker.doccache import cache_from as _cache_from
from heedrank.reranker.doccache import neg_inf as _neg
from heedrank.reranker.doccache import query_cache as _query_cache


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
        labels: Per candidate, the number ``i`` of its ``ID: i`` block label (option
            ``doc_labels``); the answer ``Final Answer: [i]`` names a candidate by it.
    """

    instruction_ids: list[int]
    doc_ids: list[list[int]]
    query_ids: list[int]
    calib_ids: list[int]
    n_signal: int
    truncated: list[bool]
    query_offset: int
    query_text: str = ""
    labels: list[int] = field(default_factory=list)

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


def context_kv(lm: Any, prompt: BlockPrompt, layer: int, *, doc_batch_size: int = 64, reserve: int = 0,
               buffer: Any = None) -> tuple[list[tuple[Any, Any]], dict[str, float]]:
    """Steps (1)-(2) of the linear forward: keys/values of block 0 and of every candidate
    block (each against block 0 only, positions restarting at ``L0``), for layers
    ``0..layer``, concatenated without padding.

    Candidate blocks depend only on block 0 and themselves, so this is also the part a
    document KV cache can hold (cached BlockRank, docs/design/algorithms.md section 3.1).

    Args:
        reserve, buffer: Under inference, room left after the context for the query pass's
            own keys/values, and reused storage
            (:func:`heedrank.reranker.doccache.assemble_kv`); ignored with gradients enabled.

    Returns:
        ``([(keys, values)] per layer, each (1, kv_heads, L0 + D, head_dim)), timings``
        (seconds).
    """
    from heedrank.reranker.doccache import assemble_kv, encode_blocks, instruction_kv

    timings: dict[str, float] = {}
    # (1) block 0
    t0 = time.perf_counter()
    kv0 = instruction_kv(lm, prompt.instruction_ids, layer)
    timings["instruction"] = time.perf_counter() - t0
    # (2) candidate blocks, batched by length, each against block 0 only
    t1 = time.perf_counter()
    per_doc = encode_blocks(lm, kv0, prompt.doc_ids, layer, batch_size=doc_batch_size)
    timings["documents"] = time.perf_counter() - t1
    return assemble_kv(kv0, per_doc, layer, reserve=reserve, buffer=buffer), timings


def _use_fast(fast: bool | None) -> bool:
    """The fast query-pass path runs without autograd only (``fast=None``: whenever
    gradients are disabled; ``False``: never)."""
    import torch

    return (fast is None or fast) and not torch.is_grad_enabled()


def query_pass(
    lm: Any, prompt: BlockPrompt, kv: list[tuple[Any, Any]], capture: Any, *,
    query_ids: list[int] | None = None, stop: bool = True, fast: bool | None = None,
) -> Any:
    """Step (3): the query block against block 0 and every candidate token.

    Args:
        kv: :func:`context_kv` output.
        capture: :class:`heedrank.reranker.attention.AttentionCapture` (its ``stop_after`` decides
            where the pass ends).
        query_ids: Query block (default ``prompt.query_ids``), possibly followed by answer
            tokens (training).
        stop: When ``False`` the capture must not stop early and the model output (hidden
            states of the query block) is returned.
        fast: ``None`` (default): without gradients (``torch.inference_mode``/``no_grad``)
            take the fast path: the query block's keys/values are written in place into the
            room ``kv`` reserves (:func:`heedrank.reranker.doccache.query_cache`; the context
            is never copied) and attention splits into the unmasked context and the block's
            own keys (:class:`heedrank.reranker.attention.ContextSplit`). With gradients
            enabled, or ``False``: the concatenating cache and SDPA under the full mask
            (differentiable; the exact path the fast one is tested against).

    Returns:
        The base model's output, or ``None`` when the pass stopped early.
    """
    import torch

    from heedrank.reranker.attention import ContextSplit, run_with_capture

    dev = lm.device
    dtype = next(lm.model.parameters()).dtype
    qids = prompt.query_ids if query_ids is None else query_ids
    Lq, K = len(qids), kv[0][0].shape[2]
    fast = _use_fast(fast)
    qcache = _query_cache(kv, lm.model.config, Lq) if fast else _cache_from(kv, lm.model.config)
    qmask = torch.zeros((1, 1, Lq, K + Lq), dtype=dtype, device=dev)
    blocked = ~torch.tril(torch.ones(Lq, Lq, dtype=torch.bool, device=dev))
    qmask[0, 0, :, K:].masked_fill_(blocked, _neg(dtype))
    qpos = (prompt.query_offset + torch.arange(Lq, device=dev))[None]
    extra = {"heedrank_split": ContextSplit(K, qmask[0, 0, :, K:])} if fast else {}
    return run_with_capture(
        lm.model.base_model, capture, input_ids=torch.tensor([qids], device=dev), position_ids=qpos,
        attention_mask=qmask, cache=qcache, use_cache=True, **extra,
    )


@dataclass(frozen=True)
class MergedRows:
    """Several query blocks run as ONE query pass (:func:`merged_query_pass`).

    The blocks' longest common prefix runs once (its rows are the same in every block:
    same tokens, same positions, same context, causal attention), then each block's
    remaining tokens. Every row sees the whole context; a prefix row sees the prefix
    causally; a row of block ``b``'s rest sees the prefix and ``b``'s rest causally,
    nothing of the other blocks. Positions: row ``j`` of block ``b`` sits at
    ``query_offset + j`` as in its own pass.

    Attributes:
        ids: Token ids of the ``R`` merged rows.
        positions: Per row, its offset from ``query_offset``.
        members: Per block, its rows (indices into the ``R`` rows), in token order.
        allowed: bool ``(R, R)``: which of the pass's own keys each row may attend to.
    """

    ids: list[int]
    positions: list[int]
    members: list[list[int]]
    allowed: Any

    @staticmethod
    def of(blocks: Sequence[Sequence[int]], device: Any = "cpu") -> MergedRows:
        """The merged layout of ``blocks`` (each non-empty).

        Raises:
            ValueError: no block, or an empty block.
        """
        import torch

        if not blocks or any(len(b) == 0 for b in blocks):
            raise ValueError("merged query pass: every block must be non-empty")
        P = 0
        while all(len(b) > P for b in blocks) and len({b[P] for b in blocks}) == 1:
            P += 1
        ids, pos, seg = list(blocks[0][:P]), list(range(P)), [-1] * P
        members = []
        for i, b in enumerate(blocks):
            start = len(ids)
            ids += list(b[P:])
            pos += list(range(P, len(b)))
            seg += [i] * (len(b) - P)
            members.append(list(range(P)) + list(range(start, len(ids))))
        s = torch.tensor(seg, device=device)
        idx = torch.arange(len(ids), device=device)
        allowed = (idx[None, :] <= idx[:, None]) & ((s[None, :] == -1) | (s[None, :] == s[:, None]))
        return MergedRows(ids, pos, members, allowed)

    def weights(self, dtype: Any = None) -> Any:
        """float ``(G, R)``: ``1 / len(block g)`` on block ``g``'s rows (its row mean)."""
        import torch

        w = torch.zeros(len(self.members), len(self.ids), dtype=dtype or torch.float32, device=self.allowed.device)
        for g, rows in enumerate(self.members):
            w[g, rows] = 1.0 / len(rows)
        return w


def merged_query_pass(
    lm: Any, prompt: BlockPrompt, kv: list[tuple[Any, Any]], capture: Any, blocks: Sequence[Sequence[int]], *,
    fast: bool | None = None,
) -> MergedRows:
    """Step (3) for several query blocks at once (:class:`MergedRows`), e.g. the query block
    and the ``N/A`` calibration block: the context's keys/values are read once per layer
    instead of once per block, and the blocks' common prefix runs once. Equal, to float32
    rounding, to one :func:`query_pass` per block (oracle tests).

    Args:
        kv: :func:`context_kv` output (its reserved room should hold the merged rows).
        capture: An :class:`heedrank.reranker.attention.AttentionCapture` in ``"mean"`` mode
            with ``rows=None``; its ``row_weights`` are set here, so ``capture.out[layer]`` is
            ``(len(blocks), heads, K + R)``: block ``g``'s mean attention over the context's
            ``K`` keys and the ``R`` merged rows (zero on rows it cannot see).
        blocks: Token ids of each query block.
        fast: As :func:`query_pass`.

    Returns:
        The layout of the merged rows.

    Raises:
        ValueError: a capture not in ``"mean"`` mode over all rows, or an empty block.
    """
    import torch

    from heedrank.reranker.attention import ContextSplit, run_with_capture

    if capture.mode not in ("mean", "query") or capture.rows is not None:
        raise ValueError("merged_query_pass reads every row: capture mode 'mean' or 'query' with rows=None")
    dev = lm.device
    dtype = next(lm.model.parameters()).dtype
    rows = MergedRows.of(blocks, device=dev)
    R, K = len(rows.ids), kv[0][0].shape[2]
    fast = _use_fast(fast)
    qcache = _query_cache(kv, lm.model.config, R) if fast else _cache_from(kv, lm.model.config)
    qmask = torch.zeros((1, 1, R, K + R), dtype=dtype, device=dev)
    qmask[0, 0, :, K:].masked_fill_(~rows.allowed, _neg(dtype))
    qpos = (prompt.query_offset + torch.tensor(rows.positions, device=dev))[None]
    capture.row_weights = rows.weights()
    extra = {"heedrank_split": ContextSplit(K, qmask[0, 0, :, K:])} if fast else {}
    run_with_capture(
        lm.model.base_model, capture, input_ids=torch.tensor([rows.ids], device=dev), position_ids=qpos,
        attention_mask=qmask, cache=qcache, use_cache=True, **extra,
    )
    return rows


def block_forward(
    lm: Any,
    prompt: BlockPrompt,
    layer: int,
    *,
    query_ids: list[int] | None = None,
    mode: str = "logits",
    read_layers: Sequence[int] | None = None,
    doc_batch_size: int = 64,
    kv: list[tuple[Any, Any]] | None = None,
    fast: bool | None = None,
) -> tuple[dict[int, Any], dict[str, float]]:
    """Exact linear BlockRank forward up to ``layer`` (inclusive): :func:`context_kv` then
    :func:`query_pass`.

    Args:
        lm: :class:`heedrank.reranker.lm.LoadedLM`.
        prompt: The block prompt.
        layer: Scoring layer ``l*``: no layer above it runs.
        query_ids: Query block to run (default ``prompt.query_ids``).
        mode: ``"logits"``: capture the signal rows' raw logits;
            ``"mean"``: capture all query rows' mean attention probabilities.
        read_layers: Layers captured, each ``<= layer`` (default: ``[layer]``).
        doc_batch_size: Candidate blocks per batched prefill (bounds memory).
        kv: Keys/values of block 0 and the candidates for layers ``0..>= layer``, as
            :func:`context_kv` returns them, when already computed (or read from a document
            KV store, :mod:`heedrank.reranker.doccache`): then only the query block runs.
        fast: As :func:`query_pass` (the default takes the fast path without gradients).

    Returns:
        ``({layer: tensor}, timings)`` where tensors are ``(1, heads, rows, K)`` logits or
        ``(1, heads, K)`` mean probabilities over the keys ``K = L0 + D + Lq`` laid out as
        block 0, candidate tokens (concatenated in order, no padding), query block.
    """
    import torch

    from heedrank.reranker.attention import AttentionCapture

    timings: dict[str, float] = {}
    Lq = len(prompt.query_ids if query_ids is None else query_ids)
    if kv is None:
        kv, timings = context_kv(lm, prompt, layer, doc_batch_size=doc_batch_size, reserve=Lq)
    t2 = time.perf_counter()
    if mode == "logits":
        cap = AttentionCapture(
            layers=set(read_layers or [layer]), rows=slice(Lq - prompt.n_signal, Lq), mode="logits", stop_after=layer,
            detach=not torch.is_grad_enabled(),
        )
    else:
        cap = AttentionCapture(layers=set(read_layers or [layer]), mode="mean", stop_after=layer)
    query_pass(lm, prompt, kv, cap, query_ids=query_ids, fast=fast)
    timings["query"] = time.perf_counter() - t2
    return cap.out, timings


def calibrated_forward(
    lm: Any, prompt: BlockPrompt, layer: int, *, read_layers: Sequence[int] | None = None, doc_batch_size: int = 64,
    kv: list[tuple[Any, Any]] | None = None, fast: bool | None = None,
) -> tuple[dict[int, Any], dict[int, Any], dict[str, float]]:
    """Mean attention of the query block and of the ``N/A`` calibration block
    (``prompt.calib_ids``), as two :func:`block_forward` calls in ``"mean"`` mode return
    them, from ONE :func:`merged_query_pass` on the fast path (without gradients).

    Args:
        As :func:`block_forward`.

    Returns:
        ``(query, calibration, timings)``: ``{layer: (1, heads, L0 + D + Lq)}`` and
        ``{layer: (1, heads, L0 + D + Lc)}`` float32 mean probabilities (keys: block 0, the
        candidates, the block's own tokens), and timings in seconds (``"query"``, plus
        ``"calibration"`` on the two-pass path).
    """
    import torch

    from heedrank.reranker.attention import AttentionCapture

    Lq, Lc = len(prompt.query_ids), len(prompt.calib_ids)
    timings: dict[str, float] = {}
    if kv is None:
        kv, timings = context_kv(lm, prompt, layer, doc_batch_size=doc_batch_size, reserve=Lq + Lc)
    if not _use_fast(fast):  # two passes (the exact path the merged pass is tested against)
        qo, t = block_forward(lm, prompt, layer, mode="mean", read_layers=read_layers, kv=kv, fast=fast)
        t0 = time.perf_counter()
        co, _ = block_forward(lm, prompt, layer, query_ids=prompt.calib_ids, mode="mean", read_layers=read_layers,
                              kv=kv, fast=fast)
        return qo, co, {**timings, **t, "calibration": time.perf_counter() - t0}
    t2 = time.perf_counter()
    cap = AttentionCapture(layers=set(read_layers or [layer]), mode="mean", stop_after=layer)
    rows = merged_query_pass(lm, prompt, kv, cap, [prompt.query_ids, prompt.calib_ids], fast=fast)
    K = kv[0][0].shape[2]
    outs: list[dict[int, Any]] = [{}, {}]
    for g, members in enumerate(rows.members):
        n = len(members)
        for l, x in cap.out.items():
            if members == list(range(n)):  # the rows lead the merged pass: a view
                outs[g][l] = x[g : g + 1, :, : K + n]
            else:
                own = K + torch.tensor(members, device=x.device)
                outs[g][l] = torch.cat([x[g, :, :K], x[g].index_select(-1, own)], dim=-1)[None]
    timings["query"] = time.perf_counter() - t2
    return outs[0], outs[1], timings


def reference_forward(lm: Any, prompt: BlockPrompt, layer: int) -> Any:
    """The same signal-token logits from ONE pass with the explicit block-sparse 4-D mask.

    Quadratic in the prompt length; an oracle for :func:`block_forward`.

    Returns:
        ``(1, heads, n_signal, S)`` raw logits at ``layer`` over all ``S`` prompt tokens laid
        out as block 0, candidates (in order), query block.
    """
    import torch

    from heedrank.reranker.attention import AttentionCapture, run_with_capture

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


def check_query_block(prompt: BlockPrompt, max_positions: int, *, overlap: bool = False, where: str = "",
                      remedy: str = " or the query length") -> None:
    """Raises ContextOverflowError (``max_candidates=0``: fewer candidates do not help) when the
    query or ``N/A`` block would run past the model's ``max_positions`` (or, ``overlap``, into
    the candidate blocks' positions)."""
    end = prompt.query_offset + max(len(prompt.query_ids), len(prompt.calib_ids))
    if end > max_positions or overlap:
        raise ContextOverflowError(
            f"the query block would span positions up to {end} (offset {prompt.query_offset}{where}); "
            f"the model has {max_positions}: lower max_doc_tokens{remedy}",
            max_candidates=0,
        )


def sliding_window(config: Any, layer: int) -> int | None:
    """The attention window (tokens) of the sliding-window layers among ``0..layer`` of a
    transformers ``config``, or ``None`` when none of them slides (Llama, SmolLM2, Qwen2 without
    ``use_sliding_window``). Mistral slides in every layer; Gemma 3 and Qwen2 name theirs in
    ``layer_types``. A query row at position ``p`` of such a layer sees keys at positions
    ``> p - window`` only.

    The linear forward hands its explicit block mask to every layer (no window is added), which
    is the model's own attention only while every position distance of the prompt stays under
    the window: callers bound the query block's end by it (:func:`check_query_block`)."""
    window = getattr(config, "sliding_window", None)
    if not window or getattr(config, "use_sliding_window", True) is False:
        return None
    types = getattr(config, "layer_types", None)
    if types is not None and "sliding_attention" not in list(types)[: layer + 1]:
        return None
    return int(window)

"""The probe-store scorer of cached BlockRank (issue #23, ``shared/design/ALGORITHMS.md``
section 6, design A): the query block never attends to the candidates; it runs against
block 0 (the fixed instruction) alone, and at each scoring layer its rows are dotted with
the candidates' stored keys.

Why it is enough: BlockRank's learned scorer reads, per layer ``l`` and head ``h``, the
query rows' attention mass on each candidate (minus the ``N/A`` block's). Under a
:class:`heedrank.reranker.attention.CandidateMask` with ``below = l* + 1`` those rows never
take a candidate's value, so their queries ``q_i`` (after RoPE) and their log-sum-exp over
what they did attend to (block 0 and their own block), ``lse_i``, do not depend on the
candidates. The mass follows from the candidates' keys alone::

    z_ij = q_i . k_j / sqrt(d)                      (j: every candidate token)
    LSE_i = logaddexp(lse_i, logsumexp_j z_ij)       (the softmax over every key)
    mass(d) = sum_i w_i sum_{j in d} exp(z_ij - LSE_i)

with ``w_i`` the block's row weights (``1 / rows``). This equals the mean capture of the
masked pass to float32 rounding (oracle test ``tests/reranker/test_probe.py``), so a store
needs only the keys of the read layers: a late-interaction model with the LM as both
towers (the family of ColBERTv2, Santhanam et al. 2022), and one query pass per query
whatever the number of candidates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PROBE_CHUNK = 16384
"""Candidate keys per chunk of the probe (bounds the ``(heads, rows, chunk)`` temporary)."""


@dataclass(frozen=True)
class ProbeRows:
    """The query pass of the probe scorer: what the rows need to probe keys later.

    Attributes:
        q: ``{layer: (heads, R, head_dim)}`` float32 query states after RoPE of the ``R``
            merged rows (the query block and the ``N/A`` block, :class:`MergedRows`).
        lse: ``{layer: (heads, R)}`` float32 log-sum-exp of each row's scaled logits over
            the keys it attended to (block 0 and its own block).
        weights: float32 ``(G, R)``: row weights of each block (its row mean).
        scaling: Logit scale ``1 / sqrt(head_dim)`` (the model's).
    """

    q: Mapping[int, Any]
    lse: Mapping[int, Any]
    weights: Any
    scaling: float


def probe_query_pass(lm: Any, prompt: Any, kv0: Sequence[tuple[Any, Any]], layers: Sequence[int], *,
                     fast: bool | None = None) -> ProbeRows:
    """The query and ``N/A`` blocks as ONE merged pass against block 0 only, stopping at the
    deepest read layer, keeping their rows at ``layers``.

    Args:
        lm: :class:`heedrank.reranker.lm.LoadedLM` (with a query adapter: its LM).
        prompt: :class:`heedrank.reranker.blockrank.BlockPrompt` (its candidates are not read).
        kv0: Block 0's keys/values, per layer ``(1, kv_heads, L0, head_dim)`` (at least
            ``max(layers) + 1`` entries), e.g. :func:`heedrank.reranker.doccache.instruction_kv`.
        layers: Layers to keep.
        fast: As :func:`heedrank.reranker.blockrank.query_pass`.

    Returns:
        :class:`ProbeRows`. Differentiable in the LM's parameters under ``torch.enable_grad``
        (the query adapter's training).
    """
    import torch

    from heedrank.reranker.attention import AttentionCapture, ContextSplit, run_with_capture
    from heedrank.reranker.blockrank import MergedRows, _use_fast
    from heedrank.reranker.doccache import assemble_kv, cache_from, neg_inf, query_cache

    dev = lm.device
    dtype = next(lm.model.parameters()).dtype
    depth = max(layers)
    rows = MergedRows.of([prompt.query_ids, prompt.calib_ids], device=dev)
    R = len(rows.ids)
    fast = _use_fast(fast)
    if fast:
        kv = assemble_kv(kv0, [], depth, reserve=R)
        qcache = query_cache(kv, lm.model.config, R)
    else:
        kv = [(k, v) for k, v in kv0[: depth + 1]]
        qcache = cache_from(kv, lm.model.config)
    K = kv[0][0].shape[2]
    qmask = torch.zeros((1, 1, R, K + R), dtype=dtype, device=dev)
    qmask[0, 0, :, K:].masked_fill_(~rows.allowed, neg_inf(dtype))
    qpos = (prompt.query_offset + torch.tensor(rows.positions, device=dev))[None]
    cap = AttentionCapture(layers=set(layers), mode="probe", stop_after=depth, detach=not torch.is_grad_enabled())
    extra = {"heedrank_split": ContextSplit(K, qmask[0, 0, :, K:])} if fast else {}
    run_with_capture(lm.model.base_model, cap, input_ids=torch.tensor([rows.ids], device=dev), position_ids=qpos,
                     attention_mask=qmask, cache=qcache, use_cache=True, **extra)
    cfg = lm.model.config
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    return ProbeRows({l: cap.out[l]["q"][0] for l in layers}, {l: cap.out[l]["lse"][0] for l in layers},
                     rows.weights(), head_dim ** -0.5)


def probe_mass(rows: ProbeRows, layer: int, keys: Any, lengths: Sequence[int], bias: Any = None) -> Any:
    """Each block's attention mass on each candidate at one layer, from the candidates' keys.

    Args:
        rows: :func:`probe_query_pass` output.
        layer: A layer of ``rows``.
        keys: float ``(kv_heads, D, head_dim)``: the candidates' keys at ``layer``, concatenated
            in candidate order (``D = sum(lengths)``, no padding), after RoPE at their block
            positions.
        lengths: Tokens per candidate.
        bias: Optional float ``(D,)`` added to every row's logit of each key (a key standing
            for ``n`` pruned ones carries ``log n``).

    Returns:
        float32 ``(G, N, heads)``: block ``g``'s mean attention probability summed over each
        candidate's tokens, the softmax spanning block 0, every candidate and the block itself
        (unitless, in [0, 1]).
    """
    import torch

    q, lse = rows.q[layer], rows.lse[layer]
    H, R, d = q.shape
    n_kv = keys.shape[0]
    n_rep = H // n_kv
    qg = q.reshape(n_kv, n_rep * R, d)
    keys = keys.to(q.dtype)
    D = keys.shape[1]
    if bias is not None:
        bias = bias.to(q.dtype)

    grad = torch.is_grad_enabled()

    def logits(s: int, e: int) -> Any:
        z = torch.matmul(qg, keys[:, s:e].transpose(-1, -2))
        z = z * rows.scaling if grad else z.mul_(rows.scaling)
        return z if bias is None else z + bias[s:e]

    w = rows.weights.to(q.dtype)
    G, N = w.shape[0], len(lengths)
    owner = torch.repeat_interleave(torch.arange(N, device=q.device), torch.tensor(list(lengths), device=q.device))
    lse_rows = lse.reshape(n_kv, n_rep * R)
    if D <= PROBE_CHUNK:  # one chunk: one exp over the logits, shifted by each row's max
        z = logits(0, D)
        top = z.amax(dim=-1, keepdim=True)
        e = (z - top).exp() if grad else z.sub_(top).exp_()
        lse_c = top.squeeze(-1) + e.sum(-1).log()
        scale = (top.squeeze(-1) - torch.logaddexp(lse_rows, lse_c)).exp()[..., None]
        p = e * scale if grad else e.mul_(scale)
        m = torch.matmul(w, p.reshape(H, R, D))  # (H, G, D)
        return torch.zeros(G, N, H, dtype=q.dtype, device=q.device).index_add(1, owner, m.permute(1, 2, 0))
    lse_c = None
    for s in range(0, D, PROBE_CHUNK):
        part = torch.logsumexp(logits(s, min(D, s + PROBE_CHUNK)), dim=-1)
        lse_c = part if lse_c is None else torch.logaddexp(lse_c, part)
    total = torch.logaddexp(lse_rows, lse_c)[..., None]
    out = torch.zeros(G, N, H, dtype=q.dtype, device=q.device)
    for s in range(0, D, PROBE_CHUNK):
        e = min(D, s + PROBE_CHUNK)
        p = (logits(s, e) - total).exp()  # (n_kv, n_rep*R, c)
        m = torch.matmul(w, p.reshape(H, R, e - s))  # (H, G, c)
        out = out.index_add(1, owner[s:e], m.permute(1, 2, 0))
    return out


def probe_features(rows: ProbeRows, keys: Mapping[int, Any], lengths: Sequence[int], layers: Sequence[int]) -> Any:
    """Calibrated per-(layer, head) mass of each candidate: the query block's minus the
    ``N/A`` block's (:func:`probe_mass`), float32 ``(N, len(layers), heads)``, the input of
    :func:`heedrank.reranker.scoring.linear_head_scores`.

    Args:
        keys: ``{layer: (kv_heads, D, head_dim)}`` candidates' keys.
    """
    import torch

    cols = []
    for l in layers:
        m = probe_mass(rows, l, keys[l], lengths)
        cols.append(m[0] - m[1])
    return torch.stack(cols, dim=1)

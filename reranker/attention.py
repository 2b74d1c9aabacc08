"""Query-row attention capture: read ``A[l,h][i,:]`` for a few rows without materialising
``(layers, heads, seq, seq)``.

The LM runs with the attention implementation ``"heedrank"``, registered here: it lets
PyTorch SDPA compute each layer's output (the fast path), and, when the forward pass is
given an :class:`AttentionCapture` (keyword ``heedrank_capture``, passed down by
transformers to every attention call), it also computes
``softmax(Q_rows K^T / sqrt(d_head) + mask)`` for the captured query rows only, from the
same query and key states (after RoPE, with the cache's keys). Cost per layer:
``O(heads * rows * keys * d_head)``, i.e. negligible next to the forward pass for the
short query spans of ICR and the signal tokens of BlockRank.

The capture can also stop the forward pass after a given layer (raising
:class:`StopForward`), so that layers above the deepest layer that is read never run; the
attention output of that last layer is never computed (only its captured rows are).

Split query passes (:class:`ContextSplit`, passed as keyword ``heedrank_split``): a short
query pass over a long cached context whose every key each query row may attend to (the
BlockRank query block over block 0 and the candidates). Inference only (no autograd):

* the context part runs through PyTorch's CPU flash attention without any mask, returning
  the output and each row's log-sum-exp; the few keys of the pass itself (the rows' own,
  under the split's small mask) are done explicitly, and the two parts are merged by their
  log-sum-exps (exact: the online-softmax merge of Milakov and Gimelshein 2018, "Online
  normalizer calculation for softmax", as in FlashAttention, Dao et al. 2022);
* ``"mean"`` captures are ``exp(z - lse)`` of the query rows, computed in chunks of keys
  and reduced over rows by a matrix product (no ``(heads, rows, keys)`` tensor and no
  second softmax), optionally per group of rows (:attr:`AttentionCapture.row_weights`).

``"logits"``/``"probs"`` captures are computed by :func:`capture_rows` on either path.
Anything else (another device or dtype, a batch, gradients) takes the general path: SDPA
under the full 4-D mask, plus :func:`capture_rows`.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

from heedrank.cancel import check as check_cancelled

_REGISTERED = False


class StopForward(Exception):
    """Raised inside the forward pass after the last layer a capture needs."""


@dataclass
class AttentionCapture:
    """What to read from the attention of one forward pass.

    Args:
        layers: Layer indices to capture (``None`` = all).
        rows: Row indices within the forward's query states to capture (``None`` = all
            rows of this forward pass, e.g. the whole query span of ICR).
        mode: ``"mean"`` keeps softmax probabilities averaged over the captured rows,
            ``(batch, heads, keys)`` float32 per layer; ``"logits"`` keeps the masked raw
            logits ``q.k / sqrt(d_head)`` (blocked positions = ``-inf``),
            ``(batch, heads, rows, keys)`` float32 per layer; ``"probs"`` keeps the
            softmax probabilities per row, ``(batch, heads, rows, keys)``; ``"query"`` keeps
            the rows' query states (after RoPE) times the attention's scaling, float32
            ``(batch, heads, rows, head_dim)``: their dot product with a key is the raw logit.
        stop_after: Raise :class:`StopForward` after this layer's attention (``None`` =
            run all layers).
        detach: Detach captured tensors from the autograd graph (``False`` for training).
        row_weights: Optional float tensor ``(G, R)`` over the pass's ``R`` rows (with
            ``rows=None`` and ``mode="mean"`` only): group ``g`` keeps
            ``sum_i row_weights[g, i] * p_i`` (``p_i`` = row ``i``'s softmax probabilities), and
            ``out[layer]`` is ``(G, heads, keys)`` float32 (batch of 1). Used to read two query
            blocks that share one pass (BlockRank's query and ``N/A`` calibration blocks).

    Attributes:
        out: ``{layer: tensor}`` filled during the forward pass.
    """

    layers: Collection[int] | None = None
    rows: Any = None
    mode: str = "mean"
    stop_after: int | None = None
    detach: bool = True
    row_weights: Any = None
    out: dict[int, Any] = field(default_factory=dict)

    def wants(self, layer: int) -> bool:
        return self.layers is None or layer in self.layers


def _additive_mask(attention_mask, q_len: int, k_len: int, dtype, device):
    """``(B or 1, 1, q_len, k_len)`` additive float mask (0 allowed, -inf blocked)."""
    import torch

    if attention_mask is None:
        # Causal, bottom-right aligned: row i (of q_len) sits at absolute key position k_len - q_len + i.
        i = torch.arange(q_len, device=device).unsqueeze(1)
        j = torch.arange(k_len, device=device).unsqueeze(0)
        allowed = j <= (k_len - q_len) + i
        return torch.where(allowed, 0.0, float("-inf")).to(dtype)[None, None]
    mask = attention_mask[..., -q_len:, :k_len]
    if mask.dtype == torch.bool:
        return torch.where(mask, 0.0, float("-inf")).to(dtype)
    return mask.to(dtype).masked_fill(mask <= torch.finfo(mask.dtype).min / 2, float("-inf"))


def capture_rows(module, query, key, attention_mask, scaling: float, capture: AttentionCapture) -> None:
    """Compute and store the captured rows' attention of one layer (see AttentionCapture)."""
    import torch

    layer = int(module.layer_idx)
    q = query if capture.rows is None else query[:, :, capture.rows, :]
    if capture.mode == "query":
        value = q.float() * scaling
        capture.out[layer] = value.detach() if capture.detach else value
        return
    B, H, R, d = q.shape
    n_kv = key.shape[1]
    # grouped-query attention without repeating the keys: query head h reads kv head
    # h // n_rep (transformers' repeat_kv order), so group the query heads per kv head
    grouped = q.float().reshape(B, n_kv, (H // n_kv) * R, d)
    logits = torch.matmul(grouped, key.float().transpose(-1, -2)).reshape(B, H, R, key.shape[2]) * scaling
    mask = _additive_mask(attention_mask, query.shape[2], key.shape[2], logits.dtype, logits.device)
    if capture.rows is not None:
        mask = mask[:, :, capture.rows, :]
    logits = logits + mask
    if capture.mode == "logits":
        value = logits
    else:
        probs = torch.softmax(logits, dim=-1)
        if capture.mode == "mean" and capture.row_weights is not None:
            if B != 1:
                raise ValueError("row_weights needs a batch of 1")
            # (G, R) @ (H, R, K) -> (H, G, K) -> (G, H, K)
            value = torch.matmul(capture.row_weights.to(probs.dtype), probs[0]).transpose(0, 1)
        else:
            value = probs.mean(dim=2) if capture.mode == "mean" else probs
    capture.out[layer] = value.detach() if capture.detach else value


_SHORT_QUERY = 256
"""Query lengths (tokens) for which grouped-query attention runs without repeating keys."""


def _short_gqa(query, key, attention_mask) -> bool:
    """A short query pass (a query block against a long cached context) with grouped-query
    attention and an explicit 4-D additive mask: the case where repeating the keys and
    values per query head (transformers' ``repeat_kv``) costs more than the attention."""
    return (attention_mask is not None and attention_mask.dim() == 4 and attention_mask.dtype.is_floating_point
            and query.shape[2] <= _SHORT_QUERY and key.shape[1] < query.shape[1]
            and query.shape[1] % key.shape[1] == 0)


def _grouped_sdpa(query, key, value, attention_mask, scaling: float):
    """SDPA with the query heads grouped per kv head: ``(B, H, q, d)`` queries become
    ``(B, H_kv, n_rep * q, d)`` against the un-repeated ``(B, H_kv, k, d)`` keys and values,
    the mask rows repeated per group. Same result as repeating the keys (tested through the
    BlockRank oracle tests); returns ``(B, q, H, d)`` like transformers' SDPA function."""
    import torch

    B, H, Lq, d = query.shape
    n_kv = key.shape[1]
    n_rep = H // n_kv
    q = query.reshape(B, n_kv, n_rep * Lq, d)
    mask = attention_mask[:, :, :, : key.shape[2]]
    mask = mask.repeat(1, 1, n_rep, 1) if mask.shape[2] == Lq else mask
    out = torch.nn.functional.scaled_dot_product_attention(q, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(B, H, Lq, d).transpose(1, 2).contiguous()


@dataclass(frozen=True)
class ContextSplit:
    """How a query pass's keys split into a context that every query row sees and the
    pass's own keys (the cache layer appended them after the context).

    Args:
        context_len: ``K0``, keys of the context (positions ``0..K0-1`` of every layer's
            keys/values); every query row may attend to all of them (no mask).
        self_mask: Additive float mask ``(R, R)`` of the pass's ``R`` rows over the pass's
            own keys (0 allowed, ``-inf`` or the dtype's minimum blocked); every row must be
            allowed at least one key (itself).
    """

    context_len: int
    self_mask: Any


CHUNK_KEYS = 2048
"""Keys per chunk when "mean" captures are computed from log-sum-exps (bounds the
``(heads, rows, chunk)`` temporary)."""

CONTEXT_CHUNK = 8192
"""Context keys per flash-attention call of a split pass. PyTorch's CPU kernel streams all
keys/values once per block of 32-64 query rows; past the CPU caches (a 1,000-candidate
SmolLM2 context is 34 MB per head and side) that is memory-bound, so the context is cut
into chunks that stay cached while every row block reads them, and the chunks' outputs are
merged by log-sum-exp (28% less time per layer at 133k keys, 168 grouped rows, measured on
one shared core)."""

_FLASH_CPU: Any = False


def _flash_cpu():
    """PyTorch's CPU flash attention that also returns the log-sum-exp per row
    (``aten._scaled_dot_product_flash_attention_for_cpu``), or ``None`` when this PyTorch
    lacks it (then split passes take the general path)."""
    global _FLASH_CPU
    if _FLASH_CPU is False:
        import torch

        try:
            _FLASH_CPU = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
        except (AttributeError, RuntimeError):  # pragma: no cover - depends on the PyTorch build
            _FLASH_CPU = None
    return _FLASH_CPU


def _split_ok(query, key, split: ContextSplit | None) -> bool:
    """Whether the split fast path applies (CPU, float32, batch 1, grouped heads, no
    autograd); otherwise the general path runs (same results)."""
    import torch

    if split is None or torch.is_grad_enabled() or _flash_cpu() is None:
        return False
    if query.device.type != "cpu" or query.dtype != torch.float32 or key.dtype != torch.float32:
        return False
    if query.shape[0] != 1 or query.shape[1] % key.shape[1] != 0:
        return False
    K0 = split.context_len
    if K0 <= 0 or key.shape[2] != K0 + query.shape[2] or tuple(split.self_mask.shape) != (query.shape[2],) * 2:
        return False
    return True


def _merged_attention(query, key, value, split: ContextSplit, scaling: float, need_out: bool):
    """Attention of the pass's rows over context + own keys, merged by log-sum-exp.

    Returns:
        ``(out, lse, qg, p_self)``: ``out`` ``(1, R, H, d)`` (``None`` when not
        ``need_out``), ``lse`` float32 ``(1, H_kv, n_rep * R)`` over all keys, the grouped
        queries ``(1, H_kv, n_rep * R, d)`` and the own-key probabilities
        ``(1, H_kv, n_rep * R, R)``.
    """
    import torch

    B, H, R, d = query.shape
    n_kv = key.shape[1]
    n_rep = H // n_kv
    K0 = split.context_len
    qg = query.reshape(B, n_kv, n_rep * R, d)
    ks, vs = key[:, :, K0:], value[:, :, K0:]
    out_c = lse_c = None
    start = 0
    while start < K0:  # chunks of the context, each read from memory once for all rows
        end = K0 if K0 - start < CONTEXT_CHUNK + CONTEXT_CHUNK // 4 else start + CONTEXT_CHUNK
        o, l = _flash_cpu()(qg, key[:, :, start:end], value[:, :, start:end], 0.0, False, scale=scaling)
        if out_c is None or lse_c is None:
            out_c, lse_c = o, l
        else:
            both = torch.logaddexp(lse_c, l)
            out_c = out_c * torch.exp(lse_c - both)[..., None] + o * torch.exp(l - both)[..., None]
            lse_c = both
        start = end
    assert out_c is not None and lse_c is not None, "the split path needs a context (see _split_ok)"
    z = torch.matmul(qg, ks.transpose(-1, -2)).mul_(scaling)  # (1, n_kv, n_rep*R, R)
    z = z.view(B, n_kv, n_rep, R, R).add_(split.self_mask.to(z.dtype)).view(B, n_kv, n_rep * R, R)
    lse_s = torch.logsumexp(z, dim=-1)
    lse = torch.logaddexp(lse_c, lse_s)
    p_self = torch.exp(z - lse[..., None])
    out = None
    if need_out:
        out = out_c * torch.exp(lse_c - lse)[..., None] + torch.matmul(p_self, vs)
        out = out.reshape(B, H, R, d).transpose(1, 2).contiguous()
    return out, lse, qg, p_self


def _weights(capture: AttentionCapture, R: int, dtype, device):
    """``(G, R)`` row weights of a "mean" capture: its ``row_weights``, or ``1 / rows``
    over its ``rows`` (all rows by default)."""
    import torch

    if capture.row_weights is not None:
        return capture.row_weights.to(dtype=dtype, device=device)
    w = torch.zeros(1, R, dtype=dtype, device=device)
    idx = torch.arange(R, device=device)[capture.rows] if capture.rows is not None else torch.arange(R, device=device)
    w[0, idx] = 1.0 / max(1, int(idx.numel()))
    return w


def _mean_from_lse(capture: AttentionCapture, key, lse, qg, p_self, R: int, H: int, scaling: float, K0: int):
    """A "mean" capture from the rows' log-sum-exps: ``sum_i w_gi exp(z_ij - lse_i)`` for
    context keys in chunks of :data:`CHUNK_KEYS`, and from ``p_self`` for the pass's own
    keys. Returns float32 ``(G, H, K0 + R)``."""
    import torch

    n_kv = key.shape[1]
    n_rep = H // n_kv
    w = _weights(capture, R, torch.float32, key.device)
    G = w.shape[0]
    out = torch.empty(G, H, K0 + R, dtype=torch.float32, device=key.device)
    shift = lse[..., None]
    for s in range(0, K0, CHUNK_KEYS):
        e = min(K0, s + CHUNK_KEYS)
        z = torch.matmul(qg, key[:, :, s:e].transpose(-1, -2))  # (1, n_kv, n_rep*R, c)
        z.mul_(scaling).sub_(shift).exp_()
        m = torch.matmul(w, z.view(n_kv * n_rep, R, e - s))  # (H, G, c)
        out[:, :, s:e] = m.transpose(0, 1)
    m = torch.matmul(w, p_self.reshape(n_kv * n_rep, R, R))  # (H, G, R)
    out[:, :, K0:] = m.transpose(0, 1)
    return out  # (G, H, K); G == 1 without row weights, like the general path's (batch, H, K)


def _split_forward(module, query, key, value, attention_mask, scaling: float, split: ContextSplit,
                   capture: AttentionCapture | None, last: bool):
    """The split fast path of :func:`heedrank_attention_forward` (see the module docstring)."""
    layer = int(module.layer_idx)
    wanted = capture if capture is not None and capture.wants(layer) else None
    if wanted is not None and wanted.mode != "mean":
        capture_rows(module, query, key, attention_mask, scaling, wanted)
        wanted = None
        if last:
            raise StopForward(layer)
    out, lse, qg, p_self = _merged_attention(query, key, value, split, scaling, need_out=not last)
    if wanted is not None:
        _, H, R, _ = query.shape
        wanted.out[layer] = _mean_from_lse(wanted, key, lse, qg, p_self, R, H, scaling, split.context_len)
    if last:
        raise StopForward(layer)
    return out, None


def heedrank_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention function registered as ``"heedrank"``: SDPA output plus optional row capture.

    Keywords (passed down by transformers): ``heedrank_capture`` (:class:`AttentionCapture`)
    and ``heedrank_split`` (:class:`ContextSplit`, the fast path of a query pass over a
    cached context; ``attention_mask`` must still be the full 4-D mask, which the general
    path uses).

    Raises:
        StopForward: after the capture's ``stop_after`` layer (whose attention output is
            not computed).
        JobCancelledError: the thread's cancellation token is set (:mod:`heedrank.cancel`).
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    check_cancelled()  # a layer boundary: stop here when nobody waits for the result (heedrank.cancel)
    capture: AttentionCapture | None = kwargs.pop("heedrank_capture", None)
    split: ContextSplit | None = kwargs.pop("heedrank_split", None)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    layer = int(module.layer_idx)
    last = capture is not None and capture.stop_after is not None and layer >= capture.stop_after
    if last and not capture.wants(layer):
        # The last layer that runs only has to fill the cache (updated before this call):
        # its attention output is never used, so skip computing it.
        raise StopForward(layer)
    if _split_ok(query, key, split):
        return _split_forward(module, query, key, value, attention_mask, scaling, split, capture, last)
    if last:  # only the captured rows are needed from the last layer
        capture_rows(module, query, key, attention_mask, scaling, capture)
        raise StopForward(layer)
    if _short_gqa(query, key, attention_mask):
        out = _grouped_sdpa(query, key, value, attention_mask, scaling)
    else:
        out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                        **kwargs)
    if capture is not None and capture.wants(layer):
        capture_rows(module, query, key, attention_mask, scaling, capture)
    return out, None


def ensure_registered() -> None:
    """Register the ``"heedrank"`` attention and mask functions with transformers (idempotent)."""
    global _REGISTERED
    if _REGISTERED:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register("heedrank", heedrank_attention_forward)
    AttentionMaskInterface.register("heedrank", sdpa_mask)
    _REGISTERED = True


@functools.cache
def _cache_argument(model_class: Any) -> str:
    """The name under which ``model_class.forward`` takes its KV cache: ``"cache"``
    (transformers from 5.2x) or ``"past_key_values"`` (earlier releases; still accepted, with a
    deprecation warning, until 5.40)."""
    params = inspect.signature(model_class.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def run_with_capture(model, capture: AttentionCapture | None = None, **inputs: Any):
    """Run ``model(**inputs)`` with ``capture``; returns the output, or ``None`` when the
    capture stopped the pass early (its cache, if any, was updated up to that layer).

    A KV cache is passed as ``cache=``; it reaches the model under the name its release of
    transformers takes (:func:`_cache_argument`)."""
    if "cache" in inputs and _cache_argument(model.__class__) != "cache":
        inputs["past_key_values"] = inputs.pop("cache")
    try:
        if capture is None:
            return model(**inputs)
        return model(**inputs, heedrank_capture=capture)
    except StopForward:
        return None

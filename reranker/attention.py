"""Query-row attention capture: read ``A[l,h][i,:]`` for a few rows without materialising
``(layers, heads, seq, seq)``.

The LM runs with the attention implementation ``"attnrank"``, registered here: it lets
PyTorch SDPA compute each layer's output (the fast path), and, when the forward pass is
given an :class:`AttentionCapture` (keyword ``attnrank_capture``, passed down by
transformers to every attention call), it also computes
``softmax(Q_rows K^T / sqrt(d_head) + mask)`` for the captured query rows only, from the
same query and key states (after RoPE, with the cache's keys). Cost per layer:
``O(heads * rows * keys * d_head)``, i.e. negligible next to the forward pass for the
short query spans of ICR and the signal tokens of BlockRank.

The capture can also stop the forward pass after a given layer (raising
:class:`StopForward`), so that layers above the deepest layer that is read never run.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

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
            softmax probabilities per row, ``(batch, heads, rows, keys)``.
        stop_after: Raise :class:`StopForward` after this layer's attention (``None`` =
            run all layers).
        detach: Detach captured tensors from the autograd graph (``False`` for training).

    Attributes:
        out: ``{layer: tensor}`` filled during the forward pass.
    """

    layers: Collection[int] | None = None
    rows: Any = None
    mode: str = "mean"
    stop_after: int | None = None
    detach: bool = True
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


def attnrank_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention function registered as ``"attnrank"``: SDPA output plus optional row capture."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    capture: AttentionCapture | None = kwargs.pop("attnrank_capture", None)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    if capture is not None and capture.stop_after is not None and not capture.wants(int(module.layer_idx)):
        if int(module.layer_idx) >= capture.stop_after:
            # The last layer that runs only has to fill the cache (updated before this call):
            # its attention output is never used, so skip computing it.
            raise StopForward(int(module.layer_idx))
    if _short_gqa(query, key, attention_mask):
        out = _grouped_sdpa(query, key, value, attention_mask, scaling)
    else:
        out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout,
                                        **kwargs)
    if capture is not None:
        layer = int(module.layer_idx)
        if capture.wants(layer):
            capture_rows(module, query, key, attention_mask, scaling, capture)
        if capture.stop_after is not None and layer >= capture.stop_after:
            raise StopForward(layer)
    return out, None


def ensure_registered() -> None:
    """Register the ``"attnrank"`` attention and mask functions with transformers (idempotent)."""
    global _REGISTERED
    if _REGISTERED:
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register("attnrank", attnrank_attention_forward)
    AttentionMaskInterface.register("attnrank", sdpa_mask)
    _REGISTERED = True


def run_with_capture(model, capture: AttentionCapture | None = None, **inputs: Any):
    """Run ``model(**inputs)`` with ``capture``; returns the output, or ``None`` when the
    capture stopped the pass early (its cache, if any, was updated up to that layer)."""
    try:
        if capture is None:
            return model(**inputs)
        return model(**inputs, attnrank_capture=capture)
    except StopForward:
        return None

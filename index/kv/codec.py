"""How one block's keys and values are laid out in a store: one codec class per dtype.

A block's keys and values are each ``(L, H, T, D)`` (``L = l* + 1`` layers, ``H`` key/value
heads, ``T`` tokens, ``D`` channels per head). The payload of its entry (crc32 over exactly
these bytes):

* :class:`Float16Codec` (``"float16"``): keys fp16 ``(L, H, T, D)`` then values fp16
  ``(L, H, T, D)``: ``4 * L*H*T*D`` bytes. Exact for fp16 models.
* :class:`Int8Codec` (``"int8"``): key scales fp32 ``(L, H, D)`` (per channel, over the
  block's tokens), value scales fp32 ``(L, H, T)`` (per token, over channels), keys int8
  ``(L, H, T, D)``, values int8 ``(L, H, T, D)``: ``2 * L*H*T*D + 4 * L*H*(D + T)`` bytes.
  Symmetric rounding to ``[-127, 127]``; the error per element is at most ``scale / 2``.

At SmolLM2-135M's shape (l* = 15 so L = 16, H = 3, D = 64) a 96-token block takes
1,179,648 bytes in fp16 and 620,544 bytes in int8 (0.53x).

A keys-only probe store (header ``keys_only``, issue #23) drops the values part of each
layout: fp16 ``2 * L*H*T*D``; int8 ``L*H*T*D + 4 * L*H*D``; and :class:`Int4Codec`
(``"int4"``, probe stores only): key offsets and scales fp32 ``(L, H, D)`` (asymmetric per
channel: the min over the block's tokens and ``(max - min) / 15``), then codes in ``[0, 15]``
packed two per byte (low nibble first): ``ceil(L*H*T*D / 2) + 8 * L*H*D`` bytes. A
132-token block of one layer takes 50,688 bytes in fp16, 26,112 in int8 and 14,208 in int4. :meth:`Codec.decode` then returns
``(keys, None)``.

A codec is chosen once per store by its header's dtype (:func:`codec_for`); a third dtype
is one more class in :data:`CODECS` and one more name in :data:`attnrank.blocks.KV_DTYPES`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from attnrank.blocks import KV_DTYPES, KVHeader
from attnrank.errors import ValidationError

__all__ = ["CODECS", "Codec", "Float16Codec", "Int4Codec", "Int8Codec", "codec_for", "dequantize_int8", "quantize_int4",
           "quantize_int8", "quantize_keys_int8"]


def quantize_int8(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Symmetric int8 quantisation of one document block.

    Args:
        keys: float ``(L, H, T, D)``.
        values: float ``(L, H, T, D)``.

    Returns:
        ``(key_scale, value_scale, key_q, value_q)``: float32 ``(L, H, D)`` (per key channel,
        ``max_T |k| / 127``), float32 ``(L, H, T)`` (per value token, ``max_D |v| / 127``), int8
        ``(L, H, T, D)`` twice. An all-zero channel/token gets scale 1 (its codes are 0).
        ``|x - q * scale| <= scale / 2`` per element (up to float32 rounding).
    """
    k = np.asarray(keys, dtype=np.float32)
    v = np.asarray(values, dtype=np.float32)
    ks = np.abs(k).max(axis=2) / np.float32(127.0)
    vs = np.abs(v).max(axis=3) / np.float32(127.0)
    ks[ks == 0] = 1.0
    vs[vs == 0] = 1.0
    kq = np.clip(np.rint(k / ks[:, :, None, :]), -127, 127).astype(np.int8)
    vq = np.clip(np.rint(v / vs[:, :, :, None]), -127, 127).astype(np.int8)
    return ks.astype(np.float32), vs.astype(np.float32), kq, vq


def quantize_keys_int8(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Keys only (a probe store): float32 scales ``(L, H, D)`` per channel and int8 codes
    ``(L, H, T, D)``, as :func:`quantize_int8` does keys."""
    k = np.asarray(keys, dtype=np.float32)
    ks = np.abs(k).max(axis=2) / np.float32(127.0)
    ks[ks == 0] = 1.0
    return ks.astype(np.float32), np.clip(np.rint(k / ks[:, :, None, :]), -127, 127).astype(np.int8)


def quantize_int4(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """4-bit keys (a probe store), asymmetric per channel: float32 offsets ``(L, H, D)`` (the
    channel's min over the block's tokens) and scales ``(L, H, D)`` (``(max - min) / 15``),
    then uint8 ``(ceil(L*H*T*D / 2),)``: codes ``q`` in ``[0, 15]`` two per byte, the even
    element in the low nibble. ``|k - (offset + q * scale)| <= scale / 2`` per element.

    Asymmetric because keys carry large per-channel offsets: on NFCorpus dev (120 queries,
    probe layers 8 and 9) symmetric 4-bit codes lost 1.3 nDCG@10 of the pure reranker and
    these none (``bench/probe_codecs.py``, docs/RESULTS.md "The probe store")."""
    k = np.asarray(keys, dtype=np.float32)
    lo = k.min(axis=2)
    scale = (k.max(axis=2) - lo) / np.float32(15.0)
    scale[scale == 0] = 1.0
    q = np.clip(np.rint((k - lo[:, :, None, :]) / scale[:, :, None, :]), 0, 15).astype(np.uint8).reshape(-1)
    if q.size % 2:
        q = np.concatenate([q, np.zeros(1, np.uint8)])
    return lo.astype(np.float32), scale.astype(np.float32), (q[0::2] | (q[1::2] << 4)).astype(np.uint8)


def dequantize_int4(offset: np.ndarray, scale: np.ndarray, packed: np.ndarray,
                    shape: tuple[int, int, int, int]) -> np.ndarray:
    """Inverse of :func:`quantize_int4`: float32 keys of ``shape``."""
    n = int(np.prod(shape))
    q = np.empty(2 * packed.size, dtype=np.float32)
    q[0::2] = packed & 15
    q[1::2] = packed >> 4
    k = q[:n].reshape(shape)
    k *= scale[:, :, None, :]
    k += offset[:, :, None, :]
    return k


def dequantize_int8(key_scale: np.ndarray, value_scale: np.ndarray, key_q: np.ndarray, value_q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`quantize_int8`: float32 ``(L, H, T, D)`` keys and values."""
    k = key_q.astype(np.float32)
    k *= key_scale[:, :, None, :]
    v = value_q.astype(np.float32)
    v *= value_scale[:, :, :, None]
    return k, v


_F16_TABLE: np.ndarray | None = None


def _f16_table() -> np.ndarray:
    """float32 ``(65536,)``: the value of every float16 bit pattern (256 KiB, built once)."""
    global _F16_TABLE
    if _F16_TABLE is None:
        with np.errstate(invalid="ignore"):
            _F16_TABLE = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    return _F16_TABLE


class Codec:
    """Byte layout of one block for a store's header (shape ``L, H, D``, block length).

    Args:
        header: The store's header; its dtype must be this codec's :attr:`dtype`.
    """

    dtype: ClassVar[str]

    def __init__(self, header: KVHeader) -> None:
        self.header = header
        self.shape_text = f"({header.n_layers}, {header.kv_heads}, T, {header.head_dim})"

    def nbytes(self, tokens: int) -> int:
        """Payload bytes of one block of ``tokens`` tokens (no alignment padding)."""
        raise NotImplementedError

    def encode(self, key: str, keys: Any, values: Any) -> tuple[int, list[np.ndarray]]:
        """Check one block and return ``(T, payload parts)``: contiguous arrays whose bytes,
        in order, are the entry's payload (:meth:`nbytes` of ``T`` in all).

        Args:
            key: The block's key (named in error messages).
            keys, values: float arrays ``(n_layers, kv_heads, T, head_dim)``, ``1 <= T <= max_doc_tokens``.

        Raises:
            ValidationError: wrong shape, non-float or non-finite values, or values beyond
                what the dtype holds.
        """
        header = self.header
        if header.probe:
            return self._encode_keys(key, keys, values)
        k, v = np.asarray(keys), np.asarray(values)
        if k.ndim != 4 or k.shape != v.shape:
            raise ValidationError(
                f"document {key!r}: keys of shape {k.shape} and values of shape {v.shape}; both must "
                f"be (n_layers, kv_heads, T, head_dim) = {self.shape_text}"
            )
        T = int(k.shape[2])
        if k.shape != header.doc_shape(T) or not 1 <= T <= header.max_doc_tokens:
            raise ValidationError(
                f"document {key!r}: keys/values of shape {k.shape}, expected {self.shape_text} "
                f"with 1 <= T <= max_doc_tokens={header.max_doc_tokens}"
            )
        if not (np.issubdtype(k.dtype, np.floating) and np.issubdtype(v.dtype, np.floating)):
            raise ValidationError(f"document {key!r}: keys/values must be floating point, got {k.dtype}/{v.dtype}")
        return T, self._parts(key, k, v)

    def _encode_keys(self, key: str, keys: Any, values: Any) -> tuple[int, list[np.ndarray]]:
        """:meth:`encode` for a keys-only store: ``values`` must be ``None``."""
        header = self.header
        if values is not None:
            raise ValidationError(f"document {key!r}: this store keeps keys only (a probe store); pass values=None")
        k = np.asarray(keys)
        T = int(k.shape[2]) if k.ndim == 4 else 0
        if k.ndim != 4 or k.shape != header.doc_shape(T) or not 1 <= T <= header.max_doc_tokens:
            raise ValidationError(
                f"document {key!r}: keys of shape {k.shape}, expected {self.shape_text} "
                f"with 1 <= T <= max_doc_tokens={header.max_doc_tokens} (layers {list(header.stored_layers)})")
        if not np.issubdtype(k.dtype, np.floating):
            raise ValidationError(f"document {key!r}: keys must be floating point, got {k.dtype}")
        if not np.isfinite(k).all():
            raise ValidationError(f"document {key!r}: keys contain NaN or inf")
        return T, self._key_parts(key, k)

    def _parts(self, key: str, k: np.ndarray, v: np.ndarray) -> list[np.ndarray]:
        raise NotImplementedError

    def _key_parts(self, key: str, k: np.ndarray) -> list[np.ndarray]:
        raise ValidationError(f"dtype {self.dtype!r} has no keys-only layout")

    def decode(self, buf: np.ndarray, tokens: int, out: str = "float32") -> tuple[np.ndarray, np.ndarray | None]:
        """``(keys, values)`` as new ``out`` (``"float32"`` or ``"float16"``) arrays
        ``(L, H, T, D)`` from a uint8 view of one entry's payload (:meth:`nbytes` bytes);
        ``values`` is ``None`` in a keys-only store."""
        raise NotImplementedError


class Float16Codec(Codec):
    """``"float16"``: keys then values, fp16, ``4 * L*H*T*D`` bytes."""

    dtype = "float16"

    def nbytes(self, tokens: int) -> int:
        h = self.header
        return (2 if h.probe else 4) * h.n_layers * h.kv_heads * tokens * h.head_dim

    def _key_parts(self, key: str, k: np.ndarray) -> list[np.ndarray]:
        with np.errstate(over="ignore", invalid="ignore"):
            half = np.ascontiguousarray(k, dtype=np.float16)
        if not np.isfinite(half).all():
            raise ValidationError(f"document {key!r}: keys exceed the float16 range")
        return [half]

    def _parts(self, key: str, k: np.ndarray, v: np.ndarray) -> list[np.ndarray]:
        with np.errstate(over="ignore", invalid="ignore"):  # checked just below
            parts = [np.ascontiguousarray(k, dtype=np.float16), np.ascontiguousarray(v, dtype=np.float16)]
        if not (np.isfinite(parts[0]).all() and np.isfinite(parts[1]).all()):
            raise ValidationError(f"document {key!r}: keys/values contain NaN/inf or exceed the float16 range")
        return parts

    def decode(self, buf: np.ndarray, tokens: int, out: str = "float32") -> tuple[np.ndarray, np.ndarray]:
        h = self.header
        L, H, D, T = h.n_layers, h.kv_heads, h.head_dim, tokens
        n = L * H * T * D
        if h.probe:
            bits = buf[: 2 * n].view(np.uint16)
            if out == "float16":
                return bits.view(np.float16).reshape(L, H, T, D).copy(), None
            return np.take(_f16_table(), bits).reshape(L, H, T, D), None
        if out == "float16":
            half = buf[: 4 * n].view(np.float16)
            return half[:n].reshape(L, H, T, D).copy(), half[n:].reshape(L, H, T, D).copy()
        # a 65,536-entry table lookup is bit-identical to numpy's fp16 -> fp32 cast and
        # ~2.6x faster (0.33 vs 0.88 ms for one SmolLM2 block on this machine)
        bits = buf[: 4 * n].view(np.uint16)
        lut = _f16_table()
        return np.take(lut, bits[:n]).reshape(L, H, T, D), np.take(lut, bits[n:]).reshape(L, H, T, D)


class Int8Codec(Codec):
    """``"int8"``: per-channel key scales, per-token value scales (fp32), then int8 keys and
    values (:func:`quantize_int8`), ``2 * L*H*T*D + 4 * L*H*(D + T)`` bytes."""

    dtype = "int8"

    def nbytes(self, tokens: int) -> int:
        h = self.header
        if h.probe:
            return h.n_layers * h.kv_heads * tokens * h.head_dim + 4 * h.n_layers * h.kv_heads * h.head_dim
        return 2 * h.n_layers * h.kv_heads * tokens * h.head_dim + 4 * h.n_layers * h.kv_heads * (h.head_dim + tokens)

    def _key_parts(self, key: str, k: np.ndarray) -> list[np.ndarray]:
        return list(quantize_keys_int8(k))

    def _parts(self, key: str, k: np.ndarray, v: np.ndarray) -> list[np.ndarray]:
        if not (np.isfinite(k).all() and np.isfinite(v).all()):
            raise ValidationError(f"document {key!r}: keys/values contain NaN or inf")
        return list(quantize_int8(k, v))

    def decode(self, buf: np.ndarray, tokens: int, out: str = "float32") -> tuple[np.ndarray, np.ndarray]:
        h = self.header
        L, H, D, T = h.n_layers, h.kv_heads, h.head_dim, tokens
        n = L * H * T * D
        if h.probe:
            scale = buf[: 4 * L * H * D].view(np.float32).reshape(L, H, D)
            k = buf[4 * L * H * D: 4 * L * H * D + n].view(np.int8).reshape(L, H, T, D).astype(np.float32)
            k *= scale[:, :, None, :]
            return (k if out == "float32" else k.astype(out)), None
        o = 0
        ks = buf[o : o + 4 * L * H * D].view(np.float32).reshape(L, H, D)
        o += 4 * L * H * D
        vs = buf[o : o + 4 * L * H * T].view(np.float32).reshape(L, H, T)
        o += 4 * L * H * T
        kq = buf[o : o + n].view(np.int8).reshape(L, H, T, D)
        vq = buf[o + n : o + 2 * n].view(np.int8).reshape(L, H, T, D)
        k, v = dequantize_int8(ks, vs, kq, vq)
        return (k, v) if out == "float32" else (k.astype(out), v.astype(out))


class Int4Codec(Codec):
    """``"int4"`` (keys-only probe stores): per-channel fp32 offsets and scales, then 4-bit
    codes two per byte (:func:`quantize_int4`), ``ceil(L*H*T*D / 2) + 8 * L*H*D`` bytes."""

    dtype = "int4"

    def nbytes(self, tokens: int) -> int:
        h = self.header
        n = h.n_layers * h.kv_heads * tokens * h.head_dim
        return (n + 1) // 2 + 8 * h.n_layers * h.kv_heads * h.head_dim

    def _key_parts(self, key: str, k: np.ndarray) -> list[np.ndarray]:
        return list(quantize_int4(k))

    def _parts(self, key: str, k: np.ndarray, v: np.ndarray) -> list[np.ndarray]:
        raise ValidationError("dtype 'int4' holds keys only (a probe store)")

    def decode(self, buf: np.ndarray, tokens: int, out: str = "float32") -> tuple[np.ndarray, np.ndarray | None]:
        h = self.header
        L, H, D, T = h.n_layers, h.kv_heads, h.head_dim, tokens
        n = L * H * T * D
        c = L * H * D
        offset = buf[: 4 * c].view(np.float32).reshape(L, H, D)
        scale = buf[4 * c: 8 * c].view(np.float32).reshape(L, H, D)
        k = dequantize_int4(offset, scale, buf[8 * c: 8 * c + (n + 1) // 2], (L, H, T, D))
        return (k if out == "float32" else k.astype(out)), None


CODECS: dict[str, type[Codec]] = {c.dtype: c for c in (Float16Codec, Int8Codec, Int4Codec)}
"""The codec class of each dtype of :data:`attnrank.blocks.KV_DTYPES`."""


def codec_for(header: KVHeader) -> Codec:
    """The codec of ``header.dtype`` for ``header``'s shape.

    Raises:
        ValidationError: a dtype without a codec (the message lists those with one).
    """
    try:
        cls = CODECS[header.dtype]
    except KeyError:
        raise ValidationError(f"no KV store codec for dtype {header.dtype!r}; choose one of {sorted(CODECS)}") from None
    return cls(header)


if set(CODECS) != set(KV_DTYPES):  # pragma: no cover - a dtype added on one side only
    raise ImportError(f"KV store codecs {sorted(CODECS)} do not match attnrank.blocks.KV_DTYPES {sorted(KV_DTYPES)}")

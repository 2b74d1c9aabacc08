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

* :class:`Int4Codec` (``"int4"``): key offsets and scales fp32 ``(L, H, D)`` (asymmetric
  per channel: the min over the block's tokens and ``(max - min) / 15``), value offsets and
  scales fp32 ``(L, H, T)`` (asymmetric per token, as KIVI), then codes in ``[0, 15]``
  packed two per byte (low nibble first), keys then values.

Issue #23's layouts store values at fewer layers than keys: ``V`` value layers
(``header.n_value_layers``) beside ``L`` key layers. A keys-only probe store (``V = 0``)
drops the values parts: fp16 ``2 * L*H*T*D``; int8 ``L*H*T*D + 4 * L*H*D``; int4
``ceil(L*H*T*D / 2) + 8 * L*H*D``; a 132-token block of one layer's keys takes 50,688 bytes
in fp16, 26,112 in int8 and 14,208 in int4, and :meth:`Codec.decode` returns ``(keys,
None)``. A window store (values at the layers ``m..l*-1`` only) sums its keys part and its
values part: one layer's values of a 132-token block take 15,840 bytes in int4.

A codec is chosen once per store by its header's dtype (:func:`codec_for`); a third dtype
is one more class in :data:`CODECS` and one more name in :data:`heedrank.blocks.KV_DTYPES`.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from heedrank.blocks import KV_DTYPES, KVHeader
from heedrank.errors import ValidationError

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


def quantize_int4(keys: np.ndarray, axis: int = 2) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """4-bit codes, asymmetric: float32 offsets and scales (the min over ``axis`` and
    ``(max - min) / 15``), then uint8 ``(ceil(L*H*T*D / 2),)``: codes ``q`` in ``[0, 15]``
    two per byte, the even element in the low nibble. ``|x - (offset + q * scale)| <=
    scale / 2`` per element.

    Args:
        keys: float ``(L, H, T, D)`` keys or values.
        axis: ``2``: per channel (offsets ``(L, H, D)``, over the block's tokens: keys);
            ``3``: per token (offsets ``(L, H, T)``, over channels: values, as KIVI does,
            Liu et al. 2024).

    Keys are coded per channel and asymmetrically because they carry large per-channel
    offsets: on NFCorpus dev (120 queries, probe layers 8 and 9) symmetric 4-bit codes lost
    1.3 nDCG@10 of the pure reranker and these none (``bench/probe_codecs.py``,
    docs/RESULTS.md "The probe store")."""
    k = np.asarray(keys, dtype=np.float32)
    lo = k.min(axis=axis)
    scale = (k.max(axis=axis) - lo) / np.float32(15.0)
    scale[scale == 0] = 1.0
    q = np.clip(np.rint((k - np.expand_dims(lo, axis)) / np.expand_dims(scale, axis)), 0, 15).astype(np.uint8).reshape(-1)
    if q.size % 2:
        q = np.concatenate([q, np.zeros(1, np.uint8)])
    return lo.astype(np.float32), scale.astype(np.float32), (q[0::2] | (q[1::2] << 4)).astype(np.uint8)


def dequantize_int4(offset: np.ndarray, scale: np.ndarray, packed: np.ndarray,
                    shape: tuple[int, int, int, int], axis: int = 2) -> np.ndarray:
    """Inverse of :func:`quantize_int4`: float32 array of ``shape``."""
    n = int(np.prod(shape))
    q = np.empty(2 * packed.size, dtype=np.float32)
    q[0::2] = packed & 15
    q[1::2] = packed >> 4
    k = q[:n].reshape(shape)
    k *= np.expand_dims(scale, axis)
    k += np.expand_dims(offset, axis)
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

    Keys are ``(L, H, T, D)`` with ``L = header.n_layers`` (the stored layers), values
    ``(V, H, T, D)`` with ``V = header.n_value_layers`` (``L`` in a full store, fewer in a
    window store, none in a keys-only probe store, whose values are ``None``).

    Args:
        header: The store's header; its dtype must be this codec's :attr:`dtype`.
    """

    dtype: ClassVar[str]

    def __init__(self, header: KVHeader) -> None:
        self.header = header
        self.shape_text = f"({header.n_layers}, {header.kv_heads}, T, {header.head_dim})"
        self.value_text = f"({header.n_value_layers}, {header.kv_heads}, T, {header.head_dim})"

    def nbytes(self, tokens: int) -> int:
        """Payload bytes of one block of ``tokens`` tokens (no alignment padding)."""
        raise NotImplementedError

    def encode(self, key: str, keys: Any, values: Any) -> tuple[int, list[np.ndarray]]:
        """Check one block and return ``(T, payload parts)``: contiguous arrays whose bytes,
        in order, are the entry's payload (:meth:`nbytes` of ``T`` in all).

        Args:
            key: The block's key (named in error messages).
            keys: float ``(n_layers, kv_heads, T, head_dim)``, ``1 <= T <= max_doc_tokens``.
            values: float ``(n_value_layers, kv_heads, T, head_dim)``; ``None`` in a keys-only store.

        Raises:
            ValidationError: wrong shape, non-float or non-finite values, or values beyond
                what the dtype holds.
        """
        header = self.header
        k = np.asarray(keys)
        T = int(k.shape[2]) if k.ndim == 4 else 0
        where = "" if header.layout == "full" else f" ({header.layout} store: layers {list(header.stored_layers)}" + (
            f", values at {list(header.stored_value_layers)})" if header.n_value_layers else ", keys only)")
        if header.n_value_layers == 0:
            if values is not None:
                raise ValidationError(f"document {key!r}: this store keeps keys only (a probe store); pass values=None")
            v = None
        else:
            if values is None:
                raise ValidationError(f"document {key!r}: this store keeps values{where}; pass them")
            v = np.asarray(values)
        if (k.ndim != 4 or k.shape != header.doc_shape(T) or not 1 <= T <= header.max_doc_tokens
                or (v is not None and v.shape != header.value_shape(T))):
            got = f"keys of shape {k.shape}" + ("" if v is None else f" and values of shape {v.shape}")
            raise ValidationError(
                f"document {key!r}: {got}, expected keys {self.shape_text}"
                + ("" if v is None else f" and values {self.value_text}")
                + f" with 1 <= T <= max_doc_tokens={header.max_doc_tokens}{where}")
        if not (np.issubdtype(k.dtype, np.floating) and (v is None or np.issubdtype(v.dtype, np.floating))):
            raise ValidationError(f"document {key!r}: keys/values must be floating point, got {k.dtype}"
                                  + ("" if v is None else f"/{v.dtype}"))
        return T, self._parts(key, k, v)

    def _parts(self, key: str, k: np.ndarray, v: np.ndarray | None) -> list[np.ndarray]:
        raise NotImplementedError

    def decode(self, buf: np.ndarray, tokens: int, out: str = "float32") -> tuple[np.ndarray, np.ndarray | None]:
        """``(keys, values)`` as new ``out`` (``"float32"`` or ``"float16"``) arrays
        ``(L, H, T, D)`` and ``(V, H, T, D)`` from a uint8 view of one entry's payload
        (:meth:`nbytes` bytes); ``values`` is ``None`` in a keys-only store."""
        raise NotImplementedError

    def _sizes(self, tokens: int) -> tuple[int, int, int, int, int]:
        """``(L, V, H, D, T)``."""
        h = self.header
        return h.n_layers, h.n_value_layers, h.kv_heads, h.head_dim, tokens


def _finite(key: str, k: np.ndarray, v: np.ndarray | None) -> None:
    if not (np.isfinite(k).all() and (v is None or np.isfinite(v).all())):
        raise ValidationError(f"document {key!r}: keys/values contain NaN or inf")


class Float16Codec(Codec):
    """``"float16"``: keys then values, fp16, ``2 * (L + V) * H*T*D`` bytes."""

    dtype = "float16"

    def nbytes(self, tokens: int) -> int:
        L, V, H, D, T = self._sizes(tokens)
        return 2 * (L + V) * H * T * D

    def _parts(self, key: str, k: np.ndarray, v: np.ndarray | None) -> list[np.ndarray]:
        with np.errstate(over="ignore", invalid="ignore"):  # checked just below
            parts = [np.ascontiguousarray(x, dtype=np.float16) for x in (k, v) if x is not None]
        if not all(np.isfinite(p).all() for p in parts):
            raise ValidationError(f"document {key!r}: keys/values contain NaN/inf or exceed the float16 range")
        return parts

    def decode(self, buf: np.ndarray, tokens: int, out: str = "float32") -> tuple[np.ndarray, np.ndarray | None]:
        L, V, H, D, T = self._sizes(tokens)
        n, m = L * H * T * D, V * H * T * D
        if out == "float16":
            half = buf[: 2 * (n + m)].view(np.float16)
            return half[:n].reshape(L, H, T, D).copy(), (half[n:].reshape(V, H, T, D).copy() if V else None)
        # a 65,536-entry table lookup is bit-identical to numpy's fp16 -> fp32 cast and
        # ~2.6x faster (0.33 vs 0.88 ms for one SmolLM2 block on this machine)
        bits = buf[: 2 * (n + m)].view(np.uint16)
        lut = _f16_table()
        return np.take(lut, bits[:n]).reshape(L, H, T, D), (np.take(lut, bits[n:]).reshape(V, H, T, D) if V else None)


class Int8Codec(Codec):
    """``"int8"``: per-channel key scales fp32 ``(L, H, D)``, per-token value scales fp32
    ``(V, H, T)``, then int8 keys and values (:func:`quantize_int8`):
    ``(L + V) * H*T*D + 4 * H * (L*D + V*T)`` bytes."""

    dtype = "int8"

    def nbytes(self, tokens: int) -> int:
        L, V, H, D, T = self._sizes(tokens)
        return (L + V) * H * T * D + 4 * H * (L * D + V * T)

    def _parts(self, key: str, k: np.ndarray, v: np.ndarray | None) -> list[np.ndarray]:
        _finite(key, k, v)
        if v is None:
            return list(quantize_keys_int8(k))
        ks, kq = quantize_keys_int8(k)
        vv = np.asarray(v, dtype=np.float32)
        vs = np.abs(vv).max(axis=3) / np.float32(127.0)
        vs[vs == 0] = 1.0
        vq = np.clip(np.rint(vv / vs[:, :, :, None]), -127, 127).astype(np.int8)
        return [ks, vs.astype(np.float32), kq, vq]

    def decode(self, buf: np.ndarray, tokens: int, out: str = "float32") -> tuple[np.ndarray, np.ndarray | None]:
        L, V, H, D, T = self._sizes(tokens)
        n, m = L * H * T * D, V * H * T * D
        o = 0
        ks = buf[o: o + 4 * L * H * D].view(np.float32).reshape(L, H, D)
        o += 4 * L * H * D
        vs = buf[o: o + 4 * V * H * T].view(np.float32).reshape(V, H, T)
        o += 4 * V * H * T
        k = buf[o: o + n].view(np.int8).reshape(L, H, T, D).astype(np.float32)
        k *= ks[:, :, None, :]
        v = None
        if V:
            v = buf[o + n: o + n + m].view(np.int8).reshape(V, H, T, D).astype(np.float32)
            v *= vs[:, :, :, None]
        if out == "float32":
            return k, v
        return k.astype(out), (None if v is None else v.astype(out))


class Int4Codec(Codec):
    """``"int4"``: key offsets and scales fp32 ``(L, H, D)`` (asymmetric per channel), value
    offsets and scales fp32 ``(V, H, T)`` (asymmetric per token), then the 4-bit key codes
    and the 4-bit value codes, each packed two per byte (:func:`quantize_int4`):
    ``ceil(L*H*T*D / 2) + ceil(V*H*T*D / 2) + 8 * H * (L*D + V*T)`` bytes."""

    dtype = "int4"

    def nbytes(self, tokens: int) -> int:
        L, V, H, D, T = self._sizes(tokens)
        n, m = L * H * T * D, V * H * T * D
        return (n + 1) // 2 + (m + 1) // 2 + 8 * H * (L * D + V * T)

    def _parts(self, key: str, k: np.ndarray, v: np.ndarray | None) -> list[np.ndarray]:
        _finite(key, k, v)
        ko, kscale, kq = quantize_int4(k)
        if v is None:
            return [ko, kscale, kq]
        vo, vscale, vq = quantize_int4(v, axis=3)
        return [ko, kscale, vo, vscale, kq, vq]

    def decode(self, buf: np.ndarray, tokens: int, out: str = "float32") -> tuple[np.ndarray, np.ndarray | None]:
        L, V, H, D, T = self._sizes(tokens)
        n, m = L * H * T * D, V * H * T * D
        c, t = L * H * D, V * H * T
        offset = buf[: 4 * c].view(np.float32).reshape(L, H, D)
        scale = buf[4 * c: 8 * c].view(np.float32).reshape(L, H, D)
        o = 8 * c
        voff = buf[o: o + 4 * t].view(np.float32).reshape(V, H, T)
        vscale = buf[o + 4 * t: o + 8 * t].view(np.float32).reshape(V, H, T)
        o += 8 * t
        k = dequantize_int4(offset, scale, buf[o: o + (n + 1) // 2], (L, H, T, D))
        o += (n + 1) // 2
        v = dequantize_int4(voff, vscale, buf[o: o + (m + 1) // 2], (V, H, T, D), axis=3) if V else None
        if out == "float32":
            return k, v
        return k.astype(out), (None if v is None else v.astype(out))


CODECS: dict[str, type[Codec]] = {c.dtype: c for c in (Float16Codec, Int8Codec, Int4Codec)}
"""The codec class of each dtype of :data:`heedrank.blocks.KV_DTYPES`."""


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
    raise ImportError(f"KV store codecs {sorted(CODECS)} do not match heedrank.blocks.KV_DTYPES {sorted(KV_DTYPES)}")

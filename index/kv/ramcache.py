"""The RAM tier of a document KV store: decoded blocks in a byte-bounded LRU.

A read from disk verifies an entry's crc32 and decodes its payload
(:meth:`heedrank.index.kv.codec.Codec.decode`); :class:`RamCache` keeps what that returns,
read-only, so a block asked for again skips both. It is filled only through
:meth:`RamCache.load`, the ``load`` hook of :meth:`heedrank.index.kv.manifest.Manifest.read_many`
(run under the manifest's read lock), and emptied of a key by :meth:`RamCache.invalidate`,
the manifest's ``invalidate`` hook (run under its write lock), so it never serves bytes a
commit replaced or removed.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from heedrank.blocks import BlockKey
from heedrank.config import KV_CACHE_BUDGET
from heedrank.errors import ValidationError
from heedrank.index.kv.codec import Codec
from heedrank.index.kv.format import Loc
from heedrank.lru import ByteLRU, CacheStats

__all__ = ["OUT_DTYPES", "RamCache"]

OUT_DTYPES = ("float32", "float16")
"""What a store's reads may return (``out_dtype``)."""


def _readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


class RamCache:
    """Decoded ``(keys, values)`` of one store's blocks in RAM, least recently used first out.

    Thread-safe (:class:`heedrank.lru.ByteLRU`). Each block is counted at the ``nbytes`` of
    its two arrays.

    Args:
        codec: The store's payload layout (decodes a verified payload).
        cache_bytes: LRU budget in bytes (0 disables it; ``None``:
            :data:`heedrank.config.KV_CACHE_BUDGET`, i.e. ``$HEEDRANK_KV_CACHE_BYTES`` or 512 MiB).
        out_dtype: The dtype of the arrays decoded, kept and returned: ``"float32"`` or ``"float16"``.

    Raises:
        ValidationError: a bad ``out_dtype``, or ``$HEEDRANK_KV_CACHE_BYTES`` is not a byte count.
    """

    def __init__(self, codec: Codec, *, cache_bytes: int | None, out_dtype: str) -> None:
        if out_dtype not in OUT_DTYPES:
            raise ValidationError(f"out_dtype must be 'float32' or 'float16', got {out_dtype!r}")
        self._lru = ByteLRU(KV_CACHE_BUDGET.from_env() if cache_bytes is None else int(cache_bytes))
        self.codec = codec
        self.out_dtype = out_dtype

    def lookup(self, keys: Iterable[BlockKey]) -> tuple[dict[BlockKey, tuple[np.ndarray, np.ndarray]], list[BlockKey]]:
        """``(hits, misses)`` among ``keys`` (each counted as one): ``{key: (keys, values)}``
        read-only arrays ``(n_layers, kv_heads, T, head_dim)`` of :attr:`out_dtype`, and the
        keys not held, both in the order given."""
        hits: dict[BlockKey, tuple[np.ndarray, np.ndarray]] = {}
        misses: list[BlockKey] = []
        for key in keys:
            kv = self._lru.get(key)
            if kv is None:
                misses.append(key)
            else:
                hits[key] = kv
        return hits, misses

    def load(self, key: BlockKey, loc: Loc, payload: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Decode the verified uint8 ``payload`` of block ``key`` (at ``loc``) into new
        read-only arrays ``(n_layers, kv_heads, loc.tokens, head_dim)`` of :attr:`out_dtype`,
        keep them and return them. Call it under the manifest's read lock (as
        :meth:`heedrank.index.kv.manifest.Manifest.read_many` does): no commit can then
        invalidate ``key`` between the read and the insert."""
        k, v = self.codec.decode(payload, loc.tokens, self.out_dtype)
        kv = (_readonly(k), _readonly(v))
        self._lru.put(key, kv, k.nbytes + v.nbytes)
        return kv

    def invalidate(self, keys: Iterable[BlockKey]) -> None:
        """Forget ``keys`` (their stored bytes changed or went away)."""
        for key in keys:
            self._lru.pop(key)

    def clear(self) -> None:
        """Forget every block (a reload or close)."""
        self._lru.clear()

    def stats(self) -> CacheStats:
        """The LRU's counters (hits, misses, evictions, bytes)."""
        return self._lru.stats()

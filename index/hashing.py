"""A model-free, deterministic bag-of-words encoder (feature hashing).

For unit tests and demos where loading a neural model is too slow: texts sharing words get
a positive cosine similarity. It is not a retrieval model; do not build real indexes with it.
"""

from __future__ import annotations

import hashlib
import re
import zlib
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

_WORD = re.compile(r"\w+")


class HashingEncoder:
    """Signed feature hashing of lower-cased words; implements :class:`heedrank.protocols.Encoder`.

    Each word adds ``+-1`` to bucket ``crc32(word) % dim`` (sign from another crc32 bit);
    rows are L2-normalised. A text without words maps to the zero vector.

    Args:
        dim: Vector dimension.

    Example:
        >>> enc = HashingEncoder(16)
        >>> v = enc.encode_queries(["apple pie", "apple"])
        >>> v.shape, v.dtype.name, round(float(v[0] @ v[1]), 3)
        ((2, 16), 'float32', 0.707)
    """

    def __init__(self, dim: int = 64) -> None:
        self.dim = int(dim)

    def _encode(self, texts: Iterable[str]) -> np.ndarray:
        rows = []
        for text in texts:
            v = np.zeros(self.dim, dtype=np.float32)
            for word in _WORD.findall(text.lower()):
                h = zlib.crc32(word.encode("utf-8"))
                v[h % self.dim] += 1.0 if (h >> 16) & 1 else -1.0
            norm = float(np.linalg.norm(v))
            rows.append(v / norm if norm > 0 else v)
        return np.stack(rows) if rows else np.zeros((0, self.dim), dtype=np.float32)

    def encode_queries(self, texts: Sequence[str], *, show_progress: bool = False) -> np.ndarray:
        """float32 ``(n, dim)``, L2-normalised rows (zero rows for texts without words)."""
        return self._encode(texts)

    def encode_documents(self, texts: Iterable[str], *, show_progress: bool = False) -> np.ndarray:
        """float32 ``(n, dim)``, L2-normalised rows (zero rows for texts without words)."""
        return self._encode(texts)

    def describe(self) -> dict[str, Any]:
        return {
            "name": f"hashing-{self.dim}",
            "sha256": hashlib.sha256(f"heedrank-hashing-encoder-v1-{self.dim}".encode()).hexdigest(),
            "dim": self.dim,
            "normalized": True,
        }

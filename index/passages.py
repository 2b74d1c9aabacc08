"""Passage chunking for long documents (dense vectors only; BM25 indexes whole documents).

The default embedder reads 256 word pieces; NFCorpus abstracts run to ~1,500 words, so
plain encoding sees only their beginning. With chunking each document becomes windows of
``max_words`` whitespace-separated words, ``stride`` words apart (the last window may be
shorter; at most ``max_passages`` windows, the rest of a longer document is dropped), each
prefixed with the title. Every passage gets its own vector, labelled
``vid << bits | j`` for passage ``j``, and a document's score is the maximum over its
passages (MaxP, Dai & Callan, SIGIR 2019).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from heedrank.errors import ValidationError
from heedrank.types import Document


@dataclass(frozen=True)
class PassageParams:
    """How documents are cut into passages (saved with the index).

    Attributes:
        max_words: Words per passage window.
        stride: Words between window starts (``< max_words`` gives overlap).
        max_passages: Most passages per document (a power of two is not required).
        title: Prefix every passage with the document title.
    """

    max_words: int = 128
    stride: int = 96
    max_passages: int = 32
    title: bool = True

    def __post_init__(self) -> None:
        if self.max_words < 1 or self.stride < 1 or self.max_passages < 1:
            raise ValidationError(f"passage parameters must be positive, got {self}")
        if self.stride > self.max_words:
            raise ValidationError(f"stride {self.stride} > max_words {self.max_words} would skip words")
        if self.max_passages > 1 << 16:
            raise ValidationError(f"max_passages must be at most {1 << 16}, got {self.max_passages}")

    @property
    def bits(self) -> int:
        """Label bits reserved for the passage number."""
        return max(1, math.ceil(math.log2(self.max_passages)))

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "bits": self.bits}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> PassageParams | None:
        if not data:
            return None
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in known})

    def split(self, doc: Document) -> list[str]:
        """The passages of one document (at least one, possibly just the title)."""
        words = doc.text.split()
        prefix = f"{doc.title} " if self.title and doc.title else ""
        out: list[str] = []
        start = 0
        while len(out) < self.max_passages:
            out.append(prefix + " ".join(words[start : start + self.max_words]))
            if start + self.max_words >= len(words):
                break
            start += self.stride
        return [p.strip() or doc.title for p in out]


def labels_for(vid: int, count: int, bits: int) -> np.ndarray:
    """int64 labels of a document's ``count`` vectors: ``vid << bits | j`` (``bits = 0``: ``[vid]``)."""
    if bits == 0:
        return np.array([vid], dtype=np.int64)
    return (np.int64(vid) << np.int64(bits)) | np.arange(count, dtype=np.int64)


def label_rows(vids: Sequence[int] | np.ndarray, vecs: Sequence[np.ndarray], bits: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """int64 labels ``vid << bits | j`` and the float32 ``(sum p, dim)`` stacked vectors of
    documents' ``(p, dim)`` vector arrays, in the given (vid) order."""
    if not len(vecs):
        return np.zeros(0, dtype=np.int64), np.zeros((0, dim), dtype=np.float32)
    labels = np.concatenate([labels_for(int(v), len(x), bits) for v, x in zip(vids, vecs)])
    return labels, np.concatenate([np.asarray(x, dtype=np.float32).reshape(-1, dim) for x in vecs])


def encode_documents(
    encoder: Any, docs: Sequence[Document], passages: PassageParams | None, *, show_progress: bool = False
) -> list[np.ndarray]:
    """float32 ``(p, d)`` vectors per document: ``p = 1`` (``Document.content``, truncated
    by the encoder) without ``passages``, else one row per passage."""
    if not docs:
        return []
    if passages is None:
        x = np.asarray(encoder.encode_documents([d.content for d in docs], show_progress=show_progress), dtype=np.float32)
        return [x[i : i + 1] for i in range(len(docs))]
    chunks = [passages.split(d) for d in docs]
    flat = [p for c in chunks for p in c]
    x = np.asarray(encoder.encode_documents(flat, show_progress=show_progress), dtype=np.float32)
    out, start = [], 0
    for c in chunks:
        out.append(x[start : start + len(c)])
        start += len(c)
    return out

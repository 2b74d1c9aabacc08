"""Scoring primitives shared by the attention rerankers.

- :data:`CALIBRATION_QUERY`: the content-free query of ICR's calibration (ICR paper,
  Section 3.2; ALGORITHMS.md section 1), reused by BlockRank's ``scoring="calibrated"``.
- :func:`masked_document_scores`: per-document sum of calibrated token scores under the
  ``mean - 2 std`` token mask (ALGORITHMS.md sections 1-2).
- :func:`spans_from_lengths`: ``[start, end)`` token ranges of consecutive documents.
- :func:`distinct_texts`: candidates grouped by identical text, so that each distinct text
  is scored once and its duplicates share its score (issue #11.3).

Torch is imported only by the functions that take tensors.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from attnrank.types import Document

CALIBRATION_QUERY = "N/A"
"""Content-free query whose attention is subtracted from the real query's."""


def masked_document_scores(token_scores: Any, spans: Sequence[tuple[int, int]], n_std: float | None = 2.0) -> list[float]:
    """Per-document sum of token scores, dropping tokens at or below ``mean - n_std * std``.

    The standard deviation uses Bessel's correction and is taken per document, as ICR's
    reference code (ALGORITHMS.md section 1). A constant document keeps all its tokens
    (the reference would drop them all).

    Args:
        token_scores: float tensor ``(T,)`` of calibrated token scores (unitless
            differences of attention probability mass).
        spans: ``[start, end)`` token ranges into ``token_scores``, one per document.
        n_std: Mask threshold in standard deviations; ``None`` = no mask.

    Returns:
        One float per span (0.0 for an empty span): unitless, higher = more attended.
    """
    scores = []
    for start, end in spans:
        c = token_scores[start:end]
        if c.numel() == 0:
            scores.append(0.0)
            continue
        if n_std is not None and c.numel() > 1:
            std = c.std()
            if float(std) > 0:
                c = c[c > (c.mean() - n_std * std)]
        scores.append(float(c.sum()))
    return scores


def spans_from_lengths(lengths: Sequence[int], start: int = 0) -> list[tuple[int, int]]:
    """``[start, end)`` ranges of consecutive pieces of the given lengths.

    Example:
        >>> spans_from_lengths([3, 0, 2], start=10)
        [(10, 13), (13, 13), (13, 15)]
    """
    out, pos = [], start
    for n in lengths:
        out.append((pos, pos + n))
        pos += n
    return out


def distinct_texts(candidates: Sequence[Document]) -> tuple[list[Document], list[int]]:
    """Candidates with identical content collapsed onto their first occurrence.

    Args:
        candidates: Documents in first-stage order.

    Returns:
        ``(unique, owner)``: one candidate per distinct ``content`` (title and text), at
        the place of the text's first occurrence (first-stage order); of several candidates
        with the same text, the one with the smallest doc id stands for them, so that the
        choice does not depend on their order. ``owner`` gives, for every candidate, the
        index in ``unique`` of the candidate whose score it takes.

    Example:
        >>> docs = [Document("b", "x"), Document("c", "y"), Document("a", "x")]
        >>> [d.doc_id for d in distinct_texts(docs)[0]], distinct_texts(docs)[1]
        (['a', 'c'], [0, 1, 0])
    """
    first: dict[str, int] = {}
    unique: list[Document] = []
    owner: list[int] = []
    for doc in candidates:
        key = doc.content
        if key not in first:
            first[key] = len(unique)
            unique.append(doc)
        elif doc.doc_id < unique[first[key]].doc_id:
            unique[first[key]] = doc
        owner.append(first[key])
    return unique, owner


def per_head_document_mass(attn: Any, L0: int, lengths: Sequence[int], layers: Sequence[int],
                           minus: Any = None) -> Any:
    """Attention mass per candidate, layer and head from query-row mean attention.

    Args:
        attn: ``{layer: (1, heads, K)}`` mean attention of the query rows (capture mode
            ``"mean"``), keys laid out as block 0 (``L0``), the candidates' tokens, the rest.
        L0: Block 0 length.
        lengths: Tokens per candidate.
        layers: Layers read, in order.
        minus: The same for the ``N/A`` query (calibration: ``attn - minus``), or ``None``.

    Returns:
        float64 tensor ``(N, len(layers), heads)``: summed attention probability of each
        candidate's tokens (unitless; calibrated mass can be negative).
    """
    import torch

    D = sum(lengths)
    owner = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(list(lengths)))
    out = []
    for l in layers:
        x = attn[l][0, :, L0 : L0 + D]
        if minus is not None:
            x = x - minus[l][0, :, L0 : L0 + D]
        out.append(torch.zeros(len(lengths), x.shape[0], dtype=torch.float64).index_add(0, owner, x.T.double()))
    return torch.stack(out, dim=1)

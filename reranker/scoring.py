"""Scoring primitives shared by the attention rerankers.

- :data:`CALIBRATION_QUERY`: the content-free query of ICR's calibration (ICR paper,
  Section 3.2; docs/design/algorithms.md section 1), reused by BlockRank's ``scoring="calibrated"``.
- :func:`masked_document_scores`: per-document sum of calibrated token scores under the
  ``mean - 2 std`` token mask (docs/design/algorithms.md sections 1-2).
- :func:`spans_from_lengths`: ``[start, end)`` token ranges of consecutive documents.
- :func:`distinct_texts`: candidates grouped by identical text, so that each distinct text
  is scored once and its duplicates share its score (docs/results/zero-shot.md, "Position sensitivity").
- :func:`per_head_document_mass`, :func:`linear_head_scores`, :func:`linear_head_token_scores`:
  the learned head scorer of cached BlockRank, the one implementation serving, the
  query-adapter training and the study use (standardisation: :mod:`heedrank.fusion`).
- :class:`EvidenceSpan`, :func:`content_offsets`, :func:`top_spans`: evidence spans from
  token scores, in character offsets.

Torch is imported only by the functions that take tensors.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any

from heedrank.errors import ValidationError
from heedrank.fusion import standardize, standardized_weights
from heedrank.types import Document, EvidenceSpan  # EvidenceSpan: re-exported (a core record)

logger = logging.getLogger(__name__)

CALIBRATION_QUERY = "N/A"
"""Content-free query whose attention is subtracted from the real query's."""


def masked_document_scores(token_scores: Any, spans: Sequence[tuple[int, int]], n_std: float | None = 2.0) -> list[float]:
    """Per-document sum of token scores, dropping tokens at or below ``mean - n_std * std``.

    The standard deviation uses Bessel's correction and is taken per document, as ICR's
    reference code (docs/design/algorithms.md section 1). A constant document keeps all its tokens
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


def linear_head_scores(features: Any, weights: Any) -> Any:
    """The learned head scorer: each ``(layer, head)`` feature z-scored over the query's
    candidates (:func:`heedrank.fusion.standardize`), times its weight, summed.

    Args:
        features: ``(N, L, H)`` per-candidate calibrated attention mass
            (:func:`per_head_document_mass`), or ``(N, F)`` already flattened; torch or numpy.
        weights: ``(L * H,)`` or ``(L, H)`` weights (a weights card's), same library.

    Returns:
        ``(N,)`` scores (unitless, a weighted sum of z-scores), float64 for float64 input.
    """
    x = features.reshape(features.shape[0], -1)
    return standardize(x) @ weights.reshape(-1)


def linear_head_token_scores(qo: Any, co: Any, L0: int, D: int, layers: Sequence[int], features: Any,
                             weights: Any) -> Any:
    """Each candidate token's share of :func:`linear_head_scores`: ``t_j = sum_{l,h} w_lh
    (a_q - a_N/A)[l,h,j] / sd_lh``, ``sd`` the features' standard deviation over the
    candidates (constant features weigh 0; :func:`heedrank.fusion.standardized_weights`), so
    that a document's score is the sum of its tokens' ``t_j`` minus a per-query constant.

    Args:
        qo, co: ``{layer: (1, heads, K)}`` mean attention of the query and ``N/A`` rows.
        L0: Block 0 length (the candidates' tokens are keys ``L0..L0 + D``).
        D: Candidate tokens.
        layers: Layers of ``features``, in order.
        features: ``(N, L, H)`` (:func:`per_head_document_mass`), float64.
        weights: ``(L * H,)`` or ``(L, H)``, float64.

    Returns:
        float64 tensor ``(D,)``.
    """
    import torch

    x = features.reshape(features.shape[0], -1)
    scale = standardized_weights(x, weights.reshape(-1)).reshape(len(layers), -1)
    out = torch.zeros(D, dtype=torch.float64)
    for i, l in enumerate(layers):
        c = (qo[l][0, :, L0: L0 + D] - co[l][0, :, L0: L0 + D]).double()  # (H, D)
        out += scale[i] @ c
    return out


def content_offsets(tokenizer: Any, doc: Document, max_tokens: int, *, strip: bool = False
                    ) -> tuple[list[int], list[tuple[str, int, int]]]:
    """Token ids of a document's content as a prompt places it (``" " + content``, with
    ``strip`` the content stripped first; truncated to ``max_tokens``), and per token its
    ``(field, start, end)`` character range in ``doc.title`` or ``doc.text`` (``("", 0, 0)``
    for whitespace and the separator). Ranges come from the fast tokenizer's offset mapping,
    leading whitespace trimmed.

    Raises:
        ValidationError: the tokenizer gives no offsets (not a "fast" tokenizer).
    """
    from heedrank.reranker.prompt import token_encoder, truncate

    content = doc.content
    lead = len(content) - len(content.lstrip()) if strip else 0
    body = content.strip() if strip else content
    text = " " + body
    try:
        enc_ids, offsets = token_encoder(tokenizer).offsets(text)
    except NotImplementedError as exc:
        raise ValidationError(f"evidence needs a fast tokenizer with offsets: {exc}") from None
    ids, _ = truncate(enc_ids, max_tokens)
    # offsets into `content`: character i of `text` (i >= 1) is content[i - 1 + lead]
    title_end = len(doc.title) if doc.title else -1  # content = title + " " + text when there is a title
    text_start = len(doc.title) + 1 if doc.title else 0
    spans: list[tuple[str, int, int]] = []
    for a, b in offsets[: len(ids)]:
        while a < b and text[a].isspace():
            a += 1
        if a >= b:
            spans.append(("", 0, 0))
            continue
        ca, cb = a - 1 + lead, b - 1 + lead
        if doc.title and cb <= title_end:
            spans.append(("title", ca, cb))
        elif ca >= text_start:
            spans.append(("text", ca - text_start, cb - text_start))
        else:  # straddles the separator (does not happen with whitespace pre-tokenisers)
            spans.append(("", 0, 0))
    return ids, spans


@functools.cache
def _stopwords() -> frozenset[str]:
    """bm25s's English stopwords, as a set (read once)."""
    from bm25s.stopwords import STOPWORDS_EN

    return frozenset(STOPWORDS_EN)


def is_filler(text: str) -> bool:
    """Whether a span says nothing to a reader: every word of it, lower-cased without
    punctuation, is an English stopword (bm25s's list) or shorter than two characters.
    Attention often lands on such tokens ("the", ","); they are left out of evidence."""
    stop = _stopwords()
    for word in text.split():
        core = "".join(c for c in word.lower() if c.isalnum())
        if len(core) >= 2 and core not in stop:
            return False
    return True


def top_spans(doc: Document, offsets: Sequence[tuple[str, int, int]], scores: Sequence[float],
              max_spans: int) -> list[EvidenceSpan]:
    """Words from token offsets (a word's score is the sum of its tokens'), the best
    ``3 * max_spans`` positive words, adjacent ones merged, the best ``max_spans`` spans
    that are not filler (:func:`is_filler`: stopwords and punctuation alone), best first."""
    words: list[list[Any]] = []  # [field, start, end, score]
    for (fld, a, b), sc in zip(offsets, scores):
        if not fld:
            continue
        if words and words[-1][0] == fld and words[-1][1] <= a <= words[-1][2]:
            words[-1][2] = max(words[-1][2], b)  # contiguous piece of the word (or the same characters)
            words[-1][3] += sc
        else:
            words.append([fld, a, b, sc])
    keep = sorted((i for i, w in enumerate(words) if w[3] > 0), key=lambda i: -words[i][3])[: 3 * max_spans]
    spans: list[list[Any]] = []
    for i in sorted(keep):
        fld, a, b, sc = words[i]
        if spans and spans[-1][4] == i - 1 and spans[-1][0] == fld:
            spans[-1][2], spans[-1][3], spans[-1][4] = b, spans[-1][3] + sc, i
        else:
            spans.append([fld, a, b, sc, i])
    spans.sort(key=lambda s: (-s[3], s[0] != "text", s[1]))
    out: list[EvidenceSpan] = []
    for fld, a, b, sc, _ in spans:
        if len(out) == max_spans:
            break
        text = (doc.title if fld == "title" else doc.text)[a:b]
        if not is_filler(text):
            out.append(EvidenceSpan(fld, a, b, text, float(sc)))
    return out

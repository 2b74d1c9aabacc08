"""Evidence of cached BlockRank: each candidate token's share of its document's score,
mapped back to character spans of the document (as ICR's
:meth:`~heedrank.reranker.icr.ICRReranker.evidence_from`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from heedrank.reranker.blockforward import BlockPrompt
from heedrank.reranker.doccache import BlockLayout
from heedrank.reranker.scoring import EvidenceSpan, content_offsets, spans_from_lengths, top_spans
from heedrank.types import Document

logger = logging.getLogger(__name__)


def document_evidence(tokenizer: Any, layout: BlockLayout, prompt: BlockPrompt, tokens: Sequence[float],
                      candidates: Sequence[Document], owner: Sequence[int], max_doc_tokens: int,
                      max_spans: int) -> dict[str, list[EvidenceSpan]]:
    """The best spans of every candidate.

    Args:
        tokenizer: The LM's tokenizer (with offsets).
        layout: The cached prompt's fixed part (a block opens with ``layout.open_ids``).
        prompt: The scored prompt (distinct candidate texts).
        tokens: Per token of the prompt's candidate blocks, its share of the document score.
        candidates: The candidates as given; ``owner[i]``: the prompt block candidate ``i``
            took its score from.
        max_doc_tokens: The block content budget.
        max_spans: Most spans per document.

    Returns:
        ``{doc_id: [EvidenceSpan, ...]}``, best first; offsets are characters into ``doc.text``
        (or ``doc.title``). A candidate whose tokens cannot be aligned with its block gets none.
    """
    evidence: dict[str, list[EvidenceSpan]] = {d.doc_id: [] for d in candidates}
    bounds = spans_from_lengths(prompt.doc_lengths)
    n_open = len(layout.open_ids)
    for doc, o in zip(candidates, owner):
        start, _ = bounds[o]
        ids, offsets = content_offsets(tokenizer, doc, max_doc_tokens, strip=True)
        first = start + n_open
        if prompt.doc_ids[o][n_open: n_open + len(ids)] != ids:
            logger.debug("no evidence for %s: its tokens could not be aligned with the block", doc.doc_id)
            continue
        evidence[doc.doc_id] = top_spans(doc, offsets, tokens[first: first + len(ids)], max_spans)
    return evidence

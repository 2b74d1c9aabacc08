"""Evidence of cached BlockRank: each candidate token's share of its document's score,
mapped back to character spans of the document (as ICR's
:meth:`~heedrank.reranker.icr.ICRReranker.evidence_from`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from heedrank.reranker.blockforward import BlockPrompt
from heedrank.reranker.doccache import BlockLayout
from heedrank.reranker.scoring import EvidenceSpan, content_offsets, spans_from_lengths, top_spans
from heedrank.errors import ValidationError
from heedrank.protocols import RerankResult
from heedrank.types import Document, Query

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


def rerank_with_evidence(reranker: Any, query: Query, candidates: Sequence[Document], *, max_spans: int = 3,
                         block_store: Any = None) -> RerankResult:
    """``reranker``'s :meth:`~heedrank.reranker.cached.CachedBlockRankReranker.rerank` plus
    evidence from the same pass: the same scores and order, with
    ``RerankResult.evidence = {doc_id: [EvidenceSpan, ...]}`` (spans in character offsets).

    A token's evidence score is its share of the document's score: with ``learned``
    scoring ``t_j = sum_{l,h} w_lh c_lh,j / sd_lh`` (``c``: calibrated attention of the
    query rows to token ``j`` at layer ``l``, head ``h``; ``sd``: the feature's standard
    deviation over the candidates, as in the z-score), so that a document's score is the
    sum of its tokens' up to a per-query constant; with ``calibrated`` the calibrated
    attention summed over layers and heads; with ``signal`` the signal tokens' attention.
    Tokens group into words, the best positive words merge into spans
    (:func:`document_evidence`); offsets are characters
    into ``doc.text`` (or ``doc.title``): ``text[start:end] == span.text``.

    Raises:
        ValidationError: empty query, ``max_spans < 1``, a tokenizer without offsets.
    """
    if max_spans < 1:
        raise ValidationError(f"max_spans must be >= 1, got {max_spans}")
    run = reranker.run(query, candidates, block_store=block_store)
    evidence: dict[str, list[Any]] = {d.doc_id: [] for d in candidates}
    if run.scored is not None and run.scored.passes:
        prompt: BlockPrompt = run.scored.passes[0].prompt
        state = run.scored.passes[0].state  # learned: computed now; calibrated: the tensor; signal: read again
        if state is None:
            import torch

            fetched = reranker.fetch_blocks(prompt, block_store)
            with reranker.slots.slot() as buffer, torch.inference_mode():
                state = reranker.token_mass(prompt, reranker.assemble(prompt, fetched, buffer).kv)[0]
        tokens = (state() if callable(state) else state).double().tolist()
        evidence = document_evidence(reranker.base_lm.tokenizer, reranker.layout, prompt, tokens, candidates, run.owner,
                                     reranker.config.max_doc_tokens, max_spans)
    return replace(run.result, evidence=evidence)

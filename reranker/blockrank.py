"""BlockRank: block-sparse in-context ranking, exact and linear in the number of candidates.

Source: Gupta et al. 2025, "Scalable In-context Ranking with Generative Models"
(arXiv 2510.05396), Sections 3-4 (repo nilesh2797/BlockRank).

Blocks: block 0 = instruction with the query (cached BlockRank,
:mod:`heedrank.reranker.cached`, keeps the query out of it so blocks can be stored); blocks 1..N = one per candidate,
``ID: i | CONTENT: <d_i> | END ID: i``; block N+1 = the query block ending in the answer
prefix ``Final Answer: [`` whose last ``n_signal`` tokens (``:`` and `` [``) are the
*signal tokens*. The labels ``i`` count from 0 in the order of the candidates' doc ids
(option ``doc_labels="sorted"``, **our choice**: the prompt, and so the scores, do not
depend on the order the candidates come in) or in first-stage order (``"position"``).

Attention: block 0 is causal over itself; each candidate block sees all of block 0 and
itself causally, nothing of other candidates; the query block sees everything before it.
Positions: block 0 at ``0..L0-1``; every candidate block restarts at ``L0``; the query block
starts at ``query_offset`` (default ``L0 + block length``, **our choice**, inside the
trained context; the paper uses 8192/16384).

The forward (:mod:`heedrank.reranker.blockforward`): exact and linear in ``N``
(:func:`~heedrank.reranker.blockforward.block_forward`: block 0 once, the candidate blocks
against it, the query block against both), with a fast path without gradients
(:attr:`BlockRankReranker.fast_path`) equal to it to float32 rounding.

Score (``scoring="signal"``): at layer ``l*`` (default ``round(0.6 L)``),
``z_ij = q_i . k_j / sqrt(d)`` from each signal token ``i`` to candidate tokens ``j``
only; ``alpha_ij = softmax_j(z_ij)``; ``S(d) = mean_heads mean_signal sum_{j in d} alpha_ij``.
Scores are probabilities: in [0, 1], summing to 1 over the distinct candidate texts of one
query (candidates with identical text are scored once and share the score).
``scoring="calibrated"`` reads ICR's calibrated query-span attention (layers ``0..l*``,
``N/A`` query, per-document ``mean - 2 std`` mask) through the same block structure; its
scores are unitless differences of attention mass.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from functools import cached_property
from typing import Any

from heedrank.blocks import KVHeader
from heedrank.config import RerankerConfig
from heedrank.errors import ValidationError
from heedrank.reranker.base import AttentionReranker, DocumentScores, ScoredPass
from heedrank.reranker.blockforward import (
    BlockPrompt,
    block_forward,
    calibrated_forward,
    check_query_block,
    context_kv,
    signal_scores,
    signal_token_mass,
)
from heedrank.reranker.options import BlockRankOptions
from heedrank.reranker.prompt import bos_ids, chat_wrap, encode_trusted, encode_untrusted, truncate
from heedrank.reranker.scoring import CALIBRATION_QUERY, masked_document_scores, spans_from_lengths
from heedrank.types import Document

logger = logging.getLogger(__name__)

INSTRUCTION = (
    "You will be given a query and a list of documents. Each document will be formatted as "
    "ID: <id> | CONTENT: <content> | END ID: <id>. You need to read carefully and understand all of "
    "them and your goal is to find all document(s) from the list that can help answer the query."
)
FINAL = (
    "\n====== Now let's start! ======\n"
    "Which document is most relevant to answer the query? Print out the ID of the document.\nQuery:"
)
ANSWER_PREFIX = "Final Answer: ["
_NOT_CACHED = ("document blocks are stored only by cached BlockRank: use method 'blockrank-cached'")



class BlockRankReranker(AttentionReranker):
    """BlockRank reranker (registry name ``"blockrank"``).

    Options: :class:`heedrank.reranker.options.BlockRankOptions` (``RerankerConfig.options``
    keys, parsed at construction; unknown keys are a :class:`ValidationError`): ``layer``,
    ``scoring``, ``query_offset``, ``n_signal``, ``chat_template``, ``doc_batch_size``,
    ``mask_std``, ``heads`` (with ``scoring="signal"``: average the signal attention of
    these heads, each read at its own layer, and stop after the deepest), ``reattn``
    (ReAttn re-weighting of the signal tokens' per-token mass), ``doc_labels``,
    ``max_query_tokens``.

    :meth:`rerank` (the base skeleton) returns, with ``scoring="signal"``, attention
    probabilities summing to 1 over the distinct candidate texts, and
    ``details["timings"]`` (seconds) and ``details["layer"]``. No limit on the number of
    candidates comes from the model: positions never exceed
    ``L0 + block length + query block``.
    """

    name = "blockrank"
    template_version = "v1"
    cached: bool = False
    """Whether candidate blocks come from a document KV store (:class:`~heedrank.reranker.cached.CachedBlockRankReranker`)."""
    options_class = BlockRankOptions
    options: BlockRankOptions
    fast_path: bool = True
    """``False``: score through the previous exact path (a fresh context per query,
    concatenating caches, SDPA under the full mask, separate query and calibration passes),
    the oracle the fast path is tested against; same scores to float32 rounding."""

    def __init__(self, config: RerankerConfig, lm: Any = None) -> None:
        """
        Raises:
            ValidationError: unknown or invalid options (the message names the valid
                ones); ``heads='learned'`` (ICR only).
        """
        super().__init__(config, lm)
        self.reattn = self.options.reattn
        self._context_buffer: Any = None

    def context_buffer(self):
        """Storage for the query's context reused across queries
        (:class:`heedrank.reranker.doccache.ContextBuffer`), or ``None`` when
        :attr:`fast_path` is off. Used under the LM's lock only."""
        if not self.fast_path:
            return None
        if self._context_buffer is None:
            from heedrank.reranker.doccache import ContextBuffer

            self._context_buffer = ContextBuffer()
        return self._context_buffer

    def block_store_header(self) -> KVHeader | None:
        """``None``: the paper's prompt puts the query in every block, so no block can be
        stored (cached BlockRank, method ``blockrank-cached``, reads a document KV store)."""
        return None

    def encode_block_arrays(self, texts: Sequence[str]) -> list[tuple[str, Any, Any]]:
        """Raises ValidationError: blocks of the paper's prompt depend on the query."""
        raise ValidationError(_NOT_CACHED)

    def block_keys(self, texts: Sequence[str]) -> list[str]:
        """Raises ValidationError: blocks of the paper's prompt depend on the query."""
        raise ValidationError(_NOT_CACHED)

    @property
    def kv_depth(self) -> int:
        """Deepest layer whose keys/values a pass needs: ``l*``, or the deepest selected
        head's layer when that is deeper."""
        return max([self.layer] + [l for l, _ in self.heads or []])

    def context(self, prompt: BlockPrompt) -> tuple[list[tuple[Any, Any]], dict[str, float]]:
        """Keys/values of block 0 and the candidates (:func:`~heedrank.reranker.blockforward.context_kv`'s layout) and timings
        in seconds. On the fast path they are views into :meth:`context_buffer` with room
        for the query and calibration blocks after them: valid until the next call (call
        both under the LM's lock)."""
        import torch

        reserve = len(prompt.query_ids) + len(prompt.calib_ids) if self.fast_path else 0
        with torch.inference_mode():
            return context_kv(self.lm, prompt, self.kv_depth, doc_batch_size=self.options.doc_batch_size,
                              reserve=reserve, buffer=self.context_buffer())

    @cached_property
    def heads(self) -> list[tuple[int, int]] | None:
        """Selected ``(layer, head)`` pairs (option ``heads``, resolved once the model is
        known), or ``None`` for all heads of ``l*``."""
        from heedrank.reranker.heads import resolve_heads

        heads, _ = resolve_heads(self.options.heads, self.lm.identity)
        self.check_model_indices(heads=heads or [])
        return heads

    @property
    def layer(self) -> int:
        """Scoring layer ``l*``: option ``layer``, default ``round(0.6 * L)``.

        Raises:
            ValidationError: the layer is not below the model's depth.
        """
        layer = self.options.layer
        layer = round(0.6 * self.lm.num_layers) if layer is None else layer
        self.check_model_indices(layers=[layer])
        return layer

    def token_mass(self, prompt: BlockPrompt, kv: Any = None) -> tuple[Any, dict[str, float]]:
        """Signal-token attention mass per candidate token, ``(D,)`` float32 summing to 1, and
        timings in seconds (``kv``: the context's keys/values when already at hand)."""
        import torch

        L0 = len(prompt.instruction_ids)
        D = sum(prompt.doc_lengths)
        heads = self.heads
        read = sorted({l for l, _ in heads}) if heads else [self.layer]
        with torch.inference_mode():
            out, t = block_forward(self.lm, prompt, max(read), read_layers=read,
                                   doc_batch_size=self.options.doc_batch_size, kv=kv, fast=self.fast_path)
        if not heads:
            return signal_token_mass(out[self.layer], L0, D), t
        by_layer: dict[int, list[int]] = {}
        for l, h in heads:
            by_layer.setdefault(l, []).append(h)
        total = sum(signal_token_mass(out[l], L0, D, hs) * len(hs) for l, hs in by_layer.items())
        return total / len(heads), t

    # -- prompt --------------------------------------------------------------------------
    def _pieces(self) -> tuple[list[int], list[int], Any]:
        """Block 0 without the query's tokens split as ``(before, after)`` and the chat wrap."""
        tok = self.lm.tokenizer
        wrap = chat_wrap(tok, self.options.chat_template)
        before = bos_ids(tok, wrap) + encode_trusted(tok, wrap.prefix + INSTRUCTION + "\nQuery:")
        return before, encode_trusted(tok, "\n\nDocuments:"), wrap

    def _qblock(self, text_ids: list[int], wrap: Any) -> list[int]:
        tok = self.lm.tokenizer
        return (
            encode_trusted(tok, FINAL) + text_ids
            + encode_trusted(tok, "\nThe following document(s) can help answer the query:" + wrap.suffix + ANSWER_PREFIX)
        )

    def labels(self, candidates: Sequence[Document]) -> list[int]:
        """The ``ID: i`` number of each candidate (option ``doc_labels``): its rank in doc id
        order (``"sorted"``), or its index (``"position"``)."""
        if self.options.doc_labels == "position":
            return list(range(len(candidates)))
        order = sorted(range(len(candidates)), key=lambda i: (candidates[i].doc_id, i))
        labels = [0] * len(candidates)
        for rank, i in enumerate(order):
            labels[i] = rank
        return labels

    def _blocks(self, candidates: Sequence[Document]) -> tuple[list[list[int]], list[bool], list[int]]:
        tok = self.lm.tokenizer
        labels = self.labels(candidates)
        docs, truncated = [], []
        for doc, i in zip(candidates, labels):
            content, cut = truncate(encode_untrusted(tok, " " + doc.content.strip()), self.config.max_doc_tokens)
            docs.append(encode_trusted(tok, f"\nID: {i} | CONTENT:") + content + encode_trusted(tok, f" | END ID: {i}"))
            truncated.append(cut)
        return docs, truncated, labels

    def build_prompt(self, query: str, candidates: Sequence[Document]) -> BlockPrompt:
        """Tokenise the block prompt (candidates in first-stage order; labels per option
        ``doc_labels``).

        Raises:
            ContextOverflowError: the query block would sit past the model's positions
                (``max_candidates=0``: lowering the candidate count does not help).
        """
        tok = self.lm.tokenizer
        q = " " + query.strip()
        before, after, wrap = self._pieces()
        block0 = before + encode_untrusted(tok, q) + after
        docs, truncated, labels = self._blocks(candidates)
        L0 = len(block0)
        block_len = max((len(d) for d in docs), default=0)
        offset = self.options.query_offset
        offset = L0 + block_len if offset is None else offset
        prompt = BlockPrompt(block0, docs, self._qblock(encode_untrusted(tok, q), wrap),
                             self._qblock(encode_untrusted(tok, " " + CALIBRATION_QUERY), wrap),
                             self.options.n_signal, truncated, offset, query.strip(), labels)
        check_query_block(prompt, self.lm.max_positions, overlap=L0 + block_len > offset,
                          where=f", block 0 {L0}, block {block_len}", remedy=", the query length or query_offset")
        return prompt

    def query_budget(self, candidates: Sequence[Document]) -> int:
        """:meth:`AttentionReranker.query_budget`, lowered so that the query block stays
        inside the model's positions: the query sits in block 0 and in the query block,
        so ``2 q + fixed + block length <= context`` (with ``query_offset``,
        ``offset + query block <= context``)."""
        budget = super().query_budget(candidates)
        before, after, wrap = self._pieces()
        b0, qb = len(before) + len(after), len(self._qblock([], wrap))
        if candidates:
            block_len = max(len(d) for d in self._blocks(candidates)[0])
        else:
            block_len = self.config.max_doc_tokens + len(self._blocks([Document("x", "")])[0][0])
        ctx = int(self.lm.max_positions)
        room = (ctx - b0 - qb - block_len) // 2
        if self.options.query_offset is not None:
            room = min(room, ctx - self.options.query_offset - qb,
                       self.options.query_offset - b0 - block_len)
        return max(1, min(budget, room))

    # -- scoring -----------------------------------------------------------------------------
    def scores(self, prompt: BlockPrompt) -> tuple[list[float], dict[str, float]]:
        """Candidate scores (first-stage order) and timings in seconds. The context (block 0
        and the candidate blocks) is computed once and shared by every query-block pass."""
        kv, t_ctx = self.context(prompt)
        scores, t = self.scores_from(prompt, kv)
        return scores, {**t_ctx, **t}

    def scores_from(self, prompt: BlockPrompt, kv: Any) -> tuple[list[float], dict[str, float]]:
        """Scores of ``scoring='signal'`` or ``'calibrated'`` from the context's keys/values,
        and timings in seconds."""
        import torch

        bounds = spans_from_lengths(prompt.doc_lengths)
        if self.options.scoring == "signal":
            mass, t = self.token_mass(prompt, kv)
            if self.reattn is not None:
                return self.reattn_scores(prompt, mass, bounds), t
            return [float(mass[s:e].sum()) for s, e in bounds], t
        L0 = len(prompt.instruction_ids)
        with torch.inference_mode():
            layers = list(range(self.layer + 1))
            D = sum(prompt.doc_lengths)
            # the query and N/A blocks in one merged pass (fast path) or two passes
            qo, co, t = calibrated_forward(self.lm, prompt, self.layer, read_layers=layers,
                                           doc_batch_size=self.options.doc_batch_size, kv=kv, fast=self.fast_path)
            c = sum((qo[l][0, :, L0 : L0 + D] - co[l][0, :, L0 : L0 + D]).sum(0) for l in layers)
            return masked_document_scores(c, bounds, self.options.mask_std), t

    def reattn_scores(self, prompt: BlockPrompt, mass: Any, bounds: list[tuple[int, int]]) -> list[float]:
        """ReAttn re-weighting (option ``reattn``) of the signal tokens' per-token mass."""
        from heedrank.reranker.reattn import reattn_scores, token_forms

        tok = self.lm.tokenizer
        forms = [token_forms(tok, d) for d in prompt.doc_ids]
        qforms = set(token_forms(tok, encode_untrusted(tok, " " + prompt.query_text)))
        return reattn_scores([mass[s:e].tolist() for s, e in bounds], forms, qforms, self.reattn)

    def score_prompt(self, prompt: BlockPrompt, query: str, *, block_store: Any = None) -> DocumentScores:
        """Hook of the rerank skeleton: :meth:`scores` of the prompt (under the LM's lock);
        this method reads no stored blocks (``block_store`` is ignored)."""
        scores, timings = self.scores(prompt)
        return DocumentScores(
            scores=scores, truncated=list(prompt.truncated), prompt_tokens=prompt.total_tokens,
            details={"timings": timings, "layer": self.layer},
            passes=(ScoredPass(prompt, None, tuple(range(len(prompt.doc_ids)))),),
        )

    def layer_scores(self, query: str, candidates: Sequence[Document], layers: Sequence[int]) -> dict[int, list[float]]:
        """Signal scores of ``candidates`` read at each of ``layers`` from ONE forward pass
        (up to the deepest of them); used to choose ``l*``.

        Returns:
            ``{layer: scores in candidate order}`` (probabilities summing to 1 per layer).

        Raises:
            ValidationError: a layer outside the model's depth, or no layer.
        """
        import torch

        from heedrank.errors import ValidationError

        if not layers:
            raise ValidationError("layer_scores needs at least one layer")
        self.check_model_indices(layers=layers)
        query, _ = self.fit_query(query, candidates)  # cut to the query budget, as rerank() does
        prompt = self.build_prompt(query, candidates)
        L0 = len(prompt.instruction_ids)
        with self.lm.lock, torch.inference_mode():
            out, _ = block_forward(self.lm, prompt, max(layers), read_layers=layers,
                                   doc_batch_size=self.options.doc_batch_size, fast=self.fast_path)
        return {l: signal_scores(out[l], L0, prompt.doc_lengths).tolist() for l in layers}

    def limits(self) -> dict[str, Any]:
        """:meth:`AttentionReranker.limits` with ``max_candidates`` ``null``: the block
        structure keeps every position below ``L0 + block length + query block`` whatever
        the number of candidates (memory and time grow linearly)."""
        out = super().limits()
        out["max_candidates"] = None
        return out

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["layer"] = self.layer
        d["scoring"] = self.options.scoring
        d["heads"] = "all" if not self.heads else [list(h) for h in self.heads]
        d["reattn"] = None if self.reattn is None else vars(self.reattn)
        return d

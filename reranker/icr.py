"""ICR: zero-shot in-context reranking from attention, with content-free calibration.

Source: Chen, Gutiérrez, Su, "Attention in Large Language Models Yields Efficient
Zero-Shot Re-Rankers", ICLR 2025, Sections 3-4 (repo OSU-NLP-Group/In-Context-Reranking).

Prompt (inside the model's chat template, when it has one)::

    Here are some paragraphs:\\n\\n[1] <d_N>\\n\\n[2] <d_N-1> ... [N] <d_1>\\n\\n
    Please find information that is relevant to the following query in the paragraphs above.\\n\\nQuery: <q>

Candidates are placed in reverse first-stage order (the best candidate nearest the query).
The query span ``Q`` runs from the late instruction to the end of the prompt (chat suffix
included). One forward pass over the context (instruction + documents) fills the KV cache;
then two short passes run the query span with the real query and with the content-free
query ``N/A`` against that cache, reading attention for the query rows only
(:mod:`heedrank.reranker.attention`).

Scores: ``a_j(q) = sum_l sum_h mean_{i in Q} A[l,h][i,j]``, ``c_j = a_j(q) - a_j("N/A")``;
within each document, tokens with ``c_j <= mean(c) - 2 std(c)`` (std with Bessel's
correction, per document, as the reference code) are dropped, and the document score is the
sum of the kept ``c_j``. A score is a difference of attention probability mass summed over
layers and heads: unitless, higher = more relevant, comparable only within one query.

Candidates with identical text are scored once and share the score (the rerank skeleton,
:mod:`heedrank.reranker.base`). When the prompt would not fit the model's context, the
candidates are ranked in windows that fit, aligned on the first-stage top candidate
(:mod:`heedrank.reranker.windows`, **our choice**), and the result says so in its warnings.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from heedrank.config import RerankerConfig
from heedrank.errors import ContextOverflowError, ValidationError
from heedrank.protocols import RerankResult
from heedrank.reranker.base import AttentionReranker, DocumentScores, ScoredPass
from heedrank.reranker.options import ICROptions
from heedrank.reranker.prompt import bos_ids, chat_wrap, encode_trusted, encode_untrusted, truncate
from heedrank.reranker.scoring import CALIBRATION_QUERY, EvidenceSpan, content_offsets, masked_document_scores
from heedrank.reranker.scoring import top_spans as _top_spans
from heedrank.reranker.windows import align_to_anchors, plan_windows
from heedrank.types import Document, Query

logger = logging.getLogger(__name__)

LATE_INSTRUCTIONS = {
    "ie": "Please find information that is relevant to the following query in the paragraphs above.",
    "qa": "Please answer the following question based on the information in the paragraphs above.",
}


@dataclass(frozen=True)
class ICRPrompt:
    """Token ids of one ICR prompt.

    Attributes:
        context_ids: Instruction and documents (the part whose KV cache is shared by the
            real and the calibration query), ``T`` tokens.
        spans: Per candidate, in *candidate* order, the ``[start, end)`` token range of
            ``[i] <content>`` within ``context_ids``.
        query_ids: Query span with the real query.
        calib_ids: Query span with the content-free query ``N/A``.
        truncated: Per candidate, whether its content was cut to ``max_doc_tokens``.
    """

    context_ids: list[int]
    spans: list[tuple[int, int]]
    query_ids: list[int]
    calib_ids: list[int]
    truncated: list[bool]

    @property
    def total_tokens(self) -> int:
        return len(self.context_ids) + max(len(self.query_ids), len(self.calib_ids))


@dataclass
class TokenAttention:
    """Per-head attention of one query to the context tokens.

    Attributes:
        query: float32 tensor ``(L_read, H, T)``: ``mean_{i in Q} A[l,h][i,j]`` for the
            real query, for the layers read (``layers``), over the ``T`` context tokens.
        calib: Same for the ``N/A`` query, or ``None`` without calibration.
        layers: Layer index of each row of ``query``/``calib``.
        spans: Document token ranges (candidate order), as in :class:`ICRPrompt`.
    """

    query: Any
    calib: Any
    layers: list[int]
    spans: list[tuple[int, int]]
    seconds: dict[str, float] = field(default_factory=dict)

    def calibrated(self):
        """``c[l,h,j] = a(q) - a(N/A)`` (or raw ``a(q)`` without calibration): ``(L_read, H, T)``."""
        return self.query - self.calib if self.calib is not None else self.query


class ICRReranker(AttentionReranker):
    """ICR reranker (registry name ``"icr"``).

    Options: :class:`heedrank.reranker.options.ICROptions` (``RerankerConfig.options``
    keys, parsed at construction; unknown keys are a :class:`ValidationError`):
    ``calibration``, ``mask_std``, ``instruction``, ``reverse``, ``chat_template``,
    ``keep_attention`` (per-head calibrated token attention in ``details["attention"]``:
    ``calibrated`` float16 ``(L_read, H, T)``, ``layers``, ``spans``, ``context_ids``),
    ``heads`` (``qr``/``learned``/path/pairs: selected heads, forward pass stopped after
    the deepest; ``learned``: ``s(d) = sum_h w_h s_h(d)``), ``reattn``, ``windows``,
    ``window_tokens``, ``anchors``, ``max_query_tokens``.

    More candidates than one prompt holds are scored in windows aligned on anchor
    candidates (:mod:`heedrank.reranker.windows`); the result's ``warnings`` and
    ``details["windows"]`` say so.

    Example:
        >>> r = ICRReranker(RerankerConfig(method="icr"))
        >>> r.rerank(Query("q1", "vitamin d and bone health"), docs).ranking.doc_ids[:3]  # doctest: +SKIP
    """

    name = "icr"
    template_version = "v1"
    options_class = ICROptions
    options: ICROptions

    def __init__(self, config: RerankerConfig, lm: Any = None) -> None:
        """
        Raises:
            ValidationError: unknown or invalid options (the message names the valid ones).
        """
        super().__init__(config, lm)
        self.reattn = self.options.reattn
        self._heads: tuple[list[tuple[int, int]] | None, Any] | None = None

    @property
    def heads(self) -> list[tuple[int, int]] | None:
        """Selected ``(layer, head)`` pairs, or ``None`` for all heads (resolved on first use)."""
        return self._resolved_heads()[0]

    @property
    def head_weights(self):
        """Learned ``(L, H)`` weights (``heads="learned"``) or ``None``."""
        return self._resolved_heads()[1]

    def _resolved_heads(self):
        if self._heads is None:
            from heedrank.reranker.heads import resolve_heads

            heads, weights = resolve_heads(self.options.heads, self.lm.identity)
            self.check_model_indices(heads=heads or [])
            self._heads = (heads, weights)
        return self._heads

    def context_limit(self) -> int:
        """Positions one prompt (window) may use: option ``window_tokens`` capped at the
        model's context."""
        limit = int(self.lm.max_positions)
        return min(limit, self.options.window_tokens) if self.options.window_tokens else limit

    # -- prompt ----------------------------------------------------------------------
    def encode_documents(self, candidates: Sequence[Document]) -> tuple[list[list[int]], list[bool]]:
        """Content token ids of each candidate, cut to ``max_doc_tokens``, and whether each was cut."""
        tok = self.lm.tokenizer
        out = [truncate(encode_untrusted(tok, " " + doc.content), self.config.max_doc_tokens) for doc in candidates]
        return [ids for ids, _ in out], [cut for _, cut in out]

    def build_prompt(self, query: str, candidates: Sequence[Document], *, check_context: bool = True) -> ICRPrompt:
        """Tokenise the ICR prompt for ``query`` and ``candidates`` (first-stage order).

        ``check_context=False`` builds prompts past :meth:`context_limit` (windows are
        planned from it; benchmarks time the full-attention path there).

        Raises:
            ContextOverflowError: the prompt exceeds :meth:`context_limit`; the error names
                the largest candidate count that fits.
        """
        tok = self.lm.tokenizer
        wrap = chat_wrap(tok, self.options.chat_template)
        head = bos_ids(tok, wrap) + encode_trusted(tok, wrap.prefix + "Here are some paragraphs:")
        sep = encode_trusted(tok, "\n\n")
        order = list(range(len(candidates)))
        if self.options.reverse:
            order.reverse()
        contents, truncated = self.encode_documents(candidates)
        context = list(head)
        spans: list[tuple[int, int]] = [(0, 0)] * len(candidates)
        for pos, i in enumerate(order):
            context += sep
            start = len(context)
            context += encode_trusted(tok, f"[{pos + 1}]") + contents[i]
            spans[i] = (start, len(context))
        context += sep
        late = LATE_INSTRUCTIONS[self.options.instruction] + "\n\nQuery:"

        def span(q: str) -> list[int]:
            return encode_trusted(tok, late) + encode_untrusted(tok, " " + q.strip()) + encode_trusted(tok, wrap.suffix)

        prompt = ICRPrompt(context, spans, span(query), span(CALIBRATION_QUERY), truncated)
        limit = self.context_limit()
        if check_context and prompt.total_tokens > limit:
            fixed = len(head) + len(sep) + max(len(prompt.query_ids), len(prompt.calib_ids))
            n, used = 0, fixed
            for i in range(len(candidates)):  # top candidates first
                used += len(sep) + (spans[i][1] - spans[i][0])
                if used > limit:
                    break
                n += 1
            raise ContextOverflowError(
                f"the ICR prompt has {prompt.total_tokens} tokens but a prompt may hold {limit}; "
                f"at most {n} of these candidates fit (lower candidates or max_doc_tokens, use blockrank, "
                "or leave option windows on)",
                max_candidates=n,
            )
        return prompt

    # -- attention -------------------------------------------------------------------
    def token_attention(self, prompt: ICRPrompt) -> TokenAttention:
        """Run the context pass and the query-span passes; per-head attention to the context.

        Returns:
            :class:`TokenAttention` with float32 ``(L_read, H, T)`` tensors (``T`` context tokens).
        """
        import torch

        from heedrank.reranker.attention import AttentionCapture, run_with_capture

        lm = self.lm
        model = lm.model.base_model  # decoder only: the LM head is never needed
        layers = sorted({l for l, _ in self.heads}) if self.heads else list(range(lm.num_layers))
        stop = max(layers) if self.heads and max(layers) < lm.num_layers - 1 else None
        device = lm.device
        T = len(prompt.context_ids)
        timings: dict[str, float] = {}
        with torch.inference_mode():
            from heedrank.reranker.doccache import full_cache

            cache = full_cache(lm.model.config)  # sliding-window layers keep every key (Gemma 3)
            t0 = time.perf_counter()
            ctx = torch.tensor([prompt.context_ids], device=device)
            # A capture with no layers only carries stop_after (early exit above the deepest read layer).
            run_with_capture(model, AttentionCapture(layers=(), stop_after=stop), input_ids=ctx, cache=cache, use_cache=True)
            timings["context"] = time.perf_counter() - t0

            def read(ids: list[int]):
                cap = AttentionCapture(layers=set(layers), mode="mean", stop_after=stop)
                run_with_capture(model, cap, input_ids=torch.tensor([ids], device=device), cache=cache, use_cache=True)
                cache.crop(-len(ids))  # back to the context: both query spans reuse its KV cache
                return torch.stack([cap.out[l][0, :, :T] for l in layers]).float().cpu()

            t1 = time.perf_counter()
            q = read(prompt.query_ids)
            c = read(prompt.calib_ids) if self.options.calibration else None
            timings["query"] = time.perf_counter() - t1
        return TokenAttention(q, c, layers, prompt.spans, timings)

    def token_scores(self, att: TokenAttention):
        """Calibrated token scores ``(T,)`` summed over the selected (or all) layers and heads
        (weighted by the learned weights with ``heads="learned"``)."""
        c = att.calibrated()
        if not self.heads:
            return c.sum(dim=(0, 1))
        row = {l: i for i, l in enumerate(att.layers)}
        w = self.head_weights
        return sum(c[row[l], h] * (1.0 if w is None else w[l][h]) for l, h in self.heads)

    def per_head_scores(self, att: TokenAttention):
        """Per-(layer, head) masked document scores ``s_h(d)``: ``(L_read, H, N)`` float32
        for the layers in ``att.layers`` (docs/design/algorithms.md section 2)."""
        from heedrank.reranker.heads import per_head_document_scores

        return per_head_document_scores(att.calibrated(), att.spans, self.options.mask_std)

    def document_scores(self, att: TokenAttention, prompt: ICRPrompt, query: str) -> list[float]:
        """Final scores of the candidates (candidate order) from one query's attention."""
        if self.reattn is not None:
            from heedrank.reranker.reattn import reattn_scores, token_forms

            tok = self.lm.tokenizer
            c = self.token_scores(att)
            mass = [c[s:e].tolist() for s, e in prompt.spans]
            forms = [token_forms(tok, prompt.context_ids[s:e]) for s, e in prompt.spans]
            qforms = set(token_forms(tok, encode_untrusted(tok, " " + query.strip())))
            return reattn_scores(mass, forms, qforms, self.reattn)
        if self.head_weights is not None:
            ph = self.per_head_scores(att)
            row = {l: i for i, l in enumerate(att.layers)}
            w = self.head_weights
            heads = self.heads or []
            return [float(sum(ph[row[l], h, i] * w[l][h] for l, h in heads)) for i in range(len(prompt.spans))]
        return masked_document_scores(self.token_scores(att), prompt.spans, self.options.mask_std)

    # -- the two hooks of the rerank skeleton, and windows ---------------------------------
    def score_prompt(self, prompt: ICRPrompt, query: str, *, block_store: Any = None) -> DocumentScores:
        """Scores of one prompt's candidates (called under the LM's lock): masked
        calibrated attention (module docstring)."""
        att = self.token_attention(prompt)
        scores = self.document_scores(att, prompt, query)
        n_tokens = len(prompt.context_ids) + len(prompt.query_ids) + (len(prompt.calib_ids) if att.calib is not None else 0)
        return DocumentScores(
            scores=scores, truncated=list(prompt.truncated), prompt_tokens=n_tokens,
            details=self._details(att, prompt), passes=(ScoredPass(prompt, att, tuple(range(len(prompt.spans)))),),
        )

    def score_documents(self, query: str, docs: Sequence[Document], *, block_store: Any = None) -> DocumentScores:
        """One prompt when it fits :meth:`context_limit`; otherwise windows (option
        ``windows``, not with ``keep_attention``), else :class:`ContextOverflowError`."""
        windows = self.options.windows and not self.options.keep_attention
        prompt = self.build_prompt(query, docs, check_context=not windows)
        if prompt.total_tokens <= self.context_limit():
            with self.lm.lock:
                return self.score_prompt(prompt, query)
        return self._score_windows(query, docs, prompt)

    def _score_windows(self, query: str, docs: Sequence[Document], full: ICRPrompt) -> DocumentScores:
        """Score ``docs`` in windows that fit, aligned on anchors (:mod:`heedrank.reranker.windows`)."""
        tok = self.lm.tokenizer
        limit = self.context_limit()
        sep = len(encode_trusted(tok, "\n\n"))
        marker = max(len(encode_trusted(tok, f"[{k}]")) for k in range(1, len(docs) + 1))
        contents, _ = self.encode_documents(docs)
        costs = [len(c) + marker + sep for c in contents]  # upper bound whatever a candidate's place
        placed = sum(e - s for s, e in full.spans) + sep * len(docs)
        fixed = full.total_tokens - placed
        plan = plan_windows(costs, fixed, limit, self.options.anchors)
        window_scores: list[list[float]] = []
        passes: list[ScoredPass] = []
        tokens = 0
        timings: dict[str, float] = {}
        for idx in plan.windows:
            prompt = self.build_prompt(query, [docs[i] for i in idx])
            with self.lm.lock:
                part = self.score_prompt(prompt, query)
            window_scores.append(part.scores)
            passes.append(ScoredPass(prompt, part.passes[0].state, tuple(idx)))
            tokens += part.prompt_tokens
            for k, v in part.details.get("timings", {}).items():
                timings[k] = timings.get(k, 0.0) + v
        scores, shifts = align_to_anchors(plan, window_scores)
        anchors = [docs[i].doc_id for i in plan.anchors]
        sizes = [len(w) for w in plan.windows]
        how = (f"each carrying the first-stage top {len(anchors)} candidate(s) as anchor(s), scores shifted so "
               "that the anchors agree with window 0" if anchors else
               "without anchors (a window cannot hold one next to the longest candidate): scores of different "
               "windows are not aligned")
        warning = (f"the ICR prompt for {len(docs)} candidates needs {full.total_tokens} positions but a prompt may hold "
                   f"{limit}; ranked in {len(plan.windows)} windows of {min(sizes)}-{max(sizes)} candidates, {how}")
        logger.info(warning)
        details = {
            "timings": timings,
            "windows": {"count": len(plan.windows), "positions": limit, "candidates": sizes,
                        "anchors": anchors, "shifts": shifts},
        }
        return DocumentScores(
            scores=scores, truncated=list(full.truncated), prompt_tokens=tokens, details=details,
            warnings=(warning,), passes=tuple(passes),
        )

    def finish_details(self, details: dict[str, Any], owner: Sequence[int]) -> dict[str, Any]:
        """``details["attention"]["spans"]`` mapped from distinct texts to every candidate."""
        att = details.get("attention")
        if att is not None:
            details["attention"] = {**att, "spans": [att["spans"][o] for o in owner]}
        return details

    def limits(self) -> dict[str, Any]:
        """:meth:`AttentionReranker.limits` plus ``window_tokens`` (positions of one prompt)
        and ``candidates_per_window``: candidates of ``max_doc_tokens`` tokens one prompt
        holds with a query at its budget; ``max_candidates`` is ``null`` (no limit) with
        option ``windows``, else that count."""
        out = super().limits()
        tok = self.lm.tokenizer
        empty = self.build_prompt(CALIBRATION_QUERY, [], check_context=False)
        fixed = empty.total_tokens - len(encode_untrusted(tok, " " + CALIBRATION_QUERY)) + out["max_query_tokens"]
        per_doc = self.config.max_doc_tokens + len(encode_trusted(tok, "[100]")) + len(encode_trusted(tok, "\n\n"))
        per_window = max(0, (self.context_limit() - fixed) // per_doc)
        out.update(window_tokens=self.context_limit(), candidates_per_window=per_window,
                   max_candidates=None if self.options.windows and per_window >= 1 else per_window)
        return out

    # -- public ----------------------------------------------------------------------
    def rerank_with_evidence(
        self, query: Query, candidates: Sequence[Document], *, max_spans: int = 3, block_store: Any = None
    ) -> RerankResult:
        """:meth:`rerank` plus evidence, from the same pass(es): the result is the one
        :meth:`rerank` returns (same scores and order), with ``RerankResult.evidence``
        ``{doc_id: [EvidenceSpan, ...]}`` (see :meth:`evidence_from`; with windows, each
        candidate's evidence comes from the window that scored it).

        Raises:
            ValidationError: empty query, ``max_spans < 1``.
            ContextOverflowError: see :meth:`rerank`.
        """
        if max_spans < 1:
            raise ValidationError(f"max_spans must be >= 1, got {max_spans}")
        run = self.run(query, candidates)
        evidence: dict[str, list[EvidenceSpan]] = {}
        if run.scored is not None:
            members: dict[int, list[Document]] = {}
            for doc, o in zip(candidates, run.owner):
                members.setdefault(o, []).append(doc)
            done: set[int] = set()
            for p in run.scored.passes:
                scores = self.token_scores(p.state).tolist()
                for pos, u in enumerate(p.docs):
                    if u in done:
                        continue  # an anchor: its evidence comes from window 0
                    done.add(u)
                    for doc in members.get(u, []):
                        evidence[doc.doc_id] = self._doc_evidence(doc, p.prompt.spans[pos], p.prompt, scores, max_spans)
        return replace(run.result, evidence=evidence)

    def evidence(
        self, query: Query, candidates: Sequence[Document], *, max_spans: int = 3
    ) -> Mapping[str, Sequence[EvidenceSpan]]:
        """The document spans that drew the most calibrated query attention.

        Returns:
            ``{doc_id: [EvidenceSpan, ...]}`` for every candidate, each list best first with
            at most ``max_spans`` spans (empty when no word has positive attention).

        Example:
            >>> ev = icr.evidence(Query("q", "boiling point of water"), docs)  # doctest: +SKIP
            >>> [(s.text, round(s.score, 3)) for s in ev["d-water"]]     # doctest: +SKIP
            [('water boils at 100 degrees', 0.412), ...]
        """
        return self.rerank_with_evidence(query, candidates, max_spans=max_spans).evidence or {}

    def content_offsets(self, doc: Document) -> tuple[list[int], list[tuple[str, int, int]]]:
        """Token ids of a document's content as placed in the prompt (truncated to
        ``max_doc_tokens``), and for each token its ``(field, start, end)`` character range
        in ``doc.title`` or ``doc.text`` (:func:`heedrank.reranker.scoring.content_offsets`).

        Raises:
            ValidationError: the tokenizer gives no offsets (not a "fast" tokenizer).
        """
        return content_offsets(self.lm.tokenizer, doc, self.config.max_doc_tokens)

    def _doc_evidence(
        self, doc: Document, span: tuple[int, int], prompt: ICRPrompt, scores: Sequence[float], max_spans: int
    ) -> list[EvidenceSpan]:
        start, end = span
        ids, offsets = self.content_offsets(doc)
        first = end - len(ids)
        if len(ids) == 0 or first < start or prompt.context_ids[first:end] != ids:
            logger.debug("no evidence for %s: its tokens could not be aligned with the prompt", doc.doc_id)
            return []
        return _top_spans(doc, offsets, scores[first:end], max_spans)

    def evidence_from(
        self, att: TokenAttention, prompt: ICRPrompt, candidates: Sequence[Document], *, max_spans: int = 3
    ) -> dict[str, list[EvidenceSpan]]:
        """Evidence spans of each candidate from one query's token attention.

        Token scores are the calibrated query-to-token attention of the selected heads
        (``token_scores``: summed over layers and heads, weighted with ``heads="learned"``;
        with ReAttn, the same calibrated attention before re-weighting). Tokens are grouped
        into words (a word starts after whitespace or at a field boundary; a word's score
        is the sum of its tokens'); the ``3 * max_spans`` best words with a positive score
        are kept, adjacent kept words merge into one span, and the ``max_spans`` best
        spans are returned, best first. Offsets are characters into ``doc.text`` (or
        ``doc.title``, ``field="title"``); ``text[start:end] == span.text``. Only the part of
        a document within ``max_doc_tokens`` can be evidence.

        Returns:
            ``{doc_id: [EvidenceSpan, ...]}`` in candidate order.
        """
        scores = self.token_scores(att).tolist()
        return {doc.doc_id: self._doc_evidence(doc, span, prompt, scores, max_spans)
                for doc, span in zip(candidates, prompt.spans)}

    def _details(self, att: TokenAttention, prompt: ICRPrompt) -> dict[str, Any]:
        details: dict[str, Any] = {"timings": att.seconds}
        if self.options.keep_attention:  # for attention dumps (eval --dump)
            import torch

            details["attention"] = {
                "calibrated": att.calibrated().to(torch.float16), "layers": att.layers,
                "spans": prompt.spans, "context_ids": prompt.context_ids,
            }
        return details

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["heads"] = "all" if not self.heads else [list(h) for h in self.heads]
        d["heads_spec"] = self.options.heads if isinstance(self.options.heads, str) else "list"
        d["reattn"] = None if self.reattn is None else vars(self.reattn)
        return d


def from_config(config: RerankerConfig) -> ICRReranker:
    return ICRReranker(config)

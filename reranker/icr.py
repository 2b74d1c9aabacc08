"""ICR: zero-shot in-context reranking from attention, with content-free calibration.

Source: Chen, Gutiérrez, Su, "Attention in Large Language Models Yields Efficient
Zero-Shot Re-Rankers", ICLR 2025, Sections 3-4 (repo OSU-NLP-Group/In-Context-Reranking);
specified in ``shared/design/ALGORITHMS.md`` section 1.

Prompt (inside the model's chat template, when it has one)::

    Here are some paragraphs:\\n\\n[1] <d_N>\\n\\n[2] <d_N-1> ... [N] <d_1>\\n\\n
    Please find information that is relevant to the following query in the paragraphs above.\\n\\nQuery: <q>

Candidates are placed in reverse first-stage order (the best candidate nearest the query).
The query span ``Q`` runs from the late instruction to the end of the prompt (chat suffix
included). One forward pass over the context (instruction + documents) fills the KV cache;
then two short passes run the query span with the real query and with the content-free
query ``N/A`` against that cache, reading attention for the query rows only
(:mod:`reranker.attention`).

Scores: ``a_j(q) = sum_l sum_h mean_{i in Q} A[l,h][i,j]``, ``c_j = a_j(q) - a_j("N/A")``;
within each document, tokens with ``c_j <= mean(c) - 2 std(c)`` (std with Bessel's
correction, per document, as the reference code) are dropped, and the document score is the
sum of the kept ``c_j``. A score is a difference of attention probability mass summed over
layers and heads: unitless, higher = more relevant, comparable only within one query.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from attnrank.config import RerankerConfig
from attnrank.errors import ContextOverflowError, ValidationError
from attnrank.protocols import RerankResult
from attnrank.types import Document, Query, Ranking, ScoredDoc
from reranker.base import AttentionReranker
from reranker.prompt import bos_ids, chat_wrap, encode_trusted, encode_untrusted, truncate

logger = logging.getLogger(__name__)

LATE_INSTRUCTIONS = {
    "ie": "Please find information that is relevant to the following query in the paragraphs above.",
    "qa": "Please answer the following question based on the information in the paragraphs above.",
}
CALIBRATION_QUERY = "N/A"


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


@dataclass(frozen=True)
class EvidenceSpan:
    """A span of a document that drew query attention (see :meth:`ICRReranker.evidence_from`).

    Attributes:
        field: ``"text"`` or ``"title"``: the document field the offsets index.
        start: First character, 0-based, into that field.
        end: One past the last character (``field_value[start:end] == text``).
        text: The span's characters.
        score: Sum of the calibrated attention of its tokens (attention probability mass
            summed over the read layers and heads, minus that of the ``N/A`` query):
            unitless, higher = more attended, comparable within one response.
    """

    field: Literal["text", "title"]
    start: int
    end: int
    text: str
    score: float


def _top_spans(
    doc: Document, offsets: Sequence[tuple[str, int, int]], scores: Sequence[float], max_spans: int
) -> list[EvidenceSpan]:
    """Words from token offsets, best ``3 * max_spans`` positive words, adjacent ones merged,
    best ``max_spans`` spans."""
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
    out = []
    for fld, a, b, sc, _ in spans[:max_spans]:
        value = doc.title if fld == "title" else doc.text
        out.append(EvidenceSpan(fld, a, b, value[a:b], float(sc)))
    return out


def masked_document_scores(token_scores, spans: Sequence[tuple[int, int]], n_std: float | None = 2.0) -> list[float]:
    """Per-document sum of token scores, dropping tokens at or below ``mean - n_std * std``.

    Args:
        token_scores: float tensor ``(T,)`` of calibrated token scores.
        spans: ``[start, end)`` token ranges, one per document.
        n_std: Mask threshold in standard deviations (per document); ``None`` = no mask.

    Returns:
        One float per span (0.0 for an empty span).
    """
    scores = []
    for start, end in spans:
        c = token_scores[start:end]
        if c.numel() == 0:
            scores.append(0.0)
            continue
        if n_std is not None and c.numel() > 1:
            std = c.std()
            if float(std) > 0:  # a constant document keeps all its tokens (the reference would drop all)
                c = c[c > (c.mean() - n_std * std)]
        scores.append(float(c.sum()))
    return scores


class ICRReranker(AttentionReranker):
    """ICR reranker (registry name ``"icr"``).

    Options (``RerankerConfig.options``):
        calibration (bool, default True): subtract the ``N/A`` query's attention.
        mask_std (float | None, default 2.0): per-document token mask threshold; None = off.
        instruction ("ie" | "qa", default "ie"): late instruction.
        reverse (bool, default True): best first-stage candidate nearest the query.
        chat_template (bool, default True): wrap the prompt in the model's chat template.
        keep_attention (bool, default False): return the per-head calibrated token attention
            in ``details["attention"]`` (``calibrated``: float16 ``(L_read, H, T)``, ``spans``,
            ``context_ids``), for attention dumps.
        heads ("all" | "qr" | "learned" | path | list of [layer, head]): score with the
            selected heads only (``qr``: the packaged head set of this model; ``learned``:
            its learned per-head weights, ``s(d) = sum_h w_h s_h(d)``), and stop the forward
            pass after the deepest selected layer (ALGORITHMS.md section 2).
        reattn (bool | {idf, entropy, gamma}): ReAttn re-weighting of the token attention
            (ALGORITHMS.md section 4) instead of the mean-2std mask; input is the calibrated
            token attention of the selected heads (weighted for ``learned``) clipped at 0.

    Example:
        >>> r = ICRReranker(RerankerConfig(method="icr"))
        >>> r.rerank(Query("q1", "vitamin d and bone health"), docs).ranking.doc_ids[:3]
    """

    name = "icr"
    template_version = "v1"

    def __init__(self, config: RerankerConfig, lm: Any = None) -> None:
        super().__init__(config, lm)
        if self.option("instruction", "ie") not in LATE_INSTRUCTIONS:
            raise ValidationError(f"instruction must be one of {sorted(LATE_INSTRUCTIONS)}")
        from reranker.reattn import ReAttnConfig

        self.reattn = ReAttnConfig.parse(self.option("reattn", None))
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
            from reranker.heads import resolve_heads

            heads, weights = resolve_heads(self.option("heads", None), self.lm.identity)
            for l, h in heads or []:
                if not (0 <= l < self.lm.num_layers and 0 <= h < self.lm.num_heads):
                    raise ValidationError(f"head ({l}, {h}) does not exist in this model")
            self._heads = (heads, weights)
        return self._heads

    # -- prompt ----------------------------------------------------------------------
    def build_prompt(self, query: str, candidates: Sequence[Document], *, check_context: bool = True) -> ICRPrompt:
        """Tokenise the ICR prompt for ``query`` and ``candidates`` (first-stage order).

        ``check_context=False`` builds prompts past the model's trained positions (only for
        benchmarks that time the full-attention path there).

        Raises:
            ContextOverflowError: the prompt exceeds the model's context; the error names
                the largest candidate count that fits.
        """
        tok = self.lm.tokenizer
        wrap = chat_wrap(tok, self.option("chat_template", True))
        head = bos_ids(tok, wrap) + encode_trusted(tok, wrap.prefix + "Here are some paragraphs:")
        sep = encode_trusted(tok, "\n\n")
        order = list(range(len(candidates)))
        if self.option("reverse", True):
            order.reverse()
        contents: dict[int, list[int]] = {}
        truncated = [False] * len(candidates)
        for i, doc in enumerate(candidates):
            ids, cut = truncate(encode_untrusted(tok, " " + doc.content), self.config.max_doc_tokens)
            contents[i] = ids
            truncated[i] = cut
        context = list(head)
        spans: list[tuple[int, int]] = [(0, 0)] * len(candidates)
        for pos, i in enumerate(order):
            context += sep
            start = len(context)
            context += encode_trusted(tok, f"[{pos + 1}]") + contents[i]
            spans[i] = (start, len(context))
        context += sep
        late = LATE_INSTRUCTIONS[self.option("instruction", "ie")] + "\n\nQuery:"

        def span(q: str) -> list[int]:
            return encode_trusted(tok, late) + encode_untrusted(tok, " " + q.strip()) + encode_trusted(tok, wrap.suffix)

        prompt = ICRPrompt(context, spans, span(query), span(CALIBRATION_QUERY), truncated)
        limit = self.lm.max_positions
        if check_context and prompt.total_tokens > limit:
            fixed = len(head) + len(sep) + max(len(prompt.query_ids), len(prompt.calib_ids))
            n, used = 0, fixed
            for i in range(len(candidates)):  # top candidates first
                used += len(sep) + (spans[i][1] - spans[i][0])
                if used > limit:
                    break
                n += 1
            raise ContextOverflowError(
                f"the ICR prompt has {prompt.total_tokens} tokens but the model's context holds {limit}; "
                f"at most {n} of these candidates fit (lower candidates or max_doc_tokens, or use blockrank)",
                max_candidates=n,
            )
        return prompt

    # -- attention -------------------------------------------------------------------
    def token_attention(self, prompt: ICRPrompt) -> TokenAttention:
        """Run the context pass and the query-span passes; per-head attention to the context."""
        import torch

        from reranker.attention import AttentionCapture, run_with_capture

        lm = self.lm
        model = lm.model.base_model  # decoder only: the LM head is never needed
        layers = sorted({l for l, _ in self.heads}) if self.heads else list(range(lm.num_layers))
        stop = max(layers) if self.heads and max(layers) < lm.num_layers - 1 else None
        device = lm.device
        T = len(prompt.context_ids)
        timings: dict[str, float] = {}
        with torch.inference_mode():
            from transformers import DynamicCache

            cache = DynamicCache(config=lm.model.config)
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
            c = read(prompt.calib_ids) if self.option("calibration", True) else None
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
        for the layers in ``att.layers`` (ALGORITHMS.md section 2)."""
        from reranker.heads import per_head_document_scores

        return per_head_document_scores(att.calibrated(), att.spans, self.option("mask_std", 2.0))

    def document_scores(self, att: TokenAttention, prompt: ICRPrompt, query: str) -> list[float]:
        """Final scores of the candidates (candidate order) from one query's attention."""
        if self.reattn is not None:
            from reranker.reattn import reattn_scores, token_forms

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
            return [float(sum(ph[row[l], h, i] * w[l][h] for l, h in self.heads)) for i in range(len(prompt.spans))]
        return masked_document_scores(self.token_scores(att), prompt.spans, self.option("mask_std", 2.0))

    # -- public ----------------------------------------------------------------------
    def rerank(self, query: Query, candidates: Sequence[Document]) -> RerankResult:
        """Rerank ``candidates`` (first-stage order) for ``query``.

        Returns:
            RerankResult whose ranking holds every candidate, scored by masked calibrated
            attention (see module docstring); ``details["timings"]`` in seconds.

        Raises:
            ValidationError: empty query.
            ContextOverflowError: prompt longer than the model's context.
        """
        return self._rerank(query, candidates)[0]

    def rerank_with_evidence(
        self, query: Query, candidates: Sequence[Document], *, max_spans: int = 3
    ) -> RerankResult:
        """:meth:`rerank` plus evidence, from the same single pass: the result is the one
        :meth:`rerank` returns (same scores and order), with ``details["evidence"]``
        ``{doc_id: [EvidenceSpan, ...]}`` (see :meth:`evidence_from`).

        Raises:
            ValidationError: empty query, ``max_spans < 1``.
            ContextOverflowError: prompt longer than the model's context.
        """
        if max_spans < 1:
            raise ValidationError(f"max_spans must be >= 1, got {max_spans}")
        result, prompt, att = self._rerank(query, candidates)
        evidence = self.evidence_from(att, prompt, candidates, max_spans=max_spans) if prompt is not None else {}
        return replace(result, details={**result.details, "evidence": evidence})

    def evidence(
        self, query: Query, candidates: Sequence[Document], *, max_spans: int = 3
    ) -> dict[str, list[EvidenceSpan]]:
        """The document spans that drew the most calibrated query attention.

        Returns:
            ``{doc_id: [EvidenceSpan, ...]}`` for every candidate, each list best first with
            at most ``max_spans`` spans (empty when no word has positive attention).

        Example:
            >>> ev = icr.evidence(Query("q", "boiling point of water"), docs)
            >>> [(s.text, round(s.score, 3)) for s in ev["d-water"]]     # doctest: +SKIP
            [('water boils at 100 degrees', 0.412), ...]
        """
        return self.rerank_with_evidence(query, candidates, max_spans=max_spans).details["evidence"]

    def content_offsets(self, doc: Document) -> tuple[list[int], list[tuple[str, int, int]]]:
        """Token ids of a document's content as placed in the prompt (truncated to
        ``max_doc_tokens``), and for each token its ``(field, start, end)`` character range
        in ``doc.title`` or ``doc.text`` (``field`` ``"title"``/``"text"``; ``("", 0, 0)`` for
        the separating space). Ranges come from the fast tokenizer's offset mapping, with
        leading whitespace trimmed.

        Raises:
            ValidationError: the tokenizer gives no offsets (not a "fast" tokenizer).
        """
        tok = self.lm.tokenizer
        text = " " + doc.content
        try:
            enc = tok(text, add_special_tokens=False, split_special_tokens=True, return_offsets_mapping=True)
        except NotImplementedError as exc:
            raise ValidationError(f"evidence needs a fast tokenizer with offsets: {exc}") from None
        ids, _ = truncate(list(enc.input_ids), self.config.max_doc_tokens)
        title_end = 1 + len(doc.title) if doc.title else 0  # content offset of the title/text separator
        text_start = title_end + 1 if doc.title else 1
        spans: list[tuple[str, int, int]] = []
        for a, b in list(enc.offset_mapping)[: len(ids)]:
            while a < b and text[a].isspace():
                a += 1
            if a >= b:
                spans.append(("", 0, 0))
            elif doc.title and b <= title_end:
                spans.append(("title", a - 1, b - 1))
            elif a >= text_start:
                spans.append(("text", a - text_start, b - text_start))
            else:  # straddles the separator (does not happen with whitespace pre-tokenisers)
                spans.append(("", 0, 0))
        return ids, spans

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
        out: dict[str, list[EvidenceSpan]] = {}
        for doc, (start, end) in zip(candidates, prompt.spans):
            ids, offsets = self.content_offsets(doc)
            first = end - len(ids)
            if len(ids) == 0 or first < start or prompt.context_ids[first:end] != ids:
                logger.debug("no evidence for %s: its tokens could not be aligned with the prompt", doc.doc_id)
                out[doc.doc_id] = []
                continue
            out[doc.doc_id] = _top_spans(doc, offsets, scores[first:end], max_spans)
        return out

    def _rerank(
        self, query: Query, candidates: Sequence[Document]
    ) -> tuple[RerankResult, ICRPrompt | None, TokenAttention | None]:
        """:meth:`rerank`, also returning the prompt and token attention (``None`` without candidates)."""
        if not query.text.strip():
            raise ValidationError("query is empty")
        t0 = time.perf_counter()
        if not candidates:
            return RerankResult(Ranking(query.query_id, ())), None, None
        ids = [d.doc_id for d in candidates]
        if len(set(ids)) != len(ids):
            raise ValidationError(f"duplicate doc ids among the candidates of query {query.query_id!r}")
        prompt = self.build_prompt(query.text, candidates)
        with self.lm.lock:
            att = self.token_attention(prompt)
        scores = self.document_scores(att, prompt, query.text)
        ranking = Ranking.from_hits(query.query_id, (ScoredDoc(d, s, doc) for d, s, doc in zip(ids, scores, candidates)))
        truncated = tuple(d for d, cut in zip(ids, prompt.truncated) if cut)
        n_tokens = len(prompt.context_ids) + len(prompt.query_ids) + (len(prompt.calib_ids) if att.calib is not None else 0)
        result = RerankResult(
            ranking=ranking,
            truncated=truncated,
            prompt_tokens=n_tokens,
            seconds=time.perf_counter() - t0,
            details=self._details(att, prompt),
        )
        return result, prompt, att

    def _details(self, att: TokenAttention, prompt: ICRPrompt) -> dict[str, Any]:
        details: dict[str, Any] = {"timings": att.seconds}
        if self.option("keep_attention", False):  # for attention dumps (eval --dump)
            import torch

            details["attention"] = {
                "calibrated": att.calibrated().to(torch.float16), "layers": att.layers,
                "spans": prompt.spans, "context_ids": prompt.context_ids,
            }
        return details

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["heads"] = "all" if not self.heads else [list(h) for h in self.heads]
        d["heads_spec"] = self.option("heads", "all") if isinstance(self.option("heads", "all"), str) else "list"
        d["reattn"] = None if self.reattn is None else vars(self.reattn)
        return d


def from_config(config: RerankerConfig) -> ICRReranker:
    return ICRReranker(config)

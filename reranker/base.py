"""Shared plumbing of the attention rerankers: options, the LM, and one rerank skeleton.

:meth:`AttentionReranker.rerank` is the same for every method:

1. refuse an empty query and duplicate doc ids (:class:`ValidationError`);
2. collapse candidates with identical text (:func:`heedrank.reranker.scoring.distinct_texts`):
   each distinct text is scored once and its duplicates get the same score (docs/results/zero-shot.md,
   "Position sensitivity");
3. cut a query longer than its token budget (:meth:`query_budget`, default
   :data:`heedrank.reranker.options.DEFAULT_MAX_QUERY_TOKENS` or a quarter of the model's
   context when that is less) and say so in the result's warnings and the log;
4. :meth:`score_documents`: by default the two hooks, :meth:`build_prompt` then
   :meth:`score_prompt` under the LM's lock (ICR overrides it to add windows);
5. :meth:`Ranking.from_hits`, truncation, timings, warnings.

Subclasses set ``options_class`` (:mod:`heedrank.reranker.options`) and implement the two
hooks. Options are parsed once, at construction (``self.options``).
"""

from __future__ import annotations

import logging
import operator
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from heedrank.config import DEFAULT_MAX_DOC_TOKENS, RerankerConfig
from heedrank.errors import ValidationError
from heedrank.protocols import RerankResult
from heedrank.seam import RerankerServing
from heedrank.reranker.options import DEFAULT_MAX_QUERY_TOKENS, RerankerOptions
from heedrank.reranker.scoring import distinct_texts
from heedrank.types import Document, Query, Ranking, ScoredDoc

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScoredPass:
    """One scored prompt, kept for what is read from it afterwards (evidence).

    Attributes:
        prompt: The method's prompt object.
        state: What the method read from the model (e.g. ICR's token attention).
        docs: Indices (into the documents given to :meth:`AttentionReranker.score_documents`)
            of the prompt's candidates, in the prompt's candidate order.
    """

    prompt: Any
    state: Any
    docs: tuple[int, ...]


@dataclass(frozen=True)
class DocumentScores:
    """Scores of a list of documents from one prompt or several windows.

    Attributes:
        scores: One score per document, in the order given (unitless; see the method).
        truncated: Per document, whether its content was cut to ``max_doc_tokens``.
        prompt_tokens: LM tokens processed (all passes, all windows).
        details: Method diagnostics (``timings`` in seconds, ...), into ``RerankResult.details``.
        warnings: What the caller should know (windows used, ...), into ``RerankResult.warnings``.
        passes: The scored prompts (one per window).
        cache: Block hits and misses (a method reading stored blocks), into ``RerankResult.cache``.
    """

    scores: list[float]
    truncated: list[bool]
    prompt_tokens: int
    details: dict[str, Any] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    passes: tuple[ScoredPass, ...] = ()
    cache: dict[str, int] | None = None


@dataclass(frozen=True)
class RerankRun:
    """A :meth:`AttentionReranker.rerank` result with what produced it.

    Attributes:
        result: What :meth:`AttentionReranker.rerank` returns.
        docs: The distinct candidates that were scored (first-stage order).
        owner: Per candidate, the index in ``docs`` whose score it took.
        scored: Their scores and passes (``None`` without candidates).
    """

    result: RerankResult
    docs: list[Document] = field(default_factory=list)
    owner: list[int] = field(default_factory=list)
    scored: DocumentScores | None = None


SCORE_SCALES: dict[str, float] = {"icr": 0.3, "calibrated": 0.03, "learned": 1.0}
"""Typical spread ``s`` of a reranker's raw scores within one query, by their kind
(:attr:`AttentionReranker.score_kind`): ``icr`` (ICR's calibrated attention mass over every
layer and head), ``calibrated`` (BlockRank's calibrated attention over layers 0..l*),
``learned`` (cached BlockRank's learned weights over z-scored calibrated attention). Each is
the median, over NFCorpus dev queries, of the standard deviation of the scores of BM25's top
20 (SmolLM2-135M: icr 0.29 over 18 queries; blockrank-cached calibrated 0.029 and learned 1.05
over 10). ``/rerank``'s ``relevance_score`` is ``sigmoid(raw / s)`` without a calibration
(:mod:`heedrank.serving`). ``signal`` scores are probabilities (no scale)."""


class AttentionReranker:
    """Base class: holds the config, the parsed options and the lazily loaded LM; runs the
    rerank skeleton (module docstring) around two hooks, :meth:`build_prompt` and
    :meth:`score_prompt`."""

    name = "attention"
    template_version = "v1"
    options_class: type[RerankerOptions] = RerankerOptions

    def __init__(self, config: RerankerConfig, lm: Any = None) -> None:
        """
        Raises:
            ValidationError: ``max_doc_tokens < 1``, or options the method does not know
                or accept (the message names the valid ones).
        """
        if config.method != self.options_class.method and self.options_class.method:
            config = replace(config, method=self.options_class.method)  # typed for this method (set options of
            # another method are refused: heedrank.registry.typed_options)
        max_doc_tokens = config.max_doc_tokens
        if max_doc_tokens is None:  # the method's own budget
            max_doc_tokens = int(getattr(self.options_class, "default_max_doc_tokens", DEFAULT_MAX_DOC_TOKENS))
            config = replace(config, max_doc_tokens=max_doc_tokens)
        if max_doc_tokens < 1:
            raise ValidationError(f"max_doc_tokens must be >= 1, got {max_doc_tokens}")
        self.config = config
        options = config.options
        self.options = options if isinstance(options, self.options_class) else self.options_class.parse(options)
        self._lm = lm

    @classmethod
    def from_config(cls, config: RerankerConfig, **resources: Any) -> AttentionReranker:
        """The reranker of ``config``; ``resources``: those of its ``build_resources`` that
        :func:`heedrank.registry.build_reranker` was given (constructor keywords)."""
        return cls(config, **resources)

    @property
    def lm(self):
        """The loaded LM (:class:`heedrank.reranker.lm.LoadedLM`), loaded on first use."""
        if self._lm is None:
            from heedrank.reranker.lm import load_lm

            self._lm = load_lm(
                self.config.model, device=self.config.device, dtype=self.config.dtype, cache_dir=self.config.cache_dir
            )
        return self._lm

    @property
    def loaded_lm(self):
        """The LM if it is loaded, else ``None`` (never loads it)."""
        return self._lm

    def load(self) -> AttentionReranker:
        """Load the model now (the API does this at start-up)."""
        _ = self.lm
        return self

    def option(self, key: str, default: Any = None) -> Any:
        """The parsed value of option ``key`` (``default`` for a name the method lacks)."""
        return getattr(self.options, key, default)

    # -- checks --------------------------------------------------------------------
    def check_model_indices(self, layers: Iterable[int] = (), heads: Iterable[tuple[int, int]] = ()) -> None:
        """Check layer indices and ``(layer, head)`` pairs against the loaded model.

        Raises:
            ValidationError: a layer outside ``[0, num_layers - 1]`` or a head outside
                ``[0, num_heads - 1]``; the message gives the model's ranges.
        """
        n, h = self.lm.num_layers, self.lm.num_heads
        for layer in layers:
            try:
                index = operator.index(layer)
            except TypeError:
                index = -1
            if isinstance(layer, bool) or not 0 <= index < n:
                raise ValidationError(f"layer must be in [0, {n - 1}] for this model, got {layer!r}")
        for layer, head in heads:
            if not (0 <= layer < n and 0 <= head < h):
                raise ValidationError(
                    f"head ({layer}, {head}) does not exist in this model (layers 0..{n - 1}, heads 0..{h - 1})"
                )

    # -- context budgets -------------------------------------------------------------
    def context_limit(self) -> int:
        """Positions one prompt may use: the model's context (``max_position_embeddings``)."""
        return int(self.lm.max_positions)

    def query_budget(self, candidates: Sequence[Document]) -> int:
        """Most LM tokens of the query: option ``max_query_tokens``, else
        :data:`heedrank.reranker.options.DEFAULT_MAX_QUERY_TOKENS` (64) or a quarter of
        :meth:`context_limit` when that is less (at least 1)."""
        fixed = getattr(self.options, "max_query_tokens", None)
        if fixed:
            return int(fixed)
        return max(1, min(DEFAULT_MAX_QUERY_TOKENS, self.context_limit() // 4))

    def fit_query(self, text: str, candidates: Sequence[Document]) -> tuple[str, list[str]]:
        """``text`` cut to :meth:`query_budget` tokens, and the warnings saying so.

        The query is tokenised as the prompts place it (a leading space, special-token
        strings split); a cut query is decoded back to text and re-checked.
        """
        from heedrank.reranker.prompt import encode_untrusted

        tok = self.lm.tokenizer
        budget = self.query_budget(candidates)
        ids = encode_untrusted(tok, " " + text)
        if len(ids) <= budget:
            return text, []
        keep = budget
        cut = text
        while keep > 0:
            cut = tok.decode(ids[:keep], skip_special_tokens=False).strip()
            if len(encode_untrusted(tok, " " + cut)) <= budget:
                break
            keep -= 1
        if not cut:
            raise ValidationError(f"the query cannot be cut to {budget} tokens; shorten it")
        message = (f"query cut to its first {budget} of {len(ids)} LM tokens (the {self.name} query budget: "
                   f"option max_query_tokens, default {DEFAULT_MAX_QUERY_TOKENS}); the rest of the query was not read")
        logger.info(message)
        return cut, [message]

    # -- hooks -------------------------------------------------------------------------
    def build_prompt(self, query: str, candidates: Sequence[Document]) -> Any:  # pragma: no cover
        """Hook: the method's prompt for ``query`` and ``candidates`` (first-stage order).

        Raises:
            ContextOverflowError: the prompt does not fit the model's positions.
        """
        raise NotImplementedError

    def score_prompt(self, prompt: Any, query: str, *, block_store: Any = None) -> DocumentScores:  # pragma: no cover
        """Hook: score the prompt's candidates (called under the LM's lock); ``block_store``:
        see :meth:`rerank` (methods that read no stored blocks ignore it)."""
        raise NotImplementedError

    def score_documents(self, query: str, docs: Sequence[Document], *, block_store: Any = None) -> DocumentScores:
        """Scores of distinct ``docs`` for ``query``: :meth:`build_prompt`, then
        :meth:`score_prompt` under the LM's lock. Methods override it to split
        candidates into several prompts."""
        prompt = self.build_prompt(query, docs)
        with self.lm.lock:
            return self.score_prompt(prompt, query, block_store=block_store)

    def finish_details(self, details: dict[str, Any], owner: Sequence[int]) -> dict[str, Any]:
        """Hook: map per-distinct-text details back to every candidate (default: as is)."""
        return details

    # -- the skeleton ------------------------------------------------------------------
    def rerank(self, query: Query, candidates: Sequence[Document], *, block_store: Any = None) -> RerankResult:
        """Rerank ``candidates`` (first-stage order) for ``query``.

        ``block_store``: a collection's document KV store
        (:class:`heedrank.protocols.BlockStore`) that a method reading stored candidate
        blocks (``blockrank-cached``) reads, and writes the blocks it lacks to; ``None`` =
        its RAM cache only. Other methods ignore it.

        Returns:
            RerankResult whose ranking holds every candidate (candidates with identical
            text share one score); ``details["timings"]`` in seconds; ``warnings`` for a
            cut query, shared scores or windows.

        Raises:
            ValidationError: empty query, duplicate doc ids.
            ContextOverflowError: the candidates cannot be scored within the model's
                context (see the method).
        """
        return self.run(query, candidates, block_store=block_store).result

    def run(self, query: Query, candidates: Sequence[Document], *, block_store: Any = None) -> RerankRun:
        """:meth:`rerank`, also returning the distinct documents and their scored passes."""
        text = query.text.strip()
        if not text:
            raise ValidationError("query is empty; send a query with some text")
        t0 = time.perf_counter()
        if not candidates:
            return RerankRun(RerankResult(Ranking(query.query_id, ())))
        ids = [d.doc_id for d in candidates]
        if len(set(ids)) != len(ids):
            dup = sorted({d for d in ids if ids.count(d) > 1})[:5]
            raise ValidationError(
                f"duplicate doc ids {dup} among the candidates of query {query.query_id!r}; send each document once"
            )
        unique, owner = distinct_texts(candidates)
        text, warnings = self.fit_query(text, unique)
        scored = self.score_documents(text, unique, block_store=block_store)
        scores = [scored.scores[o] for o in owner]
        ranking = Ranking.from_hits(
            query.query_id, (ScoredDoc(d, s, doc) for d, s, doc in zip(ids, scores, candidates))
        )
        details = self.finish_details(dict(scored.details), owner)
        if len(unique) < len(candidates):
            shared = {ids[i]: unique[o].doc_id for i, o in enumerate(owner) if unique[o].doc_id != ids[i]}
            details["duplicates"] = shared
            warnings.append(f"{len(shared)} candidate{'s' if len(shared) != 1 else ''} repeat{'' if len(shared) != 1 else 's'} "
                            "the text of another; each distinct text was scored once "
                            "and its duplicates share its score")
        result = RerankResult(
            ranking=ranking,
            truncated=tuple(d for d, o in zip(ids, owner) if scored.truncated[o]),
            prompt_tokens=scored.prompt_tokens,
            seconds=time.perf_counter() - t0,
            details=details,
            warnings=tuple(warnings) + tuple(scored.warnings),
            cache=scored.cache,
        )
        return RerankRun(result, unique, owner, scored)

    def rerank_batch(self, queries: Sequence[Query], candidates: Sequence[Sequence[Document]]) -> list[RerankResult]:
        """One :class:`RerankResult` per query (queries run one after another)."""
        if len(queries) != len(candidates):
            raise ValidationError(f"{len(queries)} queries but {len(candidates)} candidate lists")
        return [self.rerank(q, c) for q, c in zip(queries, candidates)]

    def limits(self) -> dict[str, Any]:
        """What the loaded model holds for this method (``GET /info``): ``context`` and
        ``max_query_tokens`` in LM tokens, ``max_doc_tokens``; methods add their own."""
        return {
            "context": int(self.lm.max_positions),
            "max_doc_tokens": self.config.max_doc_tokens,
            "max_query_tokens": self.query_budget(()),
        }

    @property
    def scoring(self) -> str | None:
        """The scorer in use: option ``scoring`` when the method has one, else ``None``."""
        value = getattr(self.options, "scoring", None)
        return None if value is None else str(value)

    @property
    def score_kind(self) -> str:
        """What the raw scores are, the key of :data:`SCORE_SCALES`: the scorer in use
        (:attr:`scoring`: ``"signal"``, ``"calibrated"``, ``"learned"``, ...), else the method name."""
        return self.scoring or self.name

    @property
    def score_scale(self) -> float | None:
        """The typical spread of this reranker's raw scores within one query
        (:data:`SCORE_SCALES`), or ``None`` when they are probabilities already
        (``scoring='signal'``) or of a kind with no measured scale."""
        return SCORE_SCALES.get(self.score_kind)

    def serving(self) -> RerankerServing:
        """What the server reads (:class:`heedrank.seam.RerankerServing`): the score scale and the
        document budget; cached BlockRank adds its card's scorer, fusion and calibration."""
        return RerankerServing(score_scale=self.score_scale, max_doc_tokens=self.config.max_doc_tokens)

    def describe(self) -> dict[str, Any]:
        """Identity for reports: method, template, model, budgets and the parsed,
        default-filled options."""
        return {
            "method": self.name,
            "template_version": f"{self.name}-{self.template_version}",
            "model": self.lm.identity,
            "max_doc_tokens": self.config.max_doc_tokens,
            "device": self.config.device,
            "dtype": self.config.dtype,
            "options": self.options.to_dict(),
        }

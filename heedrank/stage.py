"""The rerank stage of a search: one request's candidates reranked and served.

    hydrated candidates (first-stage order) -> reranker, when the policy reads it
    (:class:`heedrank.pipeline.RerankerCache`) -> the policy's signals, an ``(N, F)`` matrix
    (:func:`heedrank.signals.gather`) -> serving policy (:class:`heedrank.serving.ServePolicy`)
    -> :class:`heedrank.results.RerankedQuery`

The step :class:`heedrank.pipeline.Pipeline` takes after its first stage, in one place for
every path: :meth:`~heedrank.pipeline.Pipeline.search_batch` (``/search``, ``eval``),
:meth:`~heedrank.pipeline.Pipeline.rerank_documents` (``/rerank``, ``rerank-batch``) and
:meth:`~heedrank.pipeline.Pipeline.serve_without_lm` (a request the deadline stopped) each open
one :class:`RerankStage` per request, so ``/search`` and ``/rerank`` serve one list alike.

The rules of the stage's options live beside it (:func:`check_rerank_options`,
:func:`check_explainer`), but :meth:`heedrank.pipeline.Pipeline.validate` and
:meth:`~heedrank.pipeline.Pipeline.check_rerank` remain the one place that runs them: a stage
is opened only with options checked there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import numpy as np

from heedrank.calibration import resolve_cutoff
from heedrank.errors import UnknownNameError, ValidationError
from heedrank.fusion import resolve_weight
from heedrank.protocols import ExplainingReranker, Reranked, Reranker, RerankResult
from heedrank.results import NO_RERANK, RerankedQuery, SearchOptions
from heedrank.serving import Served, ServePolicy
from heedrank.signals import SignalInputs, gather, signal
from heedrank.signals.base import CosineSource
from heedrank.types import Document, Query, Ranking



class RerankerSource(Protocol):
    """What the stage reads from :class:`heedrank.pipeline.RerankerCache` (declared here, so that
    the stage does not import the pipeline module that opens it)."""

    def get(self, method: str, options: Mapping[str, Any] | None = None,
            max_doc_tokens: int | None = None) -> tuple[Reranker, threading.BoundedSemaphore]: ...

    def rerank(self, query: Query, candidates: Sequence[Document], method: str,
               options: Mapping[str, Any] | None = None, max_doc_tokens: int | None = None, *,
               explain: bool = False, evidence_spans: int = 3, index: Any = None, cold_budget: int | None = None,
               entry: tuple[Reranker, threading.BoundedSemaphore] | None = None,
               priority: Sequence[str] | None = None, fit_deadline: bool = True) -> Reranked: ...

__all__ = ["DEFAULT_FUSION", "HEAD_OPTIONS", "RerankStage", "RerankerSource", "check_explainer", "check_rerank_options"]


def check_explainer(reranker: Reranker, method: str) -> ExplainingReranker:
    """``reranker`` if it can explain (``rerank_with_evidence``). Raises ValidationError."""
    if not isinstance(reranker, ExplainingReranker):
        raise ValidationError(f"explain is not supported by the {method!r} reranker; use method 'icr'")
    return reranker


HEAD_OPTIONS = ("heads", "reattn")
"""Options that only some rerankers take (their options classes say which)."""

DEFAULT_FUSION = "default"
"""``SearchOptions.fusion`` value: the reranker's recorded fusion weight
(``default_fusion``, e.g. cached BlockRank's weights card), none when it records none."""


def check_rerank_options(options: SearchOptions, known_methods: Callable[[], list[str] | None], *,
                         fusion_name: str) -> SearchOptions:
    """The rules of the rerank stage's options, run by :meth:`heedrank.pipeline.Pipeline.check_rerank`
    (the one entry point): the method, ``heads``/``reattn``, ``explain``, ``fusion``, ``cutoff``
    (resolved) and ``cold_budget``.

    Args:
        options: The options; returned as they are when checked already (:attr:`SearchOptions.checked`).
        known_methods: The methods the pipeline can build, sorted
            (:meth:`heedrank.pipeline.RerankerCache.known_methods`; ``None``: it does not say), called
            only when ``options.rerank`` is not ``"none"`` (it may raise: reranking disabled).
        fusion_name: How a bad ``fusion`` is named in its message.

    Returns:
        ``options`` with ``cutoff`` resolved, marked checked (``"rerank"``, unless validated already).

    Raises:
        UnknownNameError: an unknown rerank method.
        ValidationError: options of another reranker; ``explain``, ``fusion`` or ``cutoff``
            without reranking; a bad ``fusion``, ``cutoff`` or ``cold_budget`` value.
    """
    from heedrank import registry

    if options.checked:
        return options
    method = options.rerank
    aliases = registry.reranker_aliases()
    if method != NO_RERANK:
        known = known_methods()
        if known is not None and aliases.get(method, method) not in known:
            raise UnknownNameError(f"unknown rerank method {method!r}; choose one of "
                                   f"{[NO_RERANK, *sorted(aliases), *known]}")
    head_options = [k for k in HEAD_OPTIONS if k in (options.rerank_options or {})]
    takers = registry.methods_with_options(HEAD_OPTIONS)
    if head_options and aliases.get(method, method) not in takers:
        named = " and ".join(m for m in ("icr", "blockrank") if m in takers)
        more = [m for m in takers if m not in ("icr", "blockrank")]
        raise ValidationError(
            f"rerank.{'/'.join(head_options)} are options of the {named} rerankers"
            f"{' (also ' + ', '.join(more) + ')' if more else ''}, not of {method!r}"
        )
    if options.explain and method == NO_RERANK:
        raise ValidationError(
            "explain needs reranking (evidence comes from the reranker's attention); add rerank"
        )
    if options.fusion is not None and options.fusion != DEFAULT_FUSION:
        if method == NO_RERANK:
            raise ValidationError("fusion needs reranking (it mixes first-stage and reranker scores); add rerank")
        resolve_weight(options.fusion, name=fusion_name)  # raises for a bad value
    if options.cutoff is not None:
        cutoff = resolve_cutoff(options.cutoff)  # raises for a bad value
        if cutoff is not None and method == NO_RERANK:
            raise ValidationError("cutoff needs reranking (it thresholds the reranker's calibrated scores); add "
                                  "rerank, or use top_k")
        options = replace(options, cutoff=cutoff)
    if options.cold_budget is not None and (isinstance(options.cold_budget, bool)
                                            or not isinstance(options.cold_budget, int) or options.cold_budget < 0):
        raise ValidationError(f"cold_budget must be an integer >= 0 (blocks encoded inline) or null (no budget), "
                              f"got {options.cold_budget!r}")
    return replace(options, checked="rerank")


@dataclass(frozen=True)
class RerankStage:
    """One request's rerank stage: its reranker looked up once and its serving policy resolved
    once (:meth:`open`), then each query's candidates reranked and served (:meth:`serve`).

    Attributes:
        cache: The reranker cache that runs the reranker (its lock, the cold budget, the
            background fill: :meth:`heedrank.pipeline.RerankerCache.rerank`).
        entry: The reranker and what admits its calls (:meth:`heedrank.pipeline.RerankerCache.get`).
        policy: How its scores are served (:meth:`heedrank.serving.ServePolicy.of`).
        options: The request's options, checked (``rerank``, ``rerank_options``, ``explain``,
            ``evidence_spans``, ``cutoff``, ``cold_budget``).
        index: The collection's index (its document KV store), or ``None``.
        dense: The embedder's cosines (:class:`heedrank.signals.base.CosineSource`), or ``None``:
            the scorer works without them.
    """

    cache: RerankerSource
    entry: tuple[Reranker, threading.BoundedSemaphore]
    policy: ServePolicy
    options: SearchOptions
    index: Any = None
    dense: CosineSource | None = None

    @classmethod
    def open(cls, cache: RerankerSource, options: SearchOptions, *, index: Any = None, dense: Any = None,
             max_doc_tokens: int | None = None, by: str = "score", scale: float | None = None,
             check_explain: bool = True) -> RerankStage:
        """Look up (build, on first use) the reranker of ``options`` and resolve its policy.

        Args:
            cache: See :attr:`cache`.
            options: Checked options (:meth:`heedrank.pipeline.Pipeline.check_rerank`).
            index: See :attr:`index`.
            dense: See :attr:`dense`.
            max_doc_tokens: The reranker's document budget, tokens (``None``: the configured one).
            by: :data:`heedrank.serving.BY` (``"prior"``: the given order is a client's, not
                fused).
            scale: Override of the reranker's ``score_scale`` (:meth:`ServePolicy.of`).
            check_explain: Refuse ``options.explain`` with a reranker that cannot explain.

        Raises:
            UnknownNameError, ValidationError: see :meth:`heedrank.pipeline.RerankerCache.get`,
                :meth:`ServePolicy.of`; ``explain`` with a reranker that cannot explain.
            ModelLoadError: the reranker's model cannot be loaded.
        """
        entry = cache.get(options.rerank, options.rerank_options, max_doc_tokens)
        if check_explain and options.explain:
            check_explainer(entry[0], options.rerank)
        policy = ServePolicy.of(entry[0], fusion=None if by == "prior" else options.fusion, cutoff=options.cutoff,
                                by=by, method=options.rerank, scale=scale)
        return cls(cache, entry, policy, options, index, dense)

    @property
    def reranker(self) -> Reranker:
        """The request's reranker."""
        return self.entry[0]

    def serve(self, query: Query, cands: Ranking, *, use_store: bool = True) -> RerankedQuery:
        """Rerank ``cands`` and serve them by :attr:`policy`.

        The reranker runs only when the policy reads its output (:attr:`ServePolicy.reads_reranker`:
        the embedder alone, method ``dense``, runs none); then the signals the policy reads are
        gathered (:func:`heedrank.signals.gather`, NaN where a candidate has none: a block over
        the cold budget, a document without a vector) and served in one call
        (:meth:`ServePolicy.serve`).

        Args:
            query: The query (with text).
            cands: The candidates, hydrated, in first-stage (given) order, with their scores.
            use_store: Read (and fill) :attr:`index`'s document KV store and the stored vectors.

        Returns:
            The :class:`~heedrank.results.RerankedQuery`; ``seconds`` is wall-clock seconds.

        Raises:
            ContextOverflowError: the candidates do not fit the model's context.
        """
        t0 = time.perf_counter()
        policy = self.policy
        inputs = self._inputs(query, cands, use_store, None)
        X = gather(policy.features, inputs)  # the reranker's own columns NaN until its pass
        reranked = None
        if policy.reads_reranker:
            reranked = self._rerank(query, cands, use_store, policy.priority(cands, X))
            inputs = replace(inputs, reranker=reranked.result.ranking)
            for col, name in enumerate(policy.features):
                if signal(name).reads_reranker:
                    X[:, col] = signal(name).values(inputs)
        else:  # no pass: the reranker's own scores are one of the signals gathered
            j = policy.features.index(policy.own) if policy.own in policy.features else None
            own = X[:, j] if j is not None else np.full(len(cands), np.nan)
            if j is not None and len(cands) and not np.isfinite(own).any():
                # the path lacks that signal's source (an index without vectors): the reranker computes it
                reranked = self._rerank(query, cands, use_store, None)
                X[:, j] = own = inputs.column(reranked.result.ranking.to_dict())
            else:
                scores = {h.doc_id: float(v) for h, v in zip(cands.hits, own) if np.isfinite(v)}
                reranked = Reranked(self.reranker, RerankResult(Ranking.from_scores(cands.query_id, scores),
                                                                seconds=time.perf_counter() - t0))
        served = policy.serve(cands, X)
        return RerankedQuery(reranked=reranked, served=served, policy=policy, seconds=time.perf_counter() - t0)

    def _rerank(self, query: Query, cands: Ranking, use_store: bool, priority: Sequence[str] | None) -> Reranked:
        """The reranker's pass over the candidates (:meth:`RerankerSource.rerank`: its lock, the
        cold budget and the deadline, the document KV store when ``use_store``); ``priority``:
        which cold blocks to encode first (doc ids, best first)."""
        options = self.options
        return self.cache.rerank(
            query, [h.document for h in cands.hits if h.document is not None], options.rerank, options.rerank_options,
            explain=options.explain, evidence_spans=options.evidence_spans, index=self.index if use_store else None,
            cold_budget=options.cold_budget if options.cutoff is None else None, entry=self.entry, priority=priority,
            fit_deadline=self.policy.serves_partly)

    def serve_without_lm(self, query: Query, cands: Ranking, *, use_store: bool = True) -> Served | None:
        """``cands`` served from the signals at hand, no reranker pass: the default's scorer
        with no attention.

        Returns:
            The :class:`~heedrank.serving.Served` query, or ``None`` when the policy's strategy
            cannot score without the reranker or the stage has no :attr:`dense` signal.
        """
        if not self.policy.strategy.without_reranker or self.dense is None:
            return None
        return self.policy.serve(cands, gather(self.policy.features, self._inputs(query, cands, use_store, None)))

    def _inputs(self, query: Query, cands: Ranking, use_store: bool, reranked: Reranked | None) -> SignalInputs:
        """What the signals read of this query's candidates."""
        return SignalInputs(query, cands, None if reranked is None else reranked.result.ranking, dense=self.dense,
                            stored=use_store, ranked=self.policy.ranked)

"""The one search pipeline used by the API, the batch command and the evaluator:

    retrieve top-k1 -> hydrate from the document store -> rerank the top N -> cut to k

with per-stage timings in seconds.

:meth:`Pipeline.validate` is the one owner of whether a search is valid: ``top_k`` and
``candidates`` against the pipeline's :class:`~heedrank.config.SearchLimits`, the retriever
and rerank method names, reranker options, ``explain``, and the metadata filter, which it
parses once into the options it returns (the stages below pass the parsed filter on). The
API route, :meth:`Pipeline.search_batch`, the evaluation harness and ``rerank-batch`` all go
through it, so a bad value gets the same message everywhere.

The rerank step (reranker looked up, candidates reranked and served, the rules of its
options) is :mod:`heedrank.stage`; the pipeline opens one :class:`~heedrank.stage.RerankStage`
per request.
"""

from __future__ import annotations

import inspect
import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from heedrank.blocks import BlockSync, block_store_for
from heedrank.cancel import time_left
from heedrank.capabilities import PrefetchesBlocks
from heedrank.config import PipelineConfig, SearchLimits
from heedrank.errors import UnknownNameError, ValidationError
from heedrank.passcost import PassCosts
from heedrank.protocols import DocStore, Reranked, Reranker, RerankResult, Retriever, SupportsClose
from heedrank.results import (
    NO_RERANK,
    FirstStageRow,
    RerankedQuery,
    SearchOptions,
    SearchResult,
    merge_reranked,
    merge_served,
)
from heedrank.seam import serving_of
from heedrank.serving import BY, Served, share_identical
from heedrank.stage import RerankStage, check_explainer, check_rerank_options
from heedrank.types import Document, Query, Ranking

__all__ = [
    "NO_RERANK", "FirstStageRow", "Pipeline", "RerankedQuery", "RerankerCache", "SearchOptions", "SearchResult",
    "merge_reranked", "merge_served",
]

logger = logging.getLogger(__name__)

RerankerFactory = Callable[..., Reranker]
"""Builds a reranker: ``factory(method)`` for the default configuration, and
``factory(method, options=..., max_doc_tokens=...)`` for other ones (a factory whose
signature has no ``options`` keyword builds by method name only)."""


def options_key(options: Mapping[str, Any] | None) -> str:
    """Canonical JSON of reranker options (sorted keys, compact): equal options, equal key.

    Raises:
        ValidationError: options that are not JSON-serialisable.
    """
    try:
        return json.dumps(dict(options or {}), sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"reranker options must be JSON values: {exc}") from None


def _takes_options(factory: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        return False
    return "options" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def _cold_texts(candidates: Sequence[Document], cold: Sequence[bool], priority: Sequence[str] | None) -> list[str]:
    """The cold candidates' texts (one block each), first those first in ``priority`` (doc ids,
    best first: the serving strategy's prior, :meth:`heedrank.serving.ServePolicy.priority`),
    then in the given order."""
    rank = {d: i for i, d in enumerate(priority or ())}
    pending = sorted((i for i, c in enumerate(cold) if c), key=lambda i: (rank.get(candidates[i].doc_id, len(rank)), i))
    return list(dict.fromkeys(candidates[i].content for i in pending))


def _within_budget(candidates: Sequence[Document], cold: Sequence[bool], budget: int,
                   priority: Sequence[str] | None = None) -> tuple[list[Document], list[Document]]:
    """``(reranked, skipped)``: every warm candidate and ``budget`` cold ones, in the given order;
    the rest of the cold ones. The cold ones kept are the first of :func:`_cold_texts`. Candidates
    sharing a text share one block, so they count once and are kept or skipped together."""
    spent = set(_cold_texts(candidates, cold, priority)[:max(0, budget)])
    kept = [d for d, c in zip(candidates, cold) if not c or d.content in spent]
    skipped = [d for d, c in zip(candidates, cold) if c and d.content not in spent]
    return kept, skipped


def _prefetch_within(reranker: PrefetchesBlocks, store: Any, candidates: Sequence[Document], cold: Sequence[bool],
                     costs: PassCosts, priority: Sequence[str] | None, limit: int) -> int:
    """Encode cold candidates' blocks ahead of the pass, a chunk at a time in ``priority`` order
    (:func:`_within_budget`'s), while the time left (:func:`heedrank.cancel.time_left`) covers the
    next chunk and the pass (:meth:`PassCosts.cold_within`, learning ``b`` from every chunk, so a
    machine busier than the estimate stops the encoding early, not the request); returns how many
    cold texts were made warm (the cold budget of the pass that follows), at most ``limit`` (the
    request's own cold budget)."""
    texts = _cold_texts(candidates, cold, priority)[:max(0, limit)]
    by_text = {d.content: d for d, c in zip(candidates, cold) if c}
    warm = len(candidates) - sum(cold)
    done = 0
    while done < len(texts):
        left = time_left()
        fits = 0 if left is None else costs.cold_within(left, warm + done)  # what the time left still covers
        # a chunk takes at most a quarter of the time left by the estimate: a machine twice as busy costs a quarter
        chunk = texts[done:done + min(fits, costs.chunk_size(min(1.5, left / 4) if left is not None else 1.5))]
        if not chunk:
            break
        t0 = time.perf_counter()
        encoded = reranker.prefetch_blocks([by_text[t] for t in chunk], store)
        costs.observe_blocks(max(encoded, 1), time.perf_counter() - t0)
        done += len(chunk)
    return done


def call_gate(reranker: Any) -> threading.BoundedSemaphore:
    """What admits a reranker's calls: a semaphore of its ``concurrent_calls`` (cached BlockRank
    runs that many query passes at once, :class:`heedrank.reranker.cached.slots.PassSlots`), else of 1
    (one call at a time: the method's passes share the LM's state)."""
    n = serving_of(reranker).concurrent_calls
    return threading.BoundedSemaphore(n if isinstance(n, int) and n >= 1 else 1)


class RerankerCache:
    """Rerankers by ``(method, options, max_doc_tokens)``, built on first use and kept.

    One cache can be shared by several pipelines (one per collection) so that each
    reranker, and its model, exists once. Rerankers with the default configuration
    (no options, default ``max_doc_tokens``) are kept for the cache's lifetime; the others
    are evicted least-recently-used beyond ``max_entries`` (they share the process-wide LM
    of :func:`heedrank.reranker.lm.load_lm`, so an eviction frees only the small reranker object).

    Args:
        factory: See :data:`RerankerFactory`.
        max_entries: Most non-default rerankers kept.
    """

    def __init__(self, factory: RerankerFactory, max_entries: int = 16) -> None:
        self.factory = factory
        self.max_entries = max_entries
        self._takes_options = _takes_options(factory)
        self._default: dict[str, tuple[Reranker, threading.BoundedSemaphore]] = {}
        self._custom: OrderedDict[tuple[str, str, int | None], tuple[Reranker, threading.BoundedSemaphore]] = OrderedDict()
        self._guard = threading.Lock()
        self._active = 0
        self._idle = threading.Condition()
        self._costs: dict[int, PassCosts] = {}  # by id() of a built reranker (kept while it is)
        self.cold_listener: Callable[[Any, Any, Sequence[Document]], None] | None = None
        """Called as ``listener(reranker, block_store, documents)`` with the candidates a
        recompute budget left out (their blocks cold); the service's background fill
        (:class:`heedrank.api.fill.BlockFiller`) queues them. Must not block."""

    @property
    def active(self) -> int:
        """Rerank calls running or waiting for a reranker's lock now."""
        with self._idle:
            return self._active

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until no rerank call is running or waiting (or ``timeout`` seconds);
        returns whether it is idle. The background fill waits here between blocks."""
        with self._idle:
            return self._idle.wait_for(lambda: self._active == 0, timeout)

    def get(
        self, method: str, options: Mapping[str, Any] | None = None, max_doc_tokens: int | None = None
    ) -> tuple[Reranker, threading.BoundedSemaphore]:
        """The reranker for ``(method, options, max_doc_tokens)`` and what admits its calls
        (:func:`call_gate`), built on first use.

        Raises:
            UnknownNameError: unknown method.
            ValidationError: options given to a factory that builds by name only, or
                options the reranker rejects.
            ModelLoadError: the reranker's model cannot be loaded (factories that load eagerly).
        """
        from heedrank import registry

        method = registry.resolve_method(method)
        if not options and max_doc_tokens is None:
            with self._guard:
                if method not in self._default:
                    reranker = self.factory(method)
                    self._default[method] = (reranker, call_gate(reranker))
                return self._default[method]
        if not self._takes_options:
            raise ValidationError(
                "this pipeline builds rerankers by method name only; reranker options are not supported"
            )
        key = (method, options_key(options), max_doc_tokens)
        with self._guard:
            entry = self._custom.get(key)
            if entry is None:
                reranker = self.factory(method, options=dict(options or {}), max_doc_tokens=max_doc_tokens)
                entry = (reranker, call_gate(reranker))
                self._custom[key] = entry
                while len(self._custom) > self.max_entries:
                    self._custom.popitem(last=False)
            self._custom.move_to_end(key)
            return entry

    def rerank(
        self,
        query: Query,
        candidates: Sequence[Document],
        method: str,
        options: Mapping[str, Any] | None = None,
        max_doc_tokens: int | None = None,
        *,
        explain: bool = False,
        evidence_spans: int = 3,
        index: Any = None,
        cold_budget: int | None = None,
        entry: tuple[Reranker, threading.BoundedSemaphore] | None = None,
        priority: Sequence[str] | None = None,
        fit_deadline: bool = True,
    ) -> Reranked:
        """Rerank ``candidates`` with the reranker for ``(method, options, max_doc_tokens)``
        (``entry``: that reranker and its lock, already looked up with :meth:`get` for this request).

        With ``index`` (the collection's index), a reranker in cached mode reads candidate
        blocks from the index's document KV store (:func:`block_store_for`).

        With ``cold_budget`` (see :attr:`SearchOptions.cold_budget`) and a reranker that says
        which candidates are cold (``cold_candidates``, cached BlockRank), every warm
        candidate and the first ``cold_budget`` cold ones (in the given order) are reranked;
        the result ranks those, and :attr:`Reranked.skipped` lists the doc ids left out,
        which go to :attr:`cold_listener`. Under a deadline (the calling job's, read as
        :func:`heedrank.cancel.time_left` once the reranker is this call's), the cold ones kept
        are also only as many as fit the time left by the reranker's running costs
        (:class:`heedrank.passcost.PassCosts`), so the LM reads what it can and the rest are
        skipped, not the whole call stopped at the deadline (``fit_deadline``: the caller can serve
        a list read in part, :attr:`heedrank.serving.ServePolicy.serves_partly`). The cold ones kept are
        the first in ``priority`` (doc ids, best first; the serving strategy's prior), else in the
        given order.

        With ``explain``, the reranker must offer ``rerank_with_evidence`` (ICR does); its
        result carries :attr:`RerankResult.evidence`.

        Raises:
            ValidationError: ``explain`` with a reranker that cannot explain; see :meth:`get`.
        """
        reranker, lock = entry if entry is not None else self.get(method, options, max_doc_tokens)
        explainer = check_explainer(reranker, method) if explain else None
        skipped: list[Document] = []
        with self._idle:
            self._active += 1
        try:
            with lock:
                store = block_store_for(reranker, index) if index is not None else None
                cold_of = serving_of(reranker).cold_candidates
                costs = self._costs.setdefault(id(reranker), PassCosts())
                left = time_left() if fit_deadline else None
                if cold_of is not None and (cold_budget is not None or left is not None):
                    cold = cold_of(candidates, store)
                    budget = cold_budget if cold_budget is not None else len(candidates)
                    if left is not None and isinstance(reranker, PrefetchesBlocks):  # a chunk at a time
                        budget = _prefetch_within(reranker, store, candidates, cold, costs, priority, budget)
                    elif left is not None:  # as many cold blocks as the estimate says fit the time left
                        budget = min(budget, costs.cold_within(left, len(candidates) - sum(cold)))
                    candidates, skipped = _within_budget(candidates, cold, budget, priority)
                extra: dict[str, Any] = {} if store is None else {"block_store": store}  # only a reader of blocks
                t0 = time.perf_counter()
                if not candidates:
                    result = RerankResult(Ranking(query.query_id, ()))
                elif explainer is not None:
                    result = explainer.rerank_with_evidence(query, candidates, max_spans=evidence_spans, **extra)
                else:
                    result = reranker.rerank(query, candidates, **extra)
                if result.cache is not None and candidates:
                    costs.observe(len(candidates), int(result.cache.get("misses", 0)), time.perf_counter() - t0)
        finally:
            with self._idle:
                self._active -= 1
                self._idle.notify_all()
        listener = self.cold_listener
        if skipped and listener is not None:
            try:
                listener(reranker, store, skipped)
            except Exception:  # noqa: BLE001 - the fill is best effort; the search has its answer
                logger.exception("queueing %d cold blocks for the background fill failed", len(skipped))
        return Reranked(reranker=reranker, result=result, skipped=tuple(d.doc_id for d in skipped))

    def known_methods(self) -> list[str] | None:
        """The methods this cache can build, sorted: the registry's plus those built, for a
        factory made by :func:`reranker_factory`; ``None`` when the factory does not say
        (a custom one), and only building tells."""
        if not isinstance(self.factory, RegistryRerankerFactory):
            return None
        return sorted(set(self.factory.methods()) | self.methods())

    def methods(self) -> set[str]:
        """Methods whose default reranker has been built."""
        with self._guard:
            return set(self._default) | {m for m, _, _ in self._custom}

    def entries(self) -> list[tuple[Reranker, threading.BoundedSemaphore]]:
        """Every built reranker with what admits its calls (:func:`call_gate`)."""
        with self._guard:
            return list(self._default.values()) + list(self._custom.values())

    def loaded(self) -> dict[str, Reranker]:
        """Built rerankers: the default ones by method name, the others as
        ``method{options}[max_doc_tokens=N]``."""
        with self._guard:
            out = {m: r for m, (r, _) in self._default.items()}
            for (m, opts, mdt), (r, _) in self._custom.items():
                out[m + (opts if opts != "{}" else "") + (f"[max_doc_tokens={mdt}]" if mdt is not None else "")] = r
            return out


def check_query_texts(queries: Sequence[Query]) -> None:
    """Refuse a query without text. Raises ValidationError (naming the query)."""
    for q in queries:
        if not q.text or not q.text.strip():
            raise ValidationError(f"query {q.query_id!r} is empty; send a non-empty query text")


class Pipeline:
    """Retrieve -> hydrate -> rerank -> cut.

    Args:
        retrievers: Retrievers by name.
        docstore: Document store used to hydrate hits.
        reranker_factory: Builds rerankers on first use (see :data:`RerankerFactory`;
            models load once and are cached in this object); ``None`` disables reranking.
        limits: Bounds of ``top_k`` and ``candidates`` (default: ``SearchLimits()``).
        describe_index: The index's ``describe()`` (for ``/info`` and reports).
        rerankers: A :class:`RerankerCache` to use instead of one built from
            ``reranker_factory`` (share one between the pipelines of several collections).
        index: The opened index object, when built by :meth:`from_config` (``None`` otherwise).
        dense: The ``dense`` signal of the default's scorer (``heedrank.index.cosines.DenseSignal``:
            ``cosines(query, documents, stored=...)``), or ``None``: the scorer then works without it.
        max_top_k: Shorthand: ``limits`` with this ``max_top_k``.
        max_candidates: Shorthand: ``limits`` with this ``max_candidates``.
    """

    def __init__(
        self,
        retrievers: Mapping[str, Retriever],
        docstore: DocStore,
        reranker_factory: RerankerFactory | None = None,
        *,
        limits: SearchLimits | None = None,
        describe_index: Mapping[str, Any] | None = None,
        rerankers: RerankerCache | None = None,
        index: Any = None,
        dense: Any = None,
        max_top_k: int | None = None,
        max_candidates: int | None = None,
    ) -> None:
        limits = limits or SearchLimits()
        if max_top_k is not None or max_candidates is not None:
            limits = replace(
                limits,
                max_top_k=limits.max_top_k if max_top_k is None else max_top_k,
                max_candidates=limits.max_candidates if max_candidates is None else max_candidates,
            )
        self.retrievers = retrievers
        self.docstore = docstore
        self.reranker_factory = reranker_factory
        self.limits = limits
        self.describe_index: Mapping[str, Any] = describe_index if describe_index is not None else {}
        self.rerankers = rerankers
        if self.rerankers is None and reranker_factory is not None:
            self.rerankers = RerankerCache(reranker_factory)
        self.index = index
        self.dense = dense

    @property
    def max_top_k(self) -> int:
        """``limits.max_top_k``."""
        return self.limits.max_top_k

    @property
    def max_candidates(self) -> int:
        """``limits.max_candidates``."""
        return self.limits.max_candidates

    def __repr__(self) -> str:
        return f"Pipeline(retrievers={sorted(self.retrievers)}, limits={self.limits}, docstore={self.docstore!r})"

    @classmethod
    def from_config(cls, config: PipelineConfig, *, rerankers: RerankerCache | None = None) -> Pipeline:
        """Open the index and build every retriever; rerankers load lazily by name.

        Args:
            config: Index directory, base reranker configuration and limits.
            rerankers: A shared reranker cache (default: a new one over ``config.reranker``).
        """
        from heedrank import registry

        extra: dict[str, Any] = {} if config.kv_cache_bytes is None else {"kv_cache_bytes": config.kv_cache_bytes}
        if config.kv_tiers is not None:
            extra["kv_tiers"] = config.kv_tiers
        index = registry.open_index(config.index_dir, show_progress=config.show_progress, **extra)
        retrievers = {}
        for name in index.available_retrievers():
            retrievers[name] = registry.build_retriever(name, index)

        return cls(
            retrievers=retrievers,
            docstore=index.docstore,
            reranker_factory=reranker_factory(config.reranker, block_cache_bytes=config.block_cache_bytes),
            limits=config.limits,
            describe_index=index.describe(),
            rerankers=rerankers,
            index=index,
            dense=registry.dense_signal(index),
        )

    def close(self) -> None:
        """Close the index (or document store) this pipeline opened."""
        target = self.index if self.index is not None else self.docstore
        if isinstance(target, SupportsClose):
            target.close()

    # -- rerankers -------------------------------------------------------------------
    def reranker(
        self, method: str, options: Mapping[str, Any] | None = None, max_doc_tokens: int | None = None
    ) -> Reranker:
        """The reranker ``method`` (with ``options`` merged over the configured ones), built
        on first use and cached per distinct options. Raises UnknownNameError, ValidationError."""
        return self._cache().get(method, options, max_doc_tokens)[0]

    def _cache(self) -> RerankerCache:
        if self.rerankers is None:
            raise ValidationError("reranking is disabled in this pipeline; use rerank='none'")
        return self.rerankers

    def _stage(self, options: SearchOptions, *, max_doc_tokens: int | None = None, by: str = "score",
               scale: float | None = None, check_explain: bool = True) -> RerankStage:
        """:meth:`RerankStage.open` over this pipeline's reranker cache, index and dense signal."""
        return RerankStage.open(self._cache(), options, index=self.index, dense=self.dense,
                                max_doc_tokens=max_doc_tokens, by=by, scale=scale, check_explain=check_explain)

    def loaded_rerankers(self) -> dict[str, Reranker]:
        return self.rerankers.loaded() if self.rerankers is not None else {}

    # -- validation ------------------------------------------------------------------
    def validate(self, options: SearchOptions) -> SearchOptions:
        """Check a search's options and return them ready to run, with the filter parsed.

        The one place a search is checked (the API route, :meth:`search_batch`, the eval
        harness and ``rerank-batch`` call it), in this order: ``top_k`` (against
        ``limits.max_top_k``), the retriever name, the rerank method (when the reranker
        factory lists its methods; see :meth:`RerankerCache.known_methods`), ``candidates``
        (when reranking, against ``limits.max_candidates``), ``heads``/``reattn`` options
        (icr and blockrank only), ``explain`` (needs reranking), the metadata filter.

        The filter is parsed here, once: the returned options carry the parsed filter
        (validating them again parses nothing). Whether a built reranker can ``explain``
        is checked when it is built (:meth:`search_batch`), since building may load a model.

        Returns:
            ``options`` with ``filter`` parsed (``None`` for no filter), marked checked
            (:attr:`SearchOptions.checked` ``"search"``: validating them again returns them as they are).

        Raises:
            ValidationError: ``top_k``/``candidates`` out of range, options of another
                reranker, ``explain`` without reranking, reranking disabled.
            UnknownNameError: unknown retriever or rerank method.
            FilterError: an invalid metadata filter (the message names the clause).
        """
        from heedrank import registry

        if options.checked == "search":
            return options
        self.limits.check_top_k(options.top_k)
        if options.retriever not in self.retrievers:
            raise UnknownNameError(
                f"unknown retriever {options.retriever!r}; choose one of {sorted(self.retrievers)}"
            )
        if options.rerank != NO_RERANK:
            self.limits.check_candidates(options.candidates)
        options = self.check_rerank(options)
        parsed = registry.parse_filter(options.filter)
        return replace(options, filter=parsed, checked="search")

    def check_rerank(self, options: SearchOptions, *, fusion_name: str = "fusion (rerank.fusion, --fusion)"
                     ) -> SearchOptions:
        """The reranking part of :meth:`validate` (``/rerank`` and :meth:`rerank_documents`
        check only this): the method, ``heads``/``reattn``, ``explain``, ``fusion``
        (``fusion_name`` in its message), ``cutoff`` (resolved) and ``cold_budget``, by the
        rules of :func:`heedrank.stage.check_rerank_options` against this pipeline's methods.

        Returns:
            ``options`` with ``cutoff`` resolved, marked checked (``"rerank"``, unless validated already).

        Raises:
            ValidationError, UnknownNameError: as :meth:`validate`.
        """
        return check_rerank_options(options, lambda: self._cache().known_methods(), fusion_name=fusion_name)

    # -- documents -------------------------------------------------------------------
    @property
    def blocks(self) -> BlockSync:
        """The upkeep of this pipeline's index's document KV store for its built rerankers
        (:class:`heedrank.blocks.BlockSync`)."""
        return BlockSync(self.index, self.rerankers)

    def encode_blocks(self, documents: Sequence[Document]) -> int:
        """:meth:`heedrank.blocks.BlockSync.encode_new` of :attr:`blocks`: the blocks of
        ``documents`` the index's store lacks, computed and stored. Returns the blocks written."""
        return self.blocks.encode_new(documents)

    def delete_documents(self, doc_ids: Sequence[str]) -> dict[str, Any]:
        """Delete documents from this pipeline's index, durably, then drop their blocks from
        the index's document KV store right after the delete is committed
        (:meth:`heedrank.blocks.BlockSync.after_delete`: a failure there is logged and does
        not undo or fail the delete). The API's ``DELETE /documents/{id}`` runs this in its
        ingest pool.

        Returns:
            The index's answer, ``{"deleted": [doc ids], "missing": [doc ids]}``, plus
            ``"blocks_dropped"`` (blocks deleted from the KV store).

        Raises:
            IndexMismatchError: the pipeline has no writable index (in memory, or read-only).
        """
        from heedrank.errors import IndexMismatchError

        index = self.index
        if index is None or not hasattr(index, "delete_documents"):
            raise IndexMismatchError("this collection is not backed by an index directory and cannot be updated; "
                                     "serve an index built by `heedrank index build`")
        wanted = list(dict.fromkeys(doc_ids))
        before = self.docstore.get_many(wanted)  # the texts give the block keys
        result = dict(index.delete_documents(wanted))
        result["blocks_dropped"] = self.blocks.after_delete([before[d] for d in result["deleted"] if d in before])
        return result

    # -- search ----------------------------------------------------------------------
    def first_stage_rows(self, queries: Sequence[Query], options: SearchOptions) -> Iterator[FirstStageRow]:
        """The first stage of a search: every query retrieved at once, then each query's top
        ``k1`` hits hydrated from the document store as the iterator reaches it.

        ``k1`` is ``max(top_k, candidates)`` when reranking, else ``top_k``. The one copy of
        this step: :meth:`search_batch` reranks each row here, and the Ray engine ships the
        rows to its actors (:mod:`heedrank.engine.ray`).

        Args:
            queries: Queries with text (see :func:`check_query_texts`).
            options: Options checked by :meth:`validate` (the filter parsed).

        Returns:
            One :class:`FirstStageRow` per query, in query order. Retrieval has run when this
            returns; hydration runs per row.

        Raises:
            Whatever the retriever raises (e.g. ValidationError: a filter it cannot apply).
        """
        k1 = max(options.top_k, options.candidates) if options.rerank != NO_RERANK else options.top_k
        t0 = time.perf_counter()
        first = self.retrievers[options.retriever].retrieve(queries, k1, filter=options.filter)
        t_retrieve = (time.perf_counter() - t0) / max(1, len(queries))
        return self._hydrated_rows(queries, first, k1, t_retrieve)

    def _hydrated_rows(self, queries: Sequence[Query], first: Sequence[Ranking], k1: int,
                       t_retrieve: float) -> Iterator[FirstStageRow]:
        for q, ranking in zip(queries, first):
            t1 = time.perf_counter()
            top = ranking.top(k1)
            docs = self.docstore.get_many(top.doc_ids)
            hydrated = top.with_documents(docs)
            if len(hydrated) < len(top):
                logger.warning("query %s: %d hits missing from the document store", q.query_id,
                               len(top) - len(hydrated))
            yield FirstStageRow(q, ranking, top, docs, hydrated, t_retrieve, time.perf_counter() - t1)

    def search(self, query: Query | str, options: SearchOptions = SearchOptions()) -> SearchResult:
        """Search one query. See :meth:`search_batch`."""
        q = query if isinstance(query, Query) else Query("q", query)
        return self.search_batch([q], options)[0]

    def search_batch(
        self, queries: Sequence[Query], options: SearchOptions = SearchOptions(), *, show_progress: bool = False
    ) -> list[SearchResult]:
        """Search a batch of queries with the same options.

        Raises:
            ValidationError: empty query text; invalid options (see :meth:`validate`);
                ``explain`` with a reranker that cannot explain.
            UnknownNameError: unknown retriever or reranker.
            FilterError: an invalid metadata filter.
            ContextOverflowError: the reranking prompt does not fit the model's context.
        """
        options = self.validate(options)
        check_query_texts(queries)
        # the reranker, looked up once (built, and failing, before retrieval)
        stage = self._stage(options) if options.rerank != NO_RERANK else None
        doc_tokens = serving_of(stage.reranker).max_doc_tokens if stage is not None else None
        results = []
        iterator: Any = self.first_stage_rows(queries, options)
        if show_progress:
            from heedrank.progress import track

            iterator = track(iterator, total=len(queries), desc=f"search ({options.rerank})", unit="query", log=logger)
        for row in iterator:
            hydrated, done = row.hydrated, None
            if stage is not None and len(hydrated):
                done = stage.serve(row.query, hydrated.top(options.candidates))
            t_rerank = done.seconds if done is not None else 0.0
            timings = {"retrieve": row.retrieve_seconds, "hydrate": row.hydrate_seconds, "rerank": t_rerank,
                       "total": row.retrieve_seconds + row.hydrate_seconds + t_rerank}
            if done is None:
                results.append(SearchResult(query=row.query, ranking=hydrated.top(options.top_k),
                                            first_stage=row.ranking, timings=timings, missing=row.missing))
                continue
            served = done.served
            results.append(SearchResult(
                query=row.query, ranking=merge_served(hydrated, served, options.top_k), first_stage=row.ranking,
                timings=timings, rerank=done.reranked.result, fusion=done.policy.alpha,
                probabilities=served.probabilities, cutoff=served.threshold, missing=row.missing,
                relevance=served.relevance, skipped=done.reranked.skipped, doc_tokens=doc_tokens,
                warnings=tuple(served.warnings)))
        return results

    def rerank_documents(self, query: Query, candidates: Ranking, options: SearchOptions = SearchOptions(), *,
                         max_doc_tokens: int | None = None, by: str = "score", scale: float | None = None,
                         use_store: bool = True, share_texts: bool = False) -> RerankedQuery:
        """Rerank and serve one query's given candidates: the step :meth:`search_batch` takes
        after the first stage, for ``/rerank`` (documents in the request) and ``rerank-batch``'s
        isolation of a failing query (:mod:`heedrank.eval.batch`).

        Args:
            query: The query (with text).
            candidates: The candidates in first-stage (given) order, hydrated, with their
                first-stage scores (``by="score"`` fuses them; ``/rerank`` gives ``1 / (1 + i)``).
            options: ``rerank`` (the method), ``rerank_options``, ``fusion``, ``cutoff``,
                ``explain``, ``evidence_spans``, ``cold_budget``; checked by :meth:`check_rerank`.
            max_doc_tokens: The reranker's document budget (``None``: the configured one).
            by: :data:`heedrank.serving.BY`: how the given order counts (``"prior"``: ``/rerank``'s
                position prior, :class:`heedrank.serving.PositionPrior`).
            scale: Override of the reranker's ``score_scale`` (:meth:`heedrank.serving.ServePolicy.of`).
            use_store: Read (and fill) this pipeline's index's document KV store; ``/rerank``'s
                documents are not the collection's, so it passes ``False``.
            share_texts: Identical texts share one served score and relevance
                (:func:`heedrank.serving.share_identical`; ``/rerank``).

        Returns:
            The :class:`~heedrank.results.RerankedQuery`; its ``served.relevance`` is
            non-increasing down ``served.ranking``.

        Raises:
            ValidationError, UnknownNameError: see :meth:`check_rerank`, :meth:`heedrank.serving.ServePolicy.of`.
            ContextOverflowError: the candidates do not fit the model's context.
        """
        if by not in BY:
            raise ValidationError(f"by must be one of {BY}, got {by!r}")
        options = self.check_rerank(options)
        stage = self._stage(options, max_doc_tokens=max_doc_tokens, by=by, scale=scale)
        done = stage.serve(query, candidates, use_store=use_store)
        if not share_texts:
            return done
        texts = {h.doc_id: h.document.content if h.document else h.doc_id for h in candidates.hits}
        return replace(done, served=share_identical(done.served, texts))

    def serve_without_lm(self, query: Query, candidates: Ranking, options: SearchOptions = SearchOptions(), *,
                         by: str = "score", use_store: bool = True) -> Served | None:
        """The candidates served by the default's scorer from the signals at hand, without an LM
        pass (:class:`heedrank.serving.ScorerServing` with no attention): for a request
        the deadline or the per-request budget stopped. Real probabilities, not invented ones.

        Args:
            query: The query (with text).
            candidates: The candidates in first-stage (given) order, hydrated.
            options: ``rerank`` (the method, built already) and ``cutoff``.
            by: :data:`heedrank.serving.BY` (``"prior"``: ``/rerank``'s given order is not a signal).
            use_store: The documents are the index's (their stored vectors are read).

        Returns:
            The :class:`~heedrank.serving.Served` query, or ``None`` when the method has no scorer
            or this pipeline no dense signal.
        """
        options = self.check_rerank(options)
        stage = self._stage(options, by=by, check_explain=False)
        return stage.serve_without_lm(query, candidates, use_store=use_store)


@dataclass(frozen=True)
class RegistryRerankerFactory:
    """A :data:`RerankerFactory` building registered rerankers from a base
    :class:`~heedrank.config.RerankerConfig`: the method replaced, ``options`` merged over the
    base options (only for the base's own method: options are typed per method),
    ``max_doc_tokens`` replaced when given. It knows the methods it can build
    (:meth:`methods`), so :meth:`Pipeline.validate` can refuse an unknown one up front."""

    base: Any
    block_cache_bytes: int | None = None
    """RAM tier of a cached reranker's blocks outside a store, bytes (``None``: the library
    default, :data:`heedrank.config.BLOCK_CACHE_BUDGET`)."""
    passes: int | None = None
    """Query passes a reranker that can run several at once does (``None``: 1; the service's
    rerank ``workers``)."""

    def __call__(
        self, method: str, options: Mapping[str, Any] | None = None, max_doc_tokens: int | None = None
    ) -> Reranker:
        from heedrank import registry

        # The base options are the base method's (typed per method: another method would refuse them).
        method = registry.resolve_method(method)
        if method != self.base.method:
            config = replace(self.base, method=method, options=dict(options or {}))
        elif options:
            config = self.base.with_options(**options)
        else:
            config = self.base
        if max_doc_tokens is not None:
            config = replace(config, max_doc_tokens=max_doc_tokens)
        return registry.build_reranker(config, block_cache_bytes=self.block_cache_bytes, passes=self.passes)

    @staticmethod
    def methods() -> list[str]:
        """The registered reranker names."""
        from heedrank import registry

        return registry.reranker_names()


def reranker_factory(base: Any, *, block_cache_bytes: int | None = None, passes: int | None = None) -> RerankerFactory:
    """A :class:`RegistryRerankerFactory` over a base :class:`~heedrank.config.RerankerConfig`
    (``block_cache_bytes``, ``passes``: see :class:`RegistryRerankerFactory`)."""
    return RegistryRerankerFactory(base, block_cache_bytes, passes)

"""``POST /search``: retrieve, optionally rerank, return the top-k documents."""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from fastapi import APIRouter, Request

from heedrank import registry
from heedrank.api.costs import fits_its_deadline
from heedrank.api.deadline import RequestDeadline, request_deadline
from heedrank.api.deps import ReadyRuntimeDep, SettingsDep
from heedrank.api.inference import DeadlineExceeded
from heedrank.api.schemas import (
    ErrorBody,
    Evidence,
    Hit,
    RerankInfo,
    SearchRequest,
    SearchResponse,
    Timings,
)
from heedrank.capabilities import reads_stored_blocks
from heedrank.errors import OverloadedError
from heedrank.pipeline import NO_RERANK, Pipeline, SearchOptions, SearchResult
from heedrank.protocols import RerankResult
from heedrank.results import merge_served
from heedrank.settings import Settings
from heedrank.types import Query, Ranking

router = APIRouter(tags=["search"])
logger = logging.getLogger(__name__)

_ERRORS: dict[int | str, dict[str, Any]] = {  # FastAPI's `responses` type
    401: {"model": ErrorBody, "description": "Missing or wrong API key (when the service has one)."},
    404: {"model": ErrorBody, "description": "Unknown collection, index or document not found."},
    422: {"model": ErrorBody, "description": "Invalid request (empty query, top_k out of range, unknown name, "
          "malformed metadata filter...)."},
    413: {"model": ErrorBody, "description": "Request body over the size limit."},
    429: {"model": ErrorBody, "description": "Inference queue full (overloaded); retry after Retry-After seconds."},
    500: {"model": ErrorBody, "description": "Internal error."},
    503: {"model": ErrorBody, "description": "Models still loading (unhealthy) or reranker model unavailable."},
}


def search_options(body: SearchRequest, settings: Settings, pipeline: Pipeline) -> SearchOptions:
    """The pipeline options of a request: the service's defaults filled in (rerank method,
    candidates, evidence spans), then checked, and the filter parsed, by
    :meth:`heedrank.pipeline.Pipeline.validate`, the one owner of these checks (the library
    gives the same messages).

    Raises:
        ValidationError: ``top_k`` or ``candidates`` outside the pipeline's limits;
            ``heads``/``reattn`` with another method than icr or blockrank; ``explain``
            without reranking.
        UnknownNameError: unknown retriever or rerank method.
        FilterError: an invalid metadata filter (422; the message names the clause).
    """
    asked = body.rerank  # None: false or null, the first stage alone
    if asked is None:
        method, candidates, rerank_options = NO_RERANK, settings.default_candidates, {}
    else:
        method = asked.method or settings.rerank_method
        candidates = asked.candidates or settings.default_candidates
        rerank_options = asked.reranker_options()
    retriever = body.retriever
    if retriever is None:
        retriever = settings.default_retriever if settings.default_retriever in pipeline.retrievers else "bm25"
    return pipeline.validate(SearchOptions(
        top_k=body.top_k, retriever=retriever, rerank=method, candidates=candidates, filter=body.filter,
        rerank_options=rerank_options or None, explain=body.explain, evidence_spans=settings.evidence_spans,
        fusion=_fusion(asked.fusion) if asked is not None else None,
        cutoff=asked.cutoff if asked is not None else None,
        cold_budget=_cold_budget(asked.cold_budget if asked is not None else None, settings),
    ))


def _cold_budget(value: int | str | None, settings: Settings) -> int | None:
    """A request's ``rerank.cold_budget`` as the pipeline takes it: omitted = the service's,
    ``"unlimited"`` = none."""
    if value is None:
        return settings.cold_budget
    return None if value == "unlimited" else int(value)


def _fusion(value: float | str | None) -> float | str | None:
    """A request's ``rerank.fusion`` as the pipeline takes it (``"none"`` = ``None``)."""
    return None if value == "none" else value


def to_response(result: SearchResult, method: str, queue_seconds: float = 0.0) -> SearchResponse:
    """The response body of a pipeline result.

    Args:
        result: The pipeline's result.
        method: ``rerank.method``: the registered method that reranked, an alias such as
            ``"default"`` already resolved (:func:`heedrank.registry.resolve_method`, once per
            request by the route; as ``POST /rerank``'s ``meta.method``).
        queue_seconds: Seconds the request waited for a worker (``timings.queue``).
    """
    rr = result.rerank
    evidence = rr.evidence if rr is not None else None
    first_rank = {h.doc_id: i for i, h in enumerate(result.first_stage.hits, 1)}
    scored = None if rr is None else set(rr.ranking.doc_ids)
    relevance = result.relevance or {}
    hits = [
        Hit(
            doc_id=h.doc_id,
            score=h.score if scored is None else relevance.get(h.doc_id),
            raw_score=h.score,
            rank=i,
            title=h.document.title if h.document else "",
            text=h.document.text if h.document else "",
            metadata=dict(h.document.metadata) if h.document else {},
            evidence=(
                [Evidence(field=e.field, start=e.start, end=e.end, text=e.text, score=e.score)
                 for e in evidence[h.doc_id]]
                if evidence is not None and h.doc_id in evidence else None
            ),
            first_stage_rank=first_rank.get(h.doc_id),
            reranked=None if scored is None else h.doc_id in scored,
        )
        for i, h in enumerate(result.ranking.hits, 1)
    ]
    info = None
    if rr is not None:
        skipped = len(result.skipped)
        info = RerankInfo(method=method, candidates=len(rr.ranking) + skipped,
                          reranked=len(rr.ranking),
                          skipped_cold=skipped, truncated=len(rr.truncated), doc_tokens=result.doc_tokens,
                          prompt_tokens=int(rr.prompt_tokens), warnings=[*rr.warnings, *result.warnings],
                          cache=dict(rr.cache) if rr.cache is not None else None, fusion=result.fusion, cutoff=result.cutoff,
                          calibrated=result.probabilities is not None)
    timings = Timings(**{k: float(result.timings.get(k, 0.0)) for k in ("retrieve", "hydrate", "rerank", "total")},
                      queue=queue_seconds)
    return SearchResponse(results=hits, timings=timings, rerank=info)


async def first_stage_fallback(runtime: Any, pipeline: Pipeline, text: str, options: SearchOptions, method: str,
                               budget: float, deadline: RequestDeadline, is_disconnected: Any,
                               reason: str = "timeout") -> SearchResponse:
    """The answer of a reranking search the per-request budget (``Settings.request_budget_s``)
    stopped (``reason="timeout"``) or never started (``"estimate"``: it would not have ended in
    time, :class:`heedrank.api.inference.DeadlineExceeded`): the same search without reranking,
    then its results scored by the default's scorer from the signals at hand, without the LM
    (:meth:`heedrank.pipeline.Pipeline.serve_without_lm`), both in the bounded ``search`` pool
    until :meth:`~heedrank.api.deadline.RequestDeadline.fallback_end`. Its ``rerank`` says that no
    candidate was reranked (by ``method``, the registered method the request asked for) and why.
    When the scoring cannot run by then (that queue full, the time gone) or the method has no
    scorer, the results keep their first-stage places.

    Args:
        budget: The per-request budget, seconds (for the warning).
        deadline: The request's deadline (its arrival and end, ``time.perf_counter`` seconds).

    Raises:
        OverloadedError: the first stage itself could not run: the ``search`` queue is full, or
            busy past the fallback's end.
        ClientGoneError: the client went away.
    """
    started = time.perf_counter()
    pool, until = runtime.pools["search"], deadline.fallback_end()
    plain = dataclasses.replace(options, rerank=NO_RERANK, explain=False, fusion=None, cutoff=None,
                                rerank_options=None)
    try:
        result = await pool.run(pipeline.search, Query("api", text), plain, units=1, deadline=until,
                                is_disconnected=is_disconnected)
    except DeadlineExceeded:
        raise OverloadedError(
            f"the reranking did not fit the service's per-request budget of {budget:g} s (HEEDRANK_REQUEST_BUDGET_S) "
            "and the search queue could not run the first stage in time either; retry later") from None
    served = None
    if len(result.ranking):  # the default's scorer from the signals at hand (the embedder, the rank): no LM pass
        try:
            served = await pool.run(pipeline.serve_without_lm, Query("api", text), result.ranking, options, units=1,
                                    deadline=until, is_disconnected=is_disconnected)
        except (OverloadedError, DeadlineExceeded):  # the answer is late already: the first stage's order
            served = None
    n = min(options.candidates, len(result.first_stage))
    runtime.fallback_costs.observe("search", time.perf_counter() - started, n)
    waited = deadline.elapsed()
    runtime.metrics.deadline_fallbacks.labels("budget").inc()
    limit = (f"the service's per-request budget is {budget:g} s from the request's arrival, its wait for a worker "
             "included, HEEDRANK_REQUEST_BUDGET_S")
    message = (f"reranking stopped after {waited:.1f} s ({limit}): " if reason == "timeout" else
               f"reranking skipped after {waited:.1f} s, as it would not have ended in time ({limit}): ") + (
                   "every candidate kept its first-stage place" if served is None else
                   "the results were scored without the LM, by the default's scorer from the embedder's cosine "
                   "and the first-stage rank")
    logger.warning("search: %s", message)
    if served is not None:
        result = dataclasses.replace(result, ranking=merge_served(result.ranking, served, options.top_k),
                                     rerank=RerankResult(Ranking(result.ranking.query_id, ())),
                                     probabilities=served.probabilities, relevance=served.relevance)
    response = to_response(result, method, max(0.0, waited - float(result.timings.get("total", 0.0))))
    response.rerank = RerankInfo(method=method, candidates=n, reranked=0, truncated=0,
                                 prompt_tokens=0, warnings=[message])
    return response


@router.post("/search", response_model=SearchResponse, responses=_ERRORS, summary="Search a collection")
async def search(
    body: SearchRequest, request: Request, runtime: ReadyRuntimeDep, settings: SettingsDep
) -> SearchResponse:
    """Retrieve the top ``top_k`` documents of ``collection`` for ``query``; with
    ``rerank``, the top ``candidates`` first-stage hits are reordered by the reranker
    (``heads``/``reattn`` select ICR variants); with ``explain``, reranked results carry
    their evidence spans.

    The pipeline runs in a bounded worker pool, never on the event loop: first-stage-only
    searches in the ``search`` pool, reranking searches in the ``rerank`` pool (one model
    instance). A full queue answers 429 ``overloaded`` at once. Errors use the
    ``{error, error_type}`` body.
    """
    pipeline = runtime.pipeline(body.collection)
    options = search_options(body, settings, pipeline)
    reranking = options.rerank != NO_RERANK
    method = registry.resolve_method(options.rerank)  # once per request (an alias such as "default" resolved)
    pool = runtime.pools["rerank" if reranking else "search"]
    t0 = time.perf_counter()
    budget = settings.request_budget_s if reranking else None
    deadline = request_deadline(request.scope, budget)  # from the request's arrival, its wait for a worker included
    cost_key = method_cost_key(method, options) if reranking else ""
    reserve = runtime.fallback_costs.reserve("search", options.candidates) if budget is not None else 0.0
    spent = False  # the request's time ran out while its method was timed: it takes the budget's path
    if reranking and budget is not None:
        if settings.warmup and not runtime.costs.known(cost_key):  # timed once, before its first search runs
            spent = await measure_first_build(runtime, pipeline, method, options, deadline.work_end(reserve),
                                              request.is_disconnected)
    built = built_reranker(pipeline, method, options) if reranking else None
    if reranking and budget is not None and not spent:
        refuse_over_budget(runtime.costs, cost_key, options, budget, built)
    elastic = reranking and fits_its_deadline(registry.reranker_class(method), built, fusion=options.fusion,
                                              cutoff=options.cutoff)
    try:
        result = await pool.run(pipeline.search, Query("api", body.query), options, units=options.candidates if
                                reranking else 1, deadline=deadline.work_end(reserve),
                                is_disconnected=request.is_disconnected, elastic=elastic)
    except DeadlineExceeded as exc:  # stopped, or never started: the first stage's order, scored without the LM
        assert budget is not None  # only a reranking search has a deadline
        if exc.ran > 0:  # a method reading stored blocks may have spent its time encoding: a bound of its cold figure
            stored = reads_stored_blocks(registry.reranker_class(method))
            runtime.costs.stopped(cost_key, exc.ran, options.candidates, cold=options.candidates if stored else None)
        return await first_stage_fallback(runtime, pipeline, body.query, options, method, budget, deadline,
                                          request.is_disconnected, exc.reason)
    queue_seconds = max(0.0, time.perf_counter() - t0 - float(result.timings.get("total", 0.0)))
    runtime.metrics.observe_timings(result.timings)
    if result.rerank is not None:
        runtime.metrics.observe_block_cache(result.rerank.cache)
        cache = result.rerank.cache  # None: a method that stores no blocks; else its misses were encoded now
        runtime.costs.observe(cost_key, float(result.timings.get("rerank", 0.0)), len(result.rerank.ranking),
                              cold=None if cache is None else int(cache.get("misses", 0)))
    return to_response(result, method, queue_seconds)


def method_cost_key(method: str, options: SearchOptions) -> str:
    """The name a reranking's cost is learned under: ``method`` (the registered method, resolved
    by the route), with the request's ``options.rerank_options`` when it has some (another
    ``windows`` or ``heads`` costs differently)."""
    import json

    return method if not options.rerank_options else f"{method} {json.dumps(options.rerank_options, sort_keys=True)}"


def built_reranker(pipeline: Pipeline, method: str, options: SearchOptions) -> Any:
    """The reranker a search with ``options`` runs (``method``, resolved, with its
    ``rerank_options``) when it is built already, else ``None``; never builds one."""
    from heedrank.pipeline import options_key

    if pipeline.rerankers is None:
        return None
    name = method + (options_key(options.rerank_options) if options.rerank_options else "")
    return pipeline.rerankers.loaded().get(name)


async def measure_first_build(runtime: Any, pipeline: Pipeline, method: str, options: SearchOptions,
                              until: float | None, is_disconnected: Any) -> bool:
    """Time a method (with the search's options) this service has no cost figure of yet, the
    first time a search asks for it: build its reranker and time it cold and warm
    (:func:`heedrank.api.costs.measure`, about ``2 * COST_DOCUMENTS`` candidates' time), in the
    ``rerank`` pool within the request's time (``until``, perf_counter seconds), and seed
    :attr:`heedrank.api.runtime.Runtime.costs`, so that this very request is refused at once
    when it cannot fit (:func:`refuse_over_budget`) instead of reranking nothing after the whole
    budget. Not timed: a request served by the default's scorer, which answers in part
    (:func:`heedrank.api.costs.serves_in_part`); a method another request is timing now.
    When the time runs out first, the seconds its passes ran over their documents are a lower
    bound of the method's cost (:meth:`heedrank.api.costs.MethodCosts.stopped`).

    Returns:
        Whether ``until`` passed while it timed (or waited to): the request's time is spent,
        and it takes the budget's path, not a refusal.

    Raises:
        UnknownNameError, ValidationError, ModelLoadError: building the reranker failed
            (:meth:`heedrank.pipeline.RerankerCache.get`), as the search itself would.
        OverloadedError: the ``rerank`` queue is full.
        ClientGoneError: the client went away.
    """
    from heedrank.api.costs import COST_DOCUMENTS, measure, serves_in_part

    built = built_reranker(pipeline, method, options)
    if built is not None and serves_in_part(built, fusion=options.fusion, cutoff=options.cutoff):
        return False
    key = method_cost_key(method, options)
    if pipeline.rerankers is None or not runtime.costs.claim_probe(key):
        return False
    cache = pipeline.rerankers
    timing: list[float] = []  # when the timed passes began (building the reranker is no cost per candidate)

    def probe() -> None:
        reranker = cache.get(method, options.rerank_options)[0]
        if serves_in_part(reranker, fusion=options.fusion, cutoff=options.cutoff):
            return
        timing.append(time.perf_counter())
        warm, cold = measure(lambda q, d: cache.rerank(q, d, method, options.rerank_options).result,
                             stored_blocks=reads_stored_blocks(reranker))
        runtime.costs.seed(key, warm, cold)
        logger.info("rerank method %r costs %s s per candidate warm, %s s cold (timed at its first search)", key,
                    "?" if warm is None else f"{warm:.3f}", "?" if cold is None else f"{cold:.3f}")

    try:
        await runtime.pools["rerank"].run(probe, units=COST_DOCUMENTS + 1, deadline=until,
                                          is_disconnected=is_disconnected)
    except DeadlineExceeded:  # stopped: it read at most its documents in the time its passes ran
        if timing:
            stored = reads_stored_blocks(built_reranker(pipeline, method, options))
            read = (2 if stored else 1) * COST_DOCUMENTS + 1
            runtime.costs.stopped(key, time.perf_counter() - timing[0], read, cold=read if stored else None)
        return True
    finally:
        runtime.costs.release_probe(key)
    return False


def refuse_over_budget(costs: Any, key: str, options: SearchOptions, budget: float | None, reranker: Any) -> None:
    """Refuse up front (422) a reranking of more candidates than the method, as measured on this
    service (:class:`heedrank.api.costs.MethodCosts`, its warm figure: the document KV store
    fills, and cold candidates are bounded by the recompute budget), reranks within the
    per-request budget; unless ``reranker`` (the built one, ``None``: not built) serves the
    request by the default's scorer, which reads as many candidates as fit and scores the rest
    (:func:`heedrank.api.costs.serves_in_part`), or is not built (nothing to tell by).

    Raises:
        ValidationError: ``options.candidates`` over :meth:`~heedrank.api.costs.MethodCosts.max_candidates`.
    """
    from heedrank.api.costs import WARM, serves_in_part
    from heedrank.errors import ValidationError

    most = costs.max_candidates(key, budget, WARM)
    if most is None or options.candidates <= most or reranker is None:
        return
    if serves_in_part(reranker, fusion=options.fusion, cutoff=options.cutoff):
        return
    method = key.split(" ", 1)[0]  # the registered method: its entry in GET /info
    raise ValidationError(
        f"rerank method {key!r} reranks about {most} candidates within this service's per-request budget of "
        f"{budget:g} s (measured here: {costs.seconds_per_candidate(key, WARM):.2f} s per candidate; GET /info: "
        f"reranker.limits.{method}.max_candidates_in_budget.warm); ask for at most {most} (rerank.candidates), "
        "choose a faster method, or raise HEEDRANK_REQUEST_BUDGET_S")

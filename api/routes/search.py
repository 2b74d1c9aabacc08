"""``POST /search``: retrieve, optionally rerank, return the top-k documents."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request

from api.deps import ReadyRuntimeDep, SettingsDep
from api.schemas import Evidence, ErrorBody, Hit, RerankInfo, SearchRequest, SearchResponse, Timings
from attnrank.errors import UnknownNameError, ValidationError
from attnrank.pipeline import NO_RERANK, Pipeline, SearchOptions, SearchResult
from attnrank.settings import Settings
from attnrank.types import Query

router = APIRouter(tags=["search"])

_ERRORS = {
    401: {"model": ErrorBody, "description": "Missing or wrong API key (when the service has one)."},
    404: {"model": ErrorBody, "description": "Unknown collection, index or document not found."},
    422: {"model": ErrorBody, "description": "Invalid request (empty query, top_k out of range, unknown name, "
          "malformed metadata filter...)."},
    413: {"model": ErrorBody, "description": "Request body over the size limit."},
    429: {"model": ErrorBody, "description": "Inference queue full (overloaded); retry after Retry-After seconds."},
    500: {"model": ErrorBody, "description": "Internal error."},
    503: {"model": ErrorBody, "description": "Models still loading (unhealthy) or reranker model unavailable."},
}

HEAD_OPTION_METHODS = ("icr", "blockrank")
"""Rerankers that take the ``heads`` and ``reattn`` options."""


def search_options(body: SearchRequest, settings: Settings, pipeline: Pipeline) -> SearchOptions:
    """Resolve the request's defaults against the settings and check it.

    Raises:
        ValidationError: ``top_k`` or ``candidates`` above the service limits.
        UnknownNameError: unknown retriever or rerank method.
        ValidationError: ``heads``/``reattn`` with another method than icr or blockrank;
            ``explain`` without reranking.
        FilterError: an invalid metadata filter (422; the message names the clause).
    """
    from attnrank import registry
    from index.filters import parse_filter

    parse_filter(body.filter)  # fail fast, before any retrieval

    if body.rerank is None:
        method, candidates = NO_RERANK, settings.default_candidates
    else:
        method = body.rerank.method or settings.rerank_method
        candidates = body.rerank.candidates or settings.default_candidates
    if body.top_k > settings.max_top_k:
        raise ValidationError(f"top_k must be between 1 and {settings.max_top_k}, got {body.top_k}")
    if method != NO_RERANK:
        built = pipeline.rerankers.methods() if pipeline.rerankers is not None else set()
        known = sorted(set(registry.reranker_names()) | built)
        if method not in known:
            raise UnknownNameError(f"unknown rerank method {method!r}; choose one of {[NO_RERANK, *known]}")
        if candidates > settings.max_candidates:
            raise ValidationError(
                f"rerank.candidates must be between 1 and {settings.max_candidates}, got {candidates}"
            )
    rerank_options = body.rerank.reranker_options() if body.rerank is not None else {}
    if rerank_options and method not in HEAD_OPTION_METHODS:
        raise ValidationError(
            f"rerank.{'/'.join(rerank_options)} are options of the {' and '.join(HEAD_OPTION_METHODS)} rerankers, "
            f"not of {method!r}"
        )
    if body.explain and method == NO_RERANK:
        raise ValidationError("explain needs reranking (evidence comes from the reranker's attention); add rerank")
    options = SearchOptions(
        top_k=body.top_k, retriever=body.retriever, rerank=method, candidates=candidates, filter=body.filter,
        rerank_options=rerank_options or None, explain=body.explain, evidence_spans=settings.evidence_spans,
    )
    pipeline.validate(options)
    return options


def to_response(result: SearchResult, method: str, queue_seconds: float = 0.0) -> SearchResponse:
    """The response body of a pipeline result."""
    rr = result.rerank
    evidence = rr.details.get("evidence") if rr is not None else None
    hits = [
        Hit(
            doc_id=h.doc_id,
            score=h.score,
            rank=i,
            title=h.document.title if h.document else "",
            text=h.document.text if h.document else "",
            metadata=dict(h.document.metadata) if h.document else {},
            evidence=(
                [Evidence(field=e.field, start=e.start, end=e.end, text=e.text, score=e.score)
                 for e in evidence[h.doc_id]]
                if evidence is not None and h.doc_id in evidence else None
            ),
        )
        for i, h in enumerate(result.ranking.hits, 1)
    ]
    info = None
    if rr is not None:
        info = RerankInfo(method=method, candidates=len(rr.ranking), truncated=list(rr.truncated),
                          prompt_tokens=int(rr.prompt_tokens))
    timings = Timings(**{k: float(result.timings.get(k, 0.0)) for k in ("retrieve", "hydrate", "rerank", "total")},
                      queue=queue_seconds)
    return SearchResponse(results=hits, timings=timings, rerank=info)


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
    pool = runtime.pools["rerank" if reranking else "search"]
    t0 = time.perf_counter()
    result = await pool.run(pipeline.search, Query("api", body.query), options,
                            units=options.candidates if reranking else 1, is_disconnected=request.is_disconnected)
    queue_seconds = max(0.0, time.perf_counter() - t0 - float(result.timings.get("total", 0.0)))
    runtime.metrics.observe_timings(result.timings)
    return to_response(result, options.rerank, queue_seconds)

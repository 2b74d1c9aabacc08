"""``POST /search``: retrieve, optionally rerank, return the top-k documents."""

from __future__ import annotations

import anyio
from fastapi import APIRouter

from api.deps import LimiterDep, PipelineDep, SettingsDep
from api.schemas import ErrorBody, Hit, RerankInfo, SearchRequest, SearchResponse, Timings
from attnrank.errors import UnknownNameError, ValidationError
from attnrank.pipeline import NO_RERANK, Pipeline, SearchOptions, SearchResult
from attnrank.settings import Settings
from attnrank.types import Query

router = APIRouter(tags=["search"])

_ERRORS = {
    404: {"model": ErrorBody, "description": "Index or document not found."},
    422: {"model": ErrorBody, "description": "Invalid request (empty query, top_k out of range, unknown name...)."},
    500: {"model": ErrorBody, "description": "Internal error."},
    503: {"model": ErrorBody, "description": "Reranker model unavailable."},
}


def search_options(body: SearchRequest, settings: Settings, pipeline: Pipeline) -> SearchOptions:
    """Resolve the request's defaults against the settings and check it.

    Raises:
        ValidationError: ``top_k`` or ``candidates`` above the service limits.
        UnknownNameError: unknown retriever or rerank method.
    """
    from attnrank import registry

    if body.rerank is None:
        method, candidates = NO_RERANK, settings.default_candidates
    else:
        method = body.rerank.method or settings.rerank_method
        candidates = body.rerank.candidates or settings.default_candidates
    if body.top_k > settings.max_top_k:
        raise ValidationError(f"top_k must be between 1 and {settings.max_top_k}, got {body.top_k}")
    if method != NO_RERANK:
        known = sorted(set(registry.reranker_names()) | set(pipeline.loaded_rerankers()))
        if method not in known:
            raise UnknownNameError(f"unknown rerank method {method!r}; choose one of {[NO_RERANK, *known]}")
        if candidates > settings.max_candidates:
            raise ValidationError(
                f"rerank.candidates must be between 1 and {settings.max_candidates}, got {candidates}"
            )
    options = SearchOptions(top_k=body.top_k, retriever=body.retriever, rerank=method, candidates=candidates)
    pipeline.validate(options)
    return options


def to_response(result: SearchResult, method: str) -> SearchResponse:
    """The response body of a pipeline result."""
    hits = [
        Hit(
            doc_id=h.doc_id,
            score=h.score,
            rank=i,
            title=h.document.title if h.document else "",
            text=h.document.text if h.document else "",
        )
        for i, h in enumerate(result.ranking.hits, 1)
    ]
    rr = result.rerank
    info = None
    if rr is not None:
        info = RerankInfo(method=method, candidates=len(rr.ranking), truncated=list(rr.truncated),
                          prompt_tokens=int(rr.prompt_tokens))
    timings = Timings(**{k: float(result.timings.get(k, 0.0)) for k in ("retrieve", "hydrate", "rerank", "total")})
    return SearchResponse(results=hits, timings=timings, rerank=info)


@router.post("/search", response_model=SearchResponse, responses=_ERRORS, summary="Search the index")
async def search(body: SearchRequest, pipeline: PipelineDep, settings: SettingsDep, limiter: LimiterDep) -> SearchResponse:
    """Retrieve the top ``top_k`` documents for ``query``; with ``rerank``, the top
    ``candidates`` first-stage hits are reordered by the reranker.

    The pipeline runs in a worker thread (at most ``ATTNRANK_WORKERS`` at once), never on
    the event loop. Errors use the ``{error, error_type}`` body.
    """
    options = search_options(body, settings, pipeline)
    result = await anyio.to_thread.run_sync(pipeline.search, Query("api", body.query), options, limiter=limiter)
    return to_response(result, options.rerank)

"""``POST /rerank``: Cohere v2 compatible reranking of the documents in the request.

Request: ``{model?, query, documents: [str | {text}], top_n?, max_tokens_per_doc?,
return_documents?, deadline_ms?}``; response: ``{id, results: [{index, relevance_score,
raw_score, document?}], meta}`` with results best first (see
:class:`heedrank.api.schemas.CohereRerankResponse`).

Cohere's clients: the same route answers at ``/v2/rerank`` (``cohere.ClientV2``) and
``/v1/rerank`` (``cohere.Client``, the v1 request with ``return_documents`` and
``rank_fields``), the paths Cohere's SDK posts to, so the SDK and the LangChain and
LlamaIndex Cohere rerankers can be pointed at this service with ``base_url``. Their
required ``model`` is served by the service's one method whatever it names: the ids clients send
(``rerank-v3.5``, ``rerank-english-v3.0``, ... :data:`heedrank.api.runtime.CLIENT_MODEL_IDS`)
silently, any other id with a warning; ``meta.method`` and ``meta.model`` say what answered. ``relevance_score`` lies in [0, 1],
where Cohere's does and where users set thresholds (:meth:`heedrank.serving.ServePolicy.relevance`); the
reranker's own score is ``raw_score``.

With ``deadline_ms``, a request whose reranking would finish too late (estimated from
the running mean of seconds per document and the work queued ahead, or noticed when the
deadline passes, or the queue is full) is answered in the given (first-stage) order with
``meta.reranked = false`` and ``meta.deadline_exceeded = true``.

Long documents are ranked on their beginning, as Cohere's endpoint does: each is first cut
to :data:`CHARS_PER_TOKEN` characters per token of the budget (``max_tokens_per_doc``, at
most the service's ``max_doc_tokens``), cheaply and generously, then the reranker's
tokenizer cuts it to the budget. Cut documents are counted in ``meta.truncated`` and named
in ``meta.warnings``. Only the body size (``max_body_bytes``) bounds a document's length.
"""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from typing import Any

from fastapi import APIRouter, Request
from starlette.concurrency import run_in_threadpool

from heedrank import registry
from heedrank.api.deps import ReadyRuntimeDep, SettingsDep
from heedrank.api.runtime import Runtime, lm_name, resolve_model
from heedrank.api.schemas import (
    ApiVersion,
    CohereRerankMeta,
    CohereRerankRequest,
    CohereRerankResponse,
    CohereRerankResult,
    ErrorBody,
    RerankedDocument,
    TokenCounts,
)
from heedrank.errors import ModelLoadError, OverloadedError, PayloadTooLargeError, ValidationError
from heedrank.pipeline import NO_RERANK, Pipeline, RerankedQuery, SearchOptions
from heedrank.serving import Served
from heedrank.settings import Settings
from heedrank.types import Document, Query, Ranking, ScoredDoc

router = APIRouter(tags=["rerank"])

_ERRORS: dict[int | str, dict[str, Any]] = {  # FastAPI's `responses` type
    401: {"model": ErrorBody, "description": "Missing or wrong API key (when the service has one)."},
    413: {"model": ErrorBody, "description": "Body (decompressed) or document count over the limits."},
    422: {"model": ErrorBody, "description": "Invalid request (empty query or documents, unknown model, ...)."},
    429: {"model": ErrorBody, "description": "Inference queue full (overloaded); retry after Retry-After seconds."},
    503: {"model": ErrorBody, "description": "Models still loading (unhealthy) or no reranker (model_unavailable)."},
}


CHARS_PER_TOKEN = 8
"""Characters kept per token of the budget when a /rerank document is cut before
tokenizing: generous (English averages about 4 per LM token), so the tokenizer's own cut
to the budget decides what the reranker reads."""


def cut_long_documents(texts: list[str], max_tokens: int) -> tuple[list[str], list[int]]:
    """Texts cut to ``CHARS_PER_TOKEN * max_tokens`` characters, and the indices of those cut.

    Args:
        texts: Document texts.
        max_tokens: The per-document LM token budget.
    """
    bound = CHARS_PER_TOKEN * max_tokens
    cut = [i for i, t in enumerate(texts) if len(t) > bound]
    if not cut:
        return texts, []
    out = list(texts)
    for i in cut:
        out[i] = texts[i][:bound]
    return out, cut


def check_request(body: CohereRerankRequest, settings: Settings) -> tuple[list[str], int | None, list[str]]:
    """Texts, the ``max_doc_tokens`` to use (``None`` = the service's) and warnings.

    Documents are not limited in length here (see :func:`cut_long_documents`).

    Raises:
        PayloadTooLargeError: too many documents.
        ValidationError: unsupported ``rank_fields``.
        ModelLoadError: the service has no reranker.
    """
    if settings.rerank_method == NO_RERANK:
        raise ModelLoadError("this service has no reranker (HEEDRANK_RERANK_METHOD=none)")
    warnings: list[str] = []
    _, unknown = resolve_model(settings, body.model)
    if unknown is not None:
        warnings.append(unknown)
    if body.rank_fields is not None and body.rank_fields != ["text"]:
        raise ValidationError(f"rank_fields {body.rank_fields} is not supported; documents are ranked on 'text'")
    texts = body.texts()
    if len(texts) > settings.max_documents:
        raise PayloadTooLargeError(f"{len(texts)} documents is over the limit of {settings.max_documents} per request")
    max_doc_tokens = None
    if body.max_tokens_per_doc is not None:
        if body.max_tokens_per_doc >= settings.max_doc_tokens:
            if body.max_tokens_per_doc > settings.max_doc_tokens:
                warnings.append(f"max_tokens_per_doc {body.max_tokens_per_doc} clamped to this service's "
                                f"{settings.max_doc_tokens}")
        else:
            max_doc_tokens = body.max_tokens_per_doc
    if body.top_n is not None and body.top_n > len(texts):
        warnings.append(f"top_n {body.top_n} is more than the {len(texts)} documents; all are returned")
    return texts, max_doc_tokens, warnings


def _doc_ids(n: int) -> list[str]:
    width = len(str(max(0, n - 1)))
    return [f"{i:0{width}d}" for i in range(n)]  # zero-padded: ties keep the given order


async def _rerank(runtime: Runtime, pipeline: Pipeline, query: Query, given: Ranking, options: SearchOptions,
                  call: dict[str, Any], deadline: float | None, t0: float,
                  is_disconnected: Any = None) -> tuple[RerankedQuery | None, str | None]:
    """:meth:`heedrank.pipeline.Pipeline.rerank_documents` in the ``rerank`` pool, or
    ``(None, reason)`` when the deadline stops it."""
    pool = runtime.pools["rerank"]
    if deadline is not None:
        estimate = pool.estimate_seconds(len(given))
        if estimate is not None and estimate > deadline:
            return None, "estimate"
    remaining = None if deadline is None else max(0.0, deadline - (time.perf_counter() - t0))
    budget = runtime.settings.request_budget_s  # the service's per-request budget, below a larger deadline_ms
    by_budget = budget is not None and (remaining is None or budget < remaining)
    if by_budget:
        remaining = max(0.0, budget - (time.perf_counter() - t0))
    try:
        done = await pool.run(functools.partial(pipeline.rerank_documents, **call), query, given, options,
                              units=len(given), timeout=remaining, is_disconnected=is_disconnected)
    except OverloadedError:
        if deadline is None:
            raise
        return None, "overloaded"
    except (TimeoutError, asyncio.TimeoutError):
        return None, "budget" if by_budget else "timeout"
    return done, None


def _cut_warning(cut: list[int], budget: int) -> str:
    shown = ", ".join(str(i) for i in cut[:20]) + (f" and {len(cut) - 20} more" if len(cut) > 20 else "")
    return (f"documents {shown} are longer than {CHARS_PER_TOKEN * budget} characters; each was ranked on its "
            f"first {budget} LM tokens (max_tokens_per_doc)")


def to_response(body: CohereRerankRequest, done: RerankedQuery | None, reason: str | None, *, cutoff: Any,
                texts: list[str],
                cut: list[int], budget: int, warnings: list[str], settings: Settings, runtime: Runtime,
                version: str, t0: float, fallback: Served | None = None) -> CohereRerankResponse:
    """The Cohere response of a reranking (``done``), or of the given order when the deadline
    stopped it (``done is None``, ``reason`` says why). Results are sorted by
    ``relevance_score``, best first (ties in served order), then cut to ``top_n``."""
    total = time.perf_counter() - t0
    method = registry.resolve_method(settings.rerank_method)
    if done is None:
        runtime.metrics.deadline_fallbacks.labels(reason).inc()
        warnings.append(f"the service's per-request budget of {settings.request_budget_s:g} s (HEEDRANK_REQUEST_BUDGET_S) "
                        "ran out; documents are in the given order" if reason == "budget" else
                        f"deadline_ms {body.deadline_ms} would be exceeded ({reason}); documents are in the given order")
        timings, tokens, truncated, probs, alpha, scale = {"queue": 0.0, "rerank": 0.0, "total": total}, 0, [], None, None, None
        if fallback is not None and fallback.relevance:  # scored without the LM, from the embedder's cosine
            warnings[-1] = warnings[-1].replace("documents are in the given order", "documents were scored without "
                                                "the LM, by the default's scorer from the embedder's cosine alone")
            relevance = fallback.relevance
            rows = [(int(h.doc_id), relevance[h.doc_id], float(h.score)) for h in fallback.ranking.hits
                    if h.doc_id in relevance]
            probs = fallback.probabilities
        else:
            if cutoff is not None:
                warnings.append("cutoff was not applied: the documents are in the given order (deadline)")
            rows = [(i, 1.0 / (1 + i), 1.0 / (1 + i)) for i in range(len(texts))]  # (index, relevance, raw)
    else:
        result, served = done.reranked.result, done.served
        position = {h.doc_id: int(h.doc_id) for h in result.ranking.hits}
        raw = {h.doc_id: float(h.score) for h in result.ranking.hits}
        relevance = served.relevance or {}
        rows = sorted(((position[h.doc_id], relevance[h.doc_id], raw[h.doc_id]) for h in served.ranking.hits),
                      key=lambda row: -row[1])  # stable: the served order breaks ties
        runtime.metrics.stage_seconds.labels("rerank").observe(float(result.seconds))
        runtime.metrics.observe_block_cache(result.cache)
        timings = {"queue": max(0.0, total - float(result.seconds)), "rerank": float(result.seconds), "total": total}
        tokens, truncated = int(result.prompt_tokens), sorted({int(d) for d in result.truncated} | set(cut))
        warnings.extend(result.warnings)  # how the reranker ranked (query cut, windows, shared scores)
        warnings.extend(served.warnings)
        if cut:
            warnings.append(_cut_warning(cut, budget))
        probs, alpha, scale = served.probabilities, done.policy.alpha, done.policy.scale
    rows = rows[: body.top_n] if body.top_n is not None else rows
    results = [CohereRerankResult(index=i, relevance_score=rel,
                                  document=RerankedDocument(text=texts[i]) if body.return_documents else None)
               for i, rel, _ in rows]
    meta = CohereRerankMeta(
        api_version=ApiVersion(version=version), tokens=TokenCounts(input_tokens=tokens), warnings=warnings,
        model=f"{lm_name(settings.model)}/{method}", method=method, reranked=done is not None,
        deadline_exceeded=done is None, truncated=len(truncated), doc_tokens=budget if done is not None else None,
        timings=timings, score_scale=None if probs is not None else scale, calibrated=probs is not None,
        order_prior=done.served.order_prior if done is not None else None, raw_scores=[r for _, _, r in rows],
        fusion=alpha, cutoff=done.served.threshold if done is not None else None,
    )
    return CohereRerankResponse(id=str(uuid.uuid4()), results=results, meta=meta)


# decorators register bottom-up: /rerank first, then the paths of Cohere's SDK
@router.post("/v1/rerank", response_model=CohereRerankResponse, response_model_exclude_none=True,
             responses=_ERRORS, summary="Rerank documents (Cohere v1 path, for Cohere's SDK: Client)")
@router.post("/v2/rerank", response_model=CohereRerankResponse, response_model_exclude_none=True,
             responses=_ERRORS, summary="Rerank documents (Cohere v2 path, for Cohere's SDK: ClientV2)")
@router.post("/rerank", response_model=CohereRerankResponse, response_model_exclude_none=True,
             responses=_ERRORS, summary="Rerank documents (Cohere v2 compatible)")
async def rerank(
    body: CohereRerankRequest, request: Request, runtime: ReadyRuntimeDep, settings: SettingsDep
) -> CohereRerankResponse:
    """Rank ``documents`` by relevance to ``query`` with the service's reranker: one call of
    :meth:`heedrank.pipeline.Pipeline.rerank_documents` (the documents are not the
    collection's: no document KV store).

    Results are sorted by ``relevance_score``, best first, cut to ``top_n``; ``index``
    points into the request's ``documents``. Runs in the bounded ``rerank`` pool: a full
    queue answers 429 ``overloaded`` at once (with ``deadline_ms``: the given order instead).
    """
    t0 = time.perf_counter()
    texts, max_doc_tokens, warnings = check_request(body, settings)
    if runtime.rerankers is None:
        raise ModelLoadError("this service has no reranker")
    pipeline = runtime.pipeline(None)
    prior = body.fusion == "default"  # (when omitted) the given order as a position prior (PositionPrior)
    options = pipeline.check_rerank(SearchOptions(rerank=settings.rerank_method, fusion=None if prior else body.fusion,
                                                  cutoff=body.cutoff), fusion_name="fusion")  # 422 before any work
    budget = max_doc_tokens or settings.max_doc_tokens
    ranked_texts, cut = cut_long_documents(texts, budget)
    given = Ranking("rerank", tuple(ScoredDoc(d, 1.0 / (1 + i), Document(d, t))
                                    for i, (d, t) in enumerate(zip(_doc_ids(len(texts)), ranked_texts))))
    call = {"max_doc_tokens": max_doc_tokens, "by": "prior" if prior else "rank",
            "scale": settings.rerank_score_scale, "use_store": False, "share_texts": True}
    deadline = body.deadline_ms / 1000.0 if body.deadline_ms is not None else None
    query = Query("rerank", body.query)
    done, reason = await _rerank(runtime, pipeline, query, given, options, call, deadline, t0, request.is_disconnected)
    fallback = None
    if done is None:  # the default's scorer from the embedder alone (no LM pass): real probabilities, not 1/(1+i)
        fallback = await run_in_threadpool(pipeline.serve_without_lm, query, given, options, by=call["by"],
                                           use_store=False)
    return to_response(body, done, reason, cutoff=options.cutoff, texts=texts, cut=cut, budget=budget, warnings=warnings, settings=settings,
                       runtime=runtime, version="1" if request.url.path.endswith("/v1/rerank") else "2", t0=t0,
                       fallback=fallback)

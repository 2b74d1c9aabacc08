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
import time
import uuid

from typing import Any

from fastapi import APIRouter, Request

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
from heedrank.calibration import resolve_cutoff
from heedrank.errors import ModelLoadError, OverloadedError, PayloadTooLargeError, ValidationError
from heedrank.pipeline import NO_RERANK
from heedrank.serving import Served, ServePolicy, share_identical
from heedrank.protocols import RerankResult
from heedrank.settings import Settings
from heedrank.types import Document, Query, Ranking, ScoredDoc

router = APIRouter(tags=["rerank"])

_ERRORS = {
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


def _served_reranker(runtime: Runtime, settings: Settings, max_doc_tokens: int | None) -> Any:
    """The reranker /rerank just used (from the cache), or ``None`` without one."""
    if runtime.rerankers is None:
        return None
    return runtime.rerankers.get(settings.rerank_method, None, max_doc_tokens)[0]


def _doc_ids(n: int) -> list[str]:
    width = len(str(max(0, n - 1)))
    return [f"{i:0{width}d}" for i in range(n)]  # zero-padded: ties keep the given order


async def _rerank(runtime: Runtime, settings: Settings, query: Query, docs: list[Document],
                  max_doc_tokens: int | None, deadline: float | None, t0: float,
                  is_disconnected: Any = None) -> tuple[RerankResult | None, str | None]:
    """The reranker's result, or ``(None, reason)`` when the deadline stops it."""
    cache = runtime.rerankers
    if cache is None:
        raise ModelLoadError("this service has no reranker")
    pool = runtime.pools["rerank"]
    if deadline is not None:
        estimate = pool.estimate_seconds(len(docs))
        if estimate is not None and estimate > deadline:
            return None, "estimate"
    remaining = None if deadline is None else max(0.0, deadline - (time.perf_counter() - t0))
    budget = settings.request_budget_s  # the service's per-request budget, below a larger deadline_ms
    by_budget = budget is not None and (remaining is None or budget < remaining)
    if by_budget:
        remaining = max(0.0, budget - (time.perf_counter() - t0))
    try:
        result = await pool.run(cache.rerank, query, docs, settings.rerank_method, None, max_doc_tokens,
                                units=len(docs), timeout=remaining, is_disconnected=is_disconnected)
    except OverloadedError:
        if deadline is None:
            raise
        return None, "overloaded"
    except (TimeoutError, asyncio.TimeoutError):
        return None, "budget" if by_budget else "timeout"
    return result, None


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
    """Rank ``documents`` by relevance to ``query`` with the service's reranker.

    Results are sorted by ``relevance_score``, best first, cut to ``top_n``; ``index``
    points into the request's ``documents``. Runs in the bounded ``rerank`` pool: a full
    queue answers 429 ``overloaded`` at once (with ``deadline_ms``: the given order instead).
    """
    t0 = time.perf_counter()
    texts, max_doc_tokens, warnings = check_request(body, settings)
    cutoff = resolve_cutoff(body.cutoff)  # a bad value is a 422 before any work
    budget = max_doc_tokens or settings.max_doc_tokens
    ranked_texts, cut = cut_long_documents(texts, budget)
    ids = _doc_ids(len(texts))
    docs = [Document(doc_id, text) for doc_id, text in zip(ids, ranked_texts)]
    query = Query("rerank", body.query)
    deadline = body.deadline_ms / 1000.0 if body.deadline_ms is not None else None
    result, reason = await _rerank(runtime, settings, query, docs, max_doc_tokens, deadline, t0,
                                   request.is_disconnected)
    position = {doc_id: i for i, doc_id in enumerate(ids)}
    total = time.perf_counter() - t0
    policy = ServePolicy()
    served: Served | None = None
    if result is None:
        runtime.metrics.deadline_fallbacks.labels(reason).inc()
        warnings.append(
            f"the service's per-request budget of {settings.request_budget_s:g} s (HEEDRANK_REQUEST_BUDGET_S) ran "
            "out; documents are in the given order" if reason == "budget" else
            f"deadline_ms {body.deadline_ms} would be exceeded ({reason}); documents are in the given order"
        )
        if cutoff is not None:
            warnings.append("cutoff was not applied: the documents are in the given order (deadline)")
        order = [(i, 1.0 / (1 + i)) for i in range(len(texts))]
        timings = {"queue": 0.0, "rerank": 0.0, "total": total}
        tokens, truncated = 0, []
    else:
        prior = body.fusion == "default"  # (when omitted) the given order as a position prior (PositionPrior)
        policy = ServePolicy.of(_served_reranker(runtime, settings, max_doc_tokens),
                                fusion=None if prior else body.fusion, cutoff=cutoff, by="prior" if prior else "rank",
                                method=settings.rerank_method, scale=settings.rerank_score_scale)
        given = Ranking("rerank", tuple(ScoredDoc(d, 1.0 / (1 + i)) for i, d in enumerate(ids)))
        served = share_identical(policy.apply(given, result.ranking), dict(zip(ids, ranked_texts)))
        order = [(position[h.doc_id], float(h.score)) for h in served.ranking.hits]
        rerank_seconds = float(result.seconds)
        runtime.metrics.stage_seconds.labels("rerank").observe(rerank_seconds)
        runtime.metrics.observe_block_cache(result.details.get("cache"))
        timings = {"queue": max(0.0, total - rerank_seconds), "rerank": rerank_seconds, "total": total}
        tokens = int(result.prompt_tokens)
        truncated = sorted({position[d] for d in result.truncated} | set(cut))
        warnings.extend(result.warnings)  # how the reranker ranked (query cut, windows, shared scores)
        warnings.extend(served.warnings)
        if cut:
            shown = ", ".join(str(i) for i in cut[:20]) + (f" and {len(cut) - 20} more" if len(cut) > 20 else "")
            warnings.append(
                f"documents {shown} are longer than {CHARS_PER_TOKEN * budget} characters; each was ranked on its "
                f"first {budget} LM tokens (max_tokens_per_doc)"
            )
    raw = {position[h.doc_id]: float(h.score) for h in result.ranking.hits} if result is not None else {}
    probs = served.probabilities if served is not None else None
    if body.top_n is not None:
        order = order[: body.top_n]
    if served is not None and served.relevance is not None:  # the one score (ServePolicy.apply)
        relevance = [served.relevance[ids[i]] for i, _ in order]
    else:  # the deadline stopped the reranking: 1 / (1 + position)
        relevance = [s for _, s in order]
    results = [
        CohereRerankResult(index=i, relevance_score=rel,
                           document=RerankedDocument(text=texts[i]) if body.return_documents else None)
        for (i, _), rel in zip(order, relevance)
    ]
    meta = CohereRerankMeta(
        api_version=ApiVersion(version="1" if request.url.path.endswith("/v1/rerank") else "2"),
        tokens=TokenCounts(input_tokens=tokens),
        warnings=warnings,
        model=f"{lm_name(settings.model)}/{registry.resolve_method(settings.rerank_method)}",
        method=registry.resolve_method(settings.rerank_method),
        reranked=result is not None,
        deadline_exceeded=result is None,
        truncated=len(truncated),
        doc_tokens=budget if result is not None else None,
        timings=timings,
        score_scale=None if probs is not None else policy.scale,
        calibrated=probs is not None,
        order_prior=served.order_prior if served is not None else None,
        raw_scores=[raw.get(i, s) for i, s in order],
        fusion=policy.alpha,
        cutoff=served.threshold if served is not None else None,
    )
    return CohereRerankResponse(id=str(uuid.uuid4()), results=results, meta=meta)

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
where Cohere's does and where users set thresholds (:meth:`heedrank.serving.ZFusion.relevance`, or a probability); the
reranker's own score is ``raw_score``.

A request has one end, counted from its arrival with its wait for a worker included: the
earlier of ``deadline_ms`` and the service's per-request budget (``HEEDRANK_REQUEST_BUDGET_S``;
:mod:`heedrank.api.deadline`). A request whose reranking would finish too late (estimated from
the running mean of seconds per document and the work queued ahead, when it arrives or when a
worker frees for it), or is still waiting or running at that end (then stopped at its next
layer), or (with ``deadline_ms``) finds the queue full, is answered at once without the LM: the
documents scored by the default's scorer from the embedder alone, or in the given order, with
``meta.reranked = false`` and ``meta.deadline_exceeded = true``, within the end plus
:data:`heedrank.api.deadline.GRACE_S`.

Long documents are ranked on their beginning, as Cohere's endpoint does: each is first cut
to :data:`CHARS_PER_TOKEN` characters per token of the budget (``max_tokens_per_doc``, at
most the service's ``max_doc_tokens``), cheaply and generously, then the reranker's
tokenizer cuts it to the budget. Cut documents are counted in ``meta.truncated`` and named
in ``meta.warnings``. Only the body size (``max_body_bytes``) bounds a document's length.
"""

from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request

from heedrank import registry
from heedrank.api.costs import fits_its_deadline
from heedrank.api.deadline import RequestDeadline, request_deadline
from heedrank.api.deps import ReadyRuntimeDep, SettingsDep
from heedrank.api.inference import DeadlineExceeded
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
from heedrank.capabilities import reads_stored_blocks
from heedrank.errors import ModelLoadError, OverloadedError, PayloadTooLargeError, ValidationError
from heedrank.fusion import reciprocal_ranks
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


@dataclass(frozen=True, slots=True)
class Stop:
    """Why a ``/rerank`` request was answered without the LM.

    Attributes:
        reason: ``"estimate"`` (it would have ended too late: never started), ``"timeout"`` (its
            time ran out while it waited or ran: stopped) or ``"overloaded"`` (the queue was full).
        by_budget: Whether the service's per-request budget, not ``deadline_ms``, was the limit.
        ran: Seconds the reranking had run when it was stopped (0.0: it never started).
    """

    reason: str
    by_budget: bool
    ran: float = 0.0

    @property
    def label(self) -> str:
        """The ``reason`` label of ``heedrank_deadline_fallbacks_total``: ``"budget"`` when the
        budget was the limit (a full queue excepted), else :attr:`reason`."""
        return "budget" if self.by_budget and self.reason != "overloaded" else self.reason


async def _rerank(runtime: Runtime, pipeline: Pipeline, query: Query, given: Ranking, options: SearchOptions,
                  call: dict[str, Any], deadline: RequestDeadline, has_deadline_ms: bool,
                  is_disconnected: Any = None, *, method: str) -> RerankedQuery | Stop:
    """:meth:`heedrank.pipeline.Pipeline.rerank_documents` in the ``rerank`` pool until the
    request's :meth:`~heedrank.api.deadline.RequestDeadline.work_end` (the earlier of
    ``deadline_ms`` and the per-request budget, from the request's arrival, its wait for a
    worker included, less the fallback's reserve), or, when that stops it, why (:class:`Stop`).
    ``method``: the registered method, resolved once by the route; a method that fits its work
    to the deadline runs as an elastic job (:func:`heedrank.api.costs.fits_its_deadline`).

    Raises:
        OverloadedError: the queue is full and the request has no ``deadline_ms``.
        ClientGoneError: the client went away.
    """
    pool = runtime.pools["rerank"]
    reserve = runtime.fallback_costs.reserve("rerank", len(given))
    try:
        elastic = fits_its_deadline(registry.reranker_class(method), runtime.rerankers.loaded().get(method)
                                    if runtime.rerankers is not None else None,
                                    fusion=options.fusion, cutoff=options.cutoff, by=call.get("by", "score"))
        return await pool.run(functools.partial(pipeline.rerank_documents, **call), query, given, options,
                              units=len(given), deadline=deadline.work_end(reserve), is_disconnected=is_disconnected,
                              elastic=elastic)
    except OverloadedError:
        if not has_deadline_ms:
            raise
        return Stop("overloaded", deadline.by_budget)
    except DeadlineExceeded as exc:
        return Stop(exc.reason, deadline.by_budget, exc.ran)


def refuse_over_budget(runtime: Runtime, method: str, options: SearchOptions, documents: int, *, by: str,
                       max_doc_tokens: int | None, budget: float | None) -> None:
    """Refuse up front (422) more documents than the service's ``method`` reads within the
    per-request budget (``budget`` seconds), as measured on this service at its cold figure
    (:class:`heedrank.api.costs.MethodCosts`: a request's documents are new, each block encoded
    now); unless the method serves them by the default's scorer (the default: the LM reads as many
    as fit and the rest are scored from the embedder, :func:`heedrank.api.costs.serves_in_part`),
    its reranker is not built, or the request lowers ``max_tokens_per_doc`` (``max_doc_tokens``:
    cheaper than measured). Not called for a request with ``deadline_ms``: its client asked for
    an answer by then, without the LM where it must.

    Raises:
        ValidationError: ``documents`` over :meth:`~heedrank.api.costs.MethodCosts.max_candidates`
            (cold).
    """
    from heedrank.api.costs import COLD, serves_in_part

    if budget is None or max_doc_tokens is not None or runtime.rerankers is None:
        return
    most = runtime.costs.max_candidates(method, budget, COLD)
    if most is None or documents <= most:
        return
    reranker = runtime.rerankers.loaded().get(method)
    if reranker is None or serves_in_part(reranker, fusion=options.fusion, cutoff=options.cutoff, by=by):
        return
    raise ValidationError(
        f"rerank method {method!r} reads about {most} new documents within this service's per-request budget of "
        f"{budget:g} s (measured here: {runtime.costs.seconds_per_candidate(method, COLD):.2f} s per document; "
        f"GET /info: reranker.limits.{method}.max_documents_in_budget.cold); send at most {most} documents per "
        "request (split the list), or raise HEEDRANK_REQUEST_BUDGET_S")


def _learn_cost(runtime: Runtime, method: str, done: RerankedQuery | Stop, documents: int, stored: bool) -> None:
    """Teach :attr:`heedrank.api.runtime.Runtime.costs` what a reranking of the service's method
    at its own document budget took: a finished one its seconds per document reranked (cold: its
    blocks encoded now), a stopped one a lower bound (the seconds it ran over ``documents``)."""
    if isinstance(done, Stop):
        if done.ran > 0:
            runtime.costs.stopped(method, done.ran, documents, cold=documents if stored else None)
        return
    if done.reranked is None:
        return
    result = done.reranked.result
    runtime.costs.observe(method, float(result.seconds), len(result.ranking),
                          cold=None if result.cache is None else int(result.cache.get("misses", 0)))


def _cut_warning(cut: list[int], budget: int) -> str:
    shown = ", ".join(str(i) for i in cut[:20]) + (f" and {len(cut) - 20} more" if len(cut) > 20 else "")
    return (f"documents {shown} are longer than {CHARS_PER_TOKEN * budget} characters; each was ranked on its "
            f"first {budget} LM tokens (max_tokens_per_doc)")


@dataclass(frozen=True, slots=True)
class RerankRow:
    """One result of ``/rerank``.

    Attributes:
        index: Position of the document in the request's ``documents``.
        relevance: ``relevance_score``, in [0, 1].
        raw: The reranker's own score (``meta.raw_scores``), or the score it was served
            without the LM, or the given order's ``1 / (1 + index)`` when nothing scored it.
    """

    index: int
    relevance: float
    raw: float


@dataclass(frozen=True)
class RerankOutcome:
    """What one ``/rerank`` request came to: the one input of its response (:func:`to_response`),
    made by :func:`reranked_outcome` (the reranking finished) or :func:`stopped_outcome` (the
    deadline or the per-request budget stopped it).

    Attributes:
        rows: The results best first (ties in served order), before ``top_n``.
        timings: Seconds: ``queue``, ``rerank``, ``total``.
        warnings: ``meta.warnings``, in order.
        reranked: Whether the reranker ranked the documents (``False``: the deadline or the
            budget stopped it, :attr:`deadline_exceeded`).
        probabilities: ``{doc_id: P(relevant)}`` when ``relevance`` is the calibrated
            probability, else ``None``.
        tokens: LM tokens processed (0 when nothing was reranked).
        truncated: How many documents were ranked on their beginning (cut to the token budget).
        doc_tokens: LM tokens of each document the reranker read; ``None`` when not reranked.
        fusion: Weight alpha of the given order in the results' order, or ``None``.
        score_scale: The ``s`` of ``relevance = sigmoid(raw / s)``, or ``None`` (calibrated, or
            the raw score served as it is).
        order_prior: How much the given order counted as a position prior, or ``None``.
        cutoff: The probability threshold applied, or ``None``.

    Raises:
        ValueError: a calibrated outcome with a ``score_scale``, or a stopped one that says how
            it was reranked (tokens, doc_tokens, fusion, order prior, cut-off).
    """

    rows: tuple[RerankRow, ...]
    timings: dict[str, float]
    warnings: tuple[str, ...]
    reranked: bool
    probabilities: Mapping[str, float] | None = None
    tokens: int = 0
    truncated: int = 0
    doc_tokens: int | None = None
    fusion: float | None = None
    score_scale: float | None = None
    order_prior: float | None = None
    cutoff: float | None = None

    def __post_init__(self) -> None:
        if self.probabilities is not None and self.score_scale is not None:
            raise ValueError("a calibrated outcome has no score_scale: relevance_score is the probability")
        if not self.reranked and (self.tokens or self.doc_tokens is not None or self.fusion is not None
                                  or self.order_prior is not None or self.cutoff is not None):
            raise ValueError("an outcome that was not reranked has no tokens, doc_tokens, fusion, order prior or cutoff")

    @property
    def deadline_exceeded(self) -> bool:
        """Whether the deadline or the budget stopped the reranking (``meta.deadline_exceeded``)."""
        return not self.reranked


def reranked_outcome(done: RerankedQuery, *, warnings: Sequence[str], cut: Sequence[int], doc_tokens: int,
                     total: float) -> RerankOutcome:
    """The outcome of a finished reranking: rows sorted by relevance, best first (stable: the
    served order breaks ties).

    Args:
        done: :meth:`heedrank.pipeline.Pipeline.rerank_documents`'s answer; its doc ids are
            the documents' indices (zero-padded).
        warnings: The request's own warnings (:func:`check_request`); the reranker's, the
            serving's and the cut documents' follow them.
        cut: Indices of the documents cut before tokenizing (:func:`cut_long_documents`).
        doc_tokens: The per-document LM token budget used.
        total: Seconds since the request arrived.
    """
    result, served, policy = done.reranked.result, done.served, done.policy
    raw = {h.doc_id: float(h.score) for h in result.ranking.hits}
    relevance = served.relevance or {}
    # raw: the reranker's own score; a document the LM did not read in time (the budget) has its served
    # score; one with no signal the scorer reads (no embedder on this path) is listed last at relevance 0
    rows = sorted((RerankRow(int(h.doc_id), relevance.get(h.doc_id, 0.0), raw.get(h.doc_id, float(h.score)))
                   for h in served.ranking.hits), key=lambda row: -row.relevance)
    seconds = float(result.seconds)
    notes = [*warnings, *result.warnings, *served.warnings]  # how the reranker ranked (query cut, windows, ...)
    unscored = sum(h.doc_id not in relevance for h in served.ranking.hits)
    if unscored:
        notes.append(f"{unscored} documents were not read by the LM within the budget and have no other signal the "
                     "scorer reads: listed last, relevance_score 0")
    if cut:
        notes.append(_cut_warning(list(cut), doc_tokens))
    probabilities = served.probabilities
    return RerankOutcome(
        rows=tuple(rows), timings={"queue": max(0.0, total - seconds), "rerank": seconds, "total": total},
        warnings=tuple(notes), reranked=True, probabilities=probabilities, tokens=int(result.prompt_tokens),
        truncated=len({int(d) for d in result.truncated} | set(cut)), doc_tokens=doc_tokens, fusion=policy.alpha,
        score_scale=None if probabilities is not None else policy.scale, order_prior=served.order_prior,
        cutoff=served.threshold,
    )


def stopped_outcome(served: Served | None, n: int, *, why: str, cutoff: float | str | None,
                    warnings: Sequence[str], total: float) -> RerankOutcome:
    """The outcome of a reranking the deadline or the per-request budget stopped: the documents
    as the default's scorer served them without the LM (``served``, in served order), or, when
    it scored none (``None`` or no relevance), in the given order with the given order's score
    ``1 / (1 + index)`` (:func:`heedrank.fusion.reciprocal_ranks`) as both scores.

    Args:
        served: :meth:`heedrank.pipeline.Pipeline.serve_without_lm`'s answer, or ``None``.
        n: How many documents the request has.
        why: What stopped it (:func:`_why_stopped`); the warning goes on to say how the
            documents were then ordered.
        cutoff: The request's cut-off; in the given order it is not applied (a warning says so).
        warnings: The request's own warnings (:func:`check_request`).
        total: Seconds since the request arrived.
    """
    timings = {"queue": 0.0, "rerank": 0.0, "total": total}
    relevance = served.relevance if served is not None else None
    if served is not None and relevance:
        rows = tuple(RerankRow(int(h.doc_id), relevance[h.doc_id], float(h.score)) for h in served.ranking.hits
                     if h.doc_id in relevance)
        stopped = f"{why}; documents were scored without the LM, by the default's scorer from the embedder's cosine alone"
        return RerankOutcome(rows=rows, timings=timings, warnings=(*warnings, stopped), reranked=False,
                             probabilities=served.probabilities)
    notes = [*warnings, f"{why}; documents are in the given order"]
    if cutoff is not None:
        notes.append("cutoff was not applied: the documents are in the given order (deadline)")
    rows = tuple(RerankRow(i, score, score) for i, score in enumerate(reciprocal_ranks(n)))
    return RerankOutcome(rows=rows, timings=timings, warnings=tuple(notes), reranked=False)


def _why_stopped(stop: Stop, deadline_ms: int | None, budget_s: float | None) -> str:
    """What stopped a reranking, for its warning: the per-request budget (``stop.by_budget``),
    else ``deadline_ms`` and how it was found to be exceeded (``estimate``, ``timeout``,
    ``overloaded``: :class:`Stop`)."""
    if stop.label == "budget":
        how = "would run out" if stop.reason == "estimate" else "ran out"
        return (f"the service's per-request budget of {budget_s:g} s (HEEDRANK_REQUEST_BUDGET_S) {how}, counted from "
                "the request's arrival, its wait for a worker included")
    return f"deadline_ms {deadline_ms} would be exceeded ({stop.reason})"


def to_response(body: CohereRerankRequest, outcome: RerankOutcome, *, texts: list[str], method: str, model: str,
                version: str) -> CohereRerankResponse:
    """The Cohere response of a request's :class:`RerankOutcome`: its rows cut to ``top_n``.

    Args:
        body: The request (``top_n``, ``return_documents``).
        outcome: What the request came to.
        texts: The request's document texts, as given (not cut).
        method: The registered method that answered (:func:`heedrank.registry.resolve_method`).
        model: ``<lm>/<method>``.
        version: The Cohere API version of the path posted to (``"1"`` or ``"2"``).
    """
    rows = outcome.rows[: body.top_n] if body.top_n is not None else outcome.rows
    results = [CohereRerankResult(index=row.index, relevance_score=row.relevance,
                                  document=RerankedDocument(text=texts[row.index]) if body.return_documents else None)
               for row in rows]
    meta = CohereRerankMeta(
        api_version=ApiVersion(version=version), tokens=TokenCounts(input_tokens=outcome.tokens),
        warnings=list(outcome.warnings), model=model, method=method, reranked=outcome.reranked,
        deadline_exceeded=outcome.deadline_exceeded, truncated=outcome.truncated, doc_tokens=outcome.doc_tokens,
        timings=dict(outcome.timings), score_scale=outcome.score_scale, calibrated=outcome.probabilities is not None,
        order_prior=outcome.order_prior, raw_scores=[row.raw for row in rows], fusion=outcome.fusion,
        cutoff=outcome.cutoff,
    )
    return CohereRerankResponse(id=str(uuid.uuid4()), results=results, meta=meta)


async def _serve_without_lm(runtime: Runtime, pipeline: Pipeline, query: Query, given: Ranking,
                            options: SearchOptions, by: str, deadline: RequestDeadline,
                            is_disconnected: Any) -> Served | None:
    """:meth:`heedrank.pipeline.Pipeline.serve_without_lm` of a stopped reranking in the bounded
    ``search`` pool (one unit, as ``/search``'s fallback) until the request's
    :meth:`~heedrank.api.deadline.RequestDeadline.fallback_end`, or ``None`` when that pool's
    queue is full or the time is gone: the given order then, never a 429 or a wait for a request
    whose answer is already late. Its cost is learned for the next requests' reserve.

    Raises:
        ClientGoneError: the client went away.
    """
    started, served = time.perf_counter(), None
    try:
        served = await runtime.pools["search"].run(
            functools.partial(pipeline.serve_without_lm, by=by, use_store=False), query, given, options, units=1,
            deadline=deadline.fallback_end(), is_disconnected=is_disconnected)
    except OverloadedError:
        return None
    except DeadlineExceeded:  # cut: it costs at least the time it had
        pass
    runtime.fallback_costs.observe("rerank", time.perf_counter() - started, len(given))
    return served


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
    texts, max_doc_tokens, warnings = check_request(body, settings)
    if runtime.rerankers is None:
        raise ModelLoadError("this service has no reranker")
    method = registry.resolve_method(settings.rerank_method)  # once per request
    pipeline = runtime.pipeline(None)
    prior = body.fusion == "default"  # (when omitted) the given order as a position prior (PositionPrior)
    options = pipeline.check_rerank(SearchOptions(rerank=settings.rerank_method, fusion=None if prior else body.fusion,
                                                  cutoff=body.cutoff), fusion_name="fusion")  # 422 before any work
    budget = max_doc_tokens or settings.max_doc_tokens
    ranked_texts, cut = cut_long_documents(texts, budget)
    given = Ranking("rerank", tuple(ScoredDoc(d, score, Document(d, t)) for d, t, score
                                    in zip(_doc_ids(len(texts)), ranked_texts, reciprocal_ranks(len(texts)))))
    by = "prior" if prior else "rank"
    call = {"max_doc_tokens": max_doc_tokens, "by": by, "scale": settings.rerank_score_scale, "use_store": False,
            "share_texts": True}
    # one end for the whole request, from its arrival: the earlier of deadline_ms and the service's budget
    deadline = request_deadline(request.scope, settings.request_budget_s,
                                body.deadline_ms / 1000.0 if body.deadline_ms is not None else None)
    query = Query("rerank", body.query)
    if body.deadline_ms is None:  # with deadline_ms the client asked for an answer by then, without the LM if need be
        refuse_over_budget(runtime, method, options, len(texts), by=by, max_doc_tokens=max_doc_tokens,
                           budget=settings.request_budget_s)
    done = await _rerank(runtime, pipeline, query, given, options, call, deadline, body.deadline_ms is not None,
                         request.is_disconnected, method=method)
    if max_doc_tokens is None:  # at the service's document budget: what the method's figures are
        _learn_cost(runtime, method, done, len(texts), reads_stored_blocks(runtime.rerankers.loaded().get(method)))
    if isinstance(done, Stop):  # the default's scorer from the embedder alone (no LM pass), or the given order
        served = await _serve_without_lm(runtime, pipeline, query, given, options, by, deadline,
                                         request.is_disconnected)
        runtime.metrics.deadline_fallbacks.labels(done.label).inc()
        outcome = stopped_outcome(served, len(texts), why=_why_stopped(done, body.deadline_ms, settings.request_budget_s),
                                  cutoff=options.cutoff, warnings=warnings, total=deadline.elapsed())
    else:
        runtime.metrics.stage_seconds.labels("rerank").observe(float(done.reranked.result.seconds))
        runtime.metrics.observe_block_cache(done.reranked.result.cache)
        outcome = reranked_outcome(done, warnings=warnings, cut=cut, doc_tokens=budget, total=deadline.elapsed())
    return to_response(body, outcome, texts=texts, method=method, model=f"{lm_name(settings.model)}/{method}",
                       version="1" if request.url.path.endswith("/v1/rerank") else "2")

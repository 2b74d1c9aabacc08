"""``GET /info``: models, collections with index parameters and counts, limits, and each
reranking method's options and the limits its loaded model holds."""

from __future__ import annotations

import time
from typing import Any

import anyio
from fastapi import APIRouter

from attnrank import __version__
from attnrank.api.deps import RuntimeDep, SettingsDep
from attnrank.api.runtime import Runtime, served_model_ids
from attnrank.api.schemas import InfoResponse, RerankerInfo
from attnrank import registry
from attnrank.eval.report import jsonable
from attnrank.settings import Settings

router = APIRouter(tags=["info"])


def method_limits(loaded: dict[str, Any], settings: Settings, methods: list[str]) -> dict[str, dict[str, Any]]:
    """Per method, what the loaded LM holds (:meth:`AttentionReranker.limits`), with
    ``max_candidates``/``max_documents`` set to the service limits the method can take.

    Uses the LM of an already built reranker (never loads one); methods that are not built
    yet get a reranker built around that LM (cheap: no model load). Empty before any LM is
    loaded.
    """
    from dataclasses import replace

    from attnrank.errors import AttnrankError

    base = loaded.get(settings.rerank_method) or next(iter(loaded.values()), None)
    lm = getattr(base, "loaded_lm", None)
    if base is None or lm is None:
        return {}
    out: dict[str, dict[str, Any]] = {}
    for method in methods:
        reranker = loaded.get(method)
        try:
            if reranker is None or not hasattr(reranker, "limits"):
                reranker = registry.reranker_class(method)(replace(base.config, method=method, options={}), lm=lm)
            limits = dict(reranker.limits())
        except (AttnrankError, TypeError, AttributeError):
            continue  # a plugin without limits()
        held = limits.get("max_candidates")
        limits["max_candidates"] = settings.max_candidates if held is None else min(held, settings.max_candidates)
        limits["max_documents"] = settings.max_documents if held is None else min(held, settings.max_documents)
        out[method] = limits
    return out


def _info(runtime: Runtime, settings: Settings) -> InfoResponse:
    from attnrank.reranker.options import describe_options

    model = None
    methods = sorted(set(registry.reranker_names()) | {settings.rerank_method})
    limits: dict[str, dict[str, Any]] = {}
    if runtime.status == "ok" and runtime.rerankers is not None:
        built = runtime.rerankers.loaded()
        loaded = built.get(settings.rerank_method)
        if loaded is not None:  # describe() of a built reranker; never loads a model here
            model = jsonable(dict(loaded.describe()))
        limits = method_limits(built, settings, methods)
    return InfoResponse(
        version=__version__,
        status=runtime.status,
        uptime_seconds=time.time() - runtime.started,
        reranker=RerankerInfo(
            method=settings.rerank_method,
            model=model,
            model_ids=served_model_ids(settings),
            methods=methods,
            max_doc_tokens=settings.max_doc_tokens,
            device=settings.device,
            dtype=settings.dtype,
            options=describe_options(methods),
            limits=limits,
        ),
        default_collection=settings.default_collection,
        collections=jsonable(runtime.describe()),
        limits={
            "max_top_k": settings.max_top_k,
            "max_candidates": settings.max_candidates,
            "max_documents": settings.max_documents,
            "max_document_chars": settings.max_document_chars,
            "max_body_bytes": settings.max_body_bytes,
            "max_query_chars": 4096,
            "workers": settings.workers,
            "queue_size": settings.queue_size,
            "search_workers": settings.search_workers,
            "search_queue_size": settings.search_queue_size,
            "max_ingest_documents": settings.max_ingest_documents,
            "ingest_workers": settings.ingest_workers,
            "ingest_queue_size": settings.ingest_queue_size,
        },
        auth=settings.api_key is not None,
    )


@router.get("/info", response_model=InfoResponse, summary="Models, collections and limits")
async def info(runtime: RuntimeDep, settings: SettingsDep) -> InfoResponse:
    """What this service serves. Document counts are live (read from each document store)."""
    return await anyio.to_thread.run_sync(_info, runtime, settings)

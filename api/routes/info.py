"""``GET /info``: models, collections with index parameters and counts, limits."""

from __future__ import annotations

import time

import anyio
from fastapi import APIRouter

from api.deps import RuntimeDep, SettingsDep
from api.runtime import Runtime, served_model_ids
from api.schemas import InfoResponse, RerankerInfo
from attnrank import registry
from eval.report import jsonable
from attnrank.settings import Settings

router = APIRouter(tags=["info"])


def _info(runtime: Runtime, settings: Settings) -> InfoResponse:
    model = None
    if runtime.status == "ok" and runtime.rerankers is not None:
        loaded = runtime.rerankers.loaded().get(settings.rerank_method)
        if loaded is not None:  # describe() of a built reranker; never loads a model here
            model = jsonable(dict(loaded.describe()))
    from api.app import _version

    return InfoResponse(
        version=_version(),
        status=runtime.status,
        uptime_seconds=time.time() - runtime.started,
        reranker=RerankerInfo(
            method=settings.rerank_method,
            model=model,
            model_ids=served_model_ids(settings),
            methods=sorted(set(registry.reranker_names()) | {settings.rerank_method}),
            max_doc_tokens=settings.max_doc_tokens,
            device=settings.device,
            dtype=settings.dtype,
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

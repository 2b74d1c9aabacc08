"""``GET /info``: models, collections with index parameters and counts, limits, and each
reranking method's options and the limits its loaded model holds."""

from __future__ import annotations

import time
from typing import Any

import anyio
from fastapi import APIRouter

from heedrank import __version__
from heedrank.api.deps import RuntimeDep, SettingsDep
from heedrank.api.runtime import Runtime, served_model_ids
from heedrank.api.schemas import InfoResponse, RerankerInfo
from heedrank import registry
from heedrank.jsonable import jsonable
from heedrank.settings import Settings

router = APIRouter(tags=["info"])


def method_limits(loaded: dict[str, Any], settings: Settings, methods: list[str]) -> dict[str, dict[str, Any]]:
    """Per method, what the loaded LM holds (:meth:`AttentionReranker.limits`), with
    ``max_candidates``/``max_documents`` set to the service limits the method can take.

    Uses the LM of an already built reranker (never loads one); methods that are not built
    yet get a reranker built around that LM (cheap: no model load). Empty before any LM is
    loaded.
    """
    from dataclasses import replace

    from heedrank.errors import HeedrankError

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
        except (HeedrankError, TypeError, AttributeError):
            continue  # a plugin without limits()
        held = limits.get("max_candidates")
        limits["max_candidates"] = settings.max_candidates if held is None else min(held, settings.max_candidates)
        limits["max_documents"] = settings.max_documents if held is None else min(held, settings.max_documents)
        out[method] = limits
    return out


def default_configuration(settings: Settings) -> dict[str, Any]:
    """What ``"default"`` names, read without loading a model: the method, its options, the
    fusion weight, and the dev and test nDCG@10 of its weights card (``configuration``: the
    shipped configuration with the query adapter, fused; ``pure``/``fused``: the card's own
    weights without the adapter)."""
    from heedrank.reranker.options import DEFAULT_METHOD, describe_options, packaged_card

    options = {o["name"]: o["default"] for o in describe_options([DEFAULT_METHOD])[DEFAULT_METHOD]}
    out: dict[str, Any] = {"name": "default", "method": DEFAULT_METHOD, "options": options,
                           "max_doc_tokens": registry.default_max_doc_tokens(DEFAULT_METHOD),
                           "fusion": registry.recorded_fusion(registry_config(settings))}
    card = packaged_card(settings.model)
    if card is not None:
        out["card"] = {k: card.data[k] for k in ("model", "layer", "max_doc_tokens", "configuration", "fusion",
                                                  "dev_ndcg@10", "test_ndcg@10", "train") if k in card.data}
    return jsonable(out)


def explain_methods(methods: list[str]) -> list[str]:
    """The methods among ``methods`` (and the aliases naming them) whose reranker can explain
    (``rerank_with_evidence``), sorted; classes are imported, no model is loaded."""
    from heedrank.errors import HeedrankError

    able = set()
    for m in methods:
        try:
            if hasattr(registry.reranker_class(m), "rerank_with_evidence"):
                able.add(m)
        except (HeedrankError, ImportError):
            continue
    able |= {alias for alias, target in registry.reranker_aliases().items() if target in able}
    return sorted(able)


def method_options(methods: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Per method among ``methods``, its options ({name, type, default, doc}); an alias such as
    ``"default"`` has those of the method it names (no model is loaded)."""
    from heedrank.reranker.options import describe_options

    described = describe_options(sorted({registry.resolve_method(m) for m in methods}))
    return {m: described[registry.resolve_method(m)] for m in methods if registry.resolve_method(m) in described}


def registry_config(settings: Settings) -> Any:
    from heedrank.config import RerankerConfig

    return RerankerConfig(method="default", model=settings.model)


def without_paths(value: Any) -> Any:
    """``value`` (JSON-like) with every absolute filesystem path replaced by its last part:
    ``/info`` names files (a model directory, an index, a weights card) without showing where the
    server keeps them."""
    import os

    if isinstance(value, dict):
        return {k: without_paths(v) for k, v in value.items()}
    if isinstance(value, list):
        return [without_paths(v) for v in value]
    if isinstance(value, str) and os.path.isabs(value):
        return os.path.basename(value.rstrip("/")) or value
    return value


def _info(runtime: Runtime, settings: Settings) -> InfoResponse:
    model = None
    methods = sorted(set(registry.reranker_names()) | set(registry.reranker_aliases()) | {settings.rerank_method})
    limits: dict[str, dict[str, Any]] = {}
    served = registry.resolve_method(settings.rerank_method)
    if runtime.status == "ok" and runtime.rerankers is not None:
        built = runtime.rerankers.loaded()
        loaded = built.get(served)
        if loaded is not None:  # describe() of a built reranker; never loads a model here
            model = without_paths(jsonable(dict(loaded.describe())))
        limits = method_limits(built, settings, methods)
    return InfoResponse(
        version=__version__,
        status=runtime.status,
        uptime_seconds=time.time() - runtime.started,
        reranker=RerankerInfo(
            method=settings.rerank_method,
            default=default_configuration(settings),
            explain_methods=explain_methods(methods),
            default_retriever=settings.default_retriever,
            model=model,
            model_ids=served_model_ids(settings),
            methods=methods,
            max_doc_tokens=settings.max_doc_tokens,
            device=settings.device,
            dtype=settings.dtype,
            options=method_options(methods),
            limits=limits,
        ),
        default_collection=settings.default_collection,
        collections=without_paths(jsonable(runtime.describe())),
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

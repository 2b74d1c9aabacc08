"""``GET /info``: models, collections with index parameters and counts, limits, and each
reranking method's options and the limits its loaded model holds."""

from __future__ import annotations

import threading
import time
import weakref
from typing import Any

import anyio
from fastapi import APIRouter

from heedrank import __version__
from heedrank.api.costs import budget_limits
from heedrank.api.deps import RuntimeDep, SettingsDep
from heedrank.api.runtime import Runtime, served_model_ids
from heedrank.api.schemas import InfoResponse, RerankerInfo
from heedrank.capabilities import LimitedReranker
from heedrank.errors import HeedrankError
from heedrank import registry
from heedrank.jsonable import jsonable
from heedrank.protocols import ExplainingReranker
from heedrank.seam import serving_of
from heedrank.settings import Settings

router = APIRouter(tags=["info"])


def method_limits(loaded: dict[str, Any], settings: Settings, methods: list[str],
                  costs: Any = None) -> dict[str, dict[str, Any]]:
    """Per method, what the loaded LM holds (:meth:`heedrank.capabilities.LimitedReranker.limits`), with
    ``max_candidates``/``max_documents`` set to the service limits the method can take, and, with
    ``costs`` (:class:`heedrank.api.costs.MethodCosts`), what fits the per-request budget
    (:func:`heedrank.api.costs.budget_limits`): ``seconds_per_candidate``,
    ``max_candidates_in_budget`` and ``max_documents_in_budget``, each ``{"warm": ..., "cold": ...}``,
    ``None`` where the method was not measured yet (the served one is, at start-up; another the
    first time a search builds it). A request past them gets a 422 that says so, unless its
    method answers in part (:func:`heedrank.api.costs.serves_in_part`).

    Uses the LM of an already built reranker (never loads one): a method built already (under
    its name or an alias, e.g. ``blockrank-cached`` as ``default``) answers itself; another gets
    a reranker built around that LM once, its limits kept for the LM's life
    (:func:`_built_limits`: building one can cost a second, e.g. cached BlockRank's query
    adapter copies the LM, so ``/info`` must not do it per call). Empty before any LM is loaded,
    or when the served reranker does not state limits (a plug-in that is no
    :class:`~heedrank.capabilities.LimitedReranker`).
    """
    base = loaded.get(settings.rerank_method) or next(iter(loaded.values()), None)
    if not isinstance(base, LimitedReranker) or base.loaded_lm is None:
        return {}
    lm = base.loaded_lm
    out: dict[str, dict[str, Any]] = {}
    for method in methods:
        reranker = loaded.get(method) or _loaded_as(loaded, method)
        if isinstance(reranker, LimitedReranker):
            try:
                limits = dict(reranker.limits())
            except (HeedrankError, TypeError, AttributeError):
                continue  # limits the LM cannot give (a plug-in's)
        else:
            built = _built_limits(method, base, lm)
            if built is None:
                continue
            limits = dict(built)
        held = limits.get("max_candidates")
        limits["max_candidates"] = settings.max_candidates if held is None else min(held, settings.max_candidates)
        limits["max_documents"] = settings.max_documents if held is None else min(held, settings.max_documents)
        if costs is not None:
            limits.update(budget_limits(costs, registry.resolve_method(method), settings.request_budget_s,
                                        limits["max_candidates"], limits["max_documents"]))
        out[method] = limits
    return out


def _loaded_as(loaded: dict[str, Any], method: str) -> Any:
    """The reranker built under another name of ``method`` (an alias: ``default`` for
    ``blockrank-cached``), with its default options, or ``None``."""
    try:
        want = registry.resolve_method(method)
    except HeedrankError:
        return None
    for name, reranker in loaded.items():
        if "{" in name or "[" in name:  # built with request options or another token budget
            continue
        try:
            if registry.resolve_method(name) == want:
                return reranker
        except HeedrankError:
            continue
    return None


_LIMITS: weakref.WeakKeyDictionary[Any, dict[tuple[str, Any], dict[str, Any] | None]] = weakref.WeakKeyDictionary()
_LIMITS_LOCK = threading.Lock()


def _built_limits(method: str, base: LimitedReranker, lm: Any) -> dict[str, Any] | None:
    """:meth:`~heedrank.capabilities.LimitedReranker.limits` of ``method`` built around ``lm`` with ``base``'s
    config (default options), computed on the first call per LM and method and kept while the
    LM lives; ``None`` for a method without limits (a plugin) or that cannot be built here."""
    from dataclasses import replace

    key = (method, base.config.max_doc_tokens)
    with _LIMITS_LOCK:
        try:
            per_lm = _LIMITS.setdefault(lm, {})
        except TypeError:  # an LM that takes no weak reference: computed every time
            per_lm = {}
        if key not in per_lm:
            try:
                reranker = registry.reranker_class(method)(replace(base.config, method=method, options={}), lm=lm)
                per_lm[key] = dict(reranker.limits())
            except (HeedrankError, TypeError, AttributeError):
                per_lm[key] = None
        return per_lm[key]


def default_configuration(settings: Settings) -> dict[str, Any]:
    """What ``"default"`` names, read without loading a model: the method, its options, the
    fusion weight, and the dev and test nDCG@10 of its weights card (``scorer``: what the default
    serves, its signals, cut-off, test nDCG@10 beside the first stage and the embedder alone,
    the configuration its leave-one-source-out choice picked and its query ``gate``
    (:class:`heedrank.scorer.QueryGate`: the signal, limit, power and target model); ``learned``: the card's record of
    ``scoring='learned'``, opt-in since the scorer ships: its ``configuration`` with the query
    adapter, its ``fusion`` weight, dev and test nDCG@10). ``fusion`` at the top is the weight
    the default serves with (``null``: the scorer orders alone, the first stage is not fused)."""
    from heedrank.reranker.cards import packaged_card
    from heedrank.reranker.options import DEFAULT_METHOD, describe_options

    options = {o["name"]: o["default"] for o in describe_options([DEFAULT_METHOD])[DEFAULT_METHOD]}
    out: dict[str, Any] = {"name": "default", "method": DEFAULT_METHOD, "options": options,
                           "max_doc_tokens": registry.default_max_doc_tokens(DEFAULT_METHOD),
                           "fusion": registry.recorded_fusion(registry_config(settings))}
    card = packaged_card(settings.model)
    if card is not None:
        out["card"] = {k: card.data[k] for k in ("model", "layer", "max_doc_tokens", "train") if k in card.data}
        scorer = card.data.get("scorer")
        if scorer is not None:  # what the default serves: its signals, cut-off and test figures
            out["card"]["scorer"] = {k: scorer[k] for k in ("features", "fit", "threshold", "test_ndcg@10")
                                     if k in scorer}
            if "choice" in scorer:
                out["card"]["scorer"]["chosen"] = scorer["choice"].get("chosen")
            if scorer.get("gate"):  # the query gate: past the sources' longest query the score leans on `toward`
                out["card"]["scorer"]["gate"] = {k: scorer["gate"][k] for k in ("signal", "limit", "power", "toward")
                                                 if k in scorer["gate"]}
        # the card's record of scoring='learned' (opt-in; the default before the scorer): not what "default" serves
        learned = {k: card.data[k] for k in ("configuration", "fusion", "dev_ndcg@10", "test_ndcg@10") if k in card.data}
        if learned:
            out["card"]["learned"] = {**learned, "served_when": "scoring='learned' is asked for" if scorer is not None
                                      else "always (this card has no scorer)"}
    return jsonable(out)


def explain_methods(methods: list[str]) -> list[str]:
    """The methods among ``methods`` (and the aliases naming them) whose reranker class can
    explain (:class:`heedrank.protocols.ExplainingReranker`), sorted; classes are imported, no
    model is loaded."""
    able = set()
    for m in methods:
        try:
            if issubclass(registry.reranker_class(m), ExplainingReranker):
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


def served_card(reranker: Any) -> tuple[dict[str, Any] | None, str | None]:
    """``(card, scoring)`` of a built reranker: which weights card answered for its model
    (:attr:`heedrank.seam.RerankerServing.card`, paths cut to their last part) and the
    scorer in use; ``(None, scoring)`` without a card, ``(None, None)`` for a method without
    scorers."""
    traits = serving_of(reranker)
    if traits.scoring is None:
        return None, None
    return (None if traits.card is None else without_paths(jsonable(dict(traits.card)))), traits.scoring


def _info(runtime: Runtime, settings: Settings) -> InfoResponse:
    model = None
    card: dict[str, Any] | None = None
    scoring: str | None = None
    signals: list[str] | None = None
    methods = sorted(set(registry.reranker_names()) | set(registry.reranker_aliases()) | {settings.rerank_method})
    limits: dict[str, dict[str, Any]] = {}
    served = registry.resolve_method(settings.rerank_method)
    if runtime.status == "ok" and runtime.rerankers is not None:
        built = runtime.rerankers.loaded()
        loaded = built.get(served)
        if loaded is not None:  # describe() of a built reranker; never loads a model here
            model = without_paths(jsonable(dict(loaded.describe())))
            card, scoring = served_card(loaded)
            scorer = serving_of(loaded).scorer
            signals = list(scorer.features) if scorer is not None else None
        limits = method_limits(built, settings, methods, runtime.costs)
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
            card=card,
            scoring=scoring,
            signals=signals,
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

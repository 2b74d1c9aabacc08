"""By-name registries of retrievers, rerankers and the index opener.

Targets are ``"module:attribute"`` strings imported on first use, so that ``heedrank``
never imports ``index``/``retriever``/``reranker`` at import time (dependencies point one
way) and heavy libraries load only when a stage is built. Plugins add entries with
:func:`register_retriever` / :func:`register_reranker`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Collection, Mapping
from typing import Any, Protocol, runtime_checkable

from heedrank.errors import UnknownNameError

_RETRIEVERS: dict[str, str | Callable[..., Any]] = {
    "bm25": "heedrank.retriever.bm25:BM25Retriever",
    "dense": "heedrank.retriever.dense:DenseRetriever",
    "hybrid": "heedrank.retriever.hybrid:HybridRetriever",
}
_RERANKERS: dict[str, str | Callable[..., Any]] = {
    "icr": "heedrank.reranker.icr:ICRReranker",
    "blockrank": "heedrank.reranker.blockrank:BlockRankReranker",
    "blockrank-cached": "heedrank.reranker.cached:CachedBlockRankReranker",
    "dense": "heedrank.reranker.dense:DenseReranker",
}
_OPTION_CLASSES = "heedrank.reranker.options:OPTION_CLASSES"
_DEFAULT_BUDGET = "heedrank.reranker.options:default_max_doc_tokens"
_PACKAGED_LMS = "heedrank.reranker.lm:packaged_models"
_ALIASES = "heedrank.reranker.options:METHOD_ALIASES"
_INDEX_OPENER = "heedrank.index.store:Index.open"
_FILTER_PARSER = "heedrank.index.filters:as_filter"
_KV_CODEC = "heedrank.index.kv.codec:codec_for"
_DENSE_OF_INDEX = "heedrank.index.cosines:DenseSignal.of_index"
_DENSE_PACKAGED = "heedrank.index.cosines:DenseSignal.packaged"


@runtime_checkable
class TakesResources(Protocol):
    """A reranker class that takes shared resources at build time: ``build_resources`` names
    those its ``from_config`` accepts (``"block_cache_bytes"``, ``"passes"``: :func:`build_reranker`).
    Checked on the class with ``isinstance(cls, TakesResources)``."""

    build_resources: tuple[str, ...]


def _resolve(target: str | Callable[..., Any]) -> Any:
    if not isinstance(target, str):
        return target
    module, _, attr = target.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def retriever_names() -> list[str]:
    """Registered retriever names, sorted."""
    return sorted(_RETRIEVERS)


def retriever_requires(name: str) -> tuple[str, ...] | None:
    """The index parts the retriever ``name`` declares it reads: its class's ``requires``
    (``("bm25",)``, ``("dense",)``, ``("bm25", "dense")``), or ``None`` when it declares none.
    Imports the class. Raises UnknownNameError."""
    requires = getattr(retriever_class(name), "requires", None)
    return None if requires is None else tuple(requires)


def retrievers_for(parts: Collection[str]) -> list[str]:
    """The registered retrievers an index with ``parts`` (what
    :meth:`heedrank.index.store.Index.provides`) can serve: those whose ``requires`` are all
    among ``parts``, sorted. A retriever that declares no ``requires`` is never offered (it
    can still be built by name with :func:`build_retriever`). Imports every registered class."""
    have = set(parts)
    out = []
    for name in sorted(_RETRIEVERS):
        requires = retriever_requires(name)
        if requires is not None and set(requires) <= have:
            out.append(name)
    return out


def reranker_names() -> list[str]:
    """Registered reranker methods, sorted (aliases such as ``"default"`` not included)."""
    return sorted(_RERANKERS)


def reranker_aliases() -> dict[str, str]:
    """Method names that name a registered method: ``{"default": "blockrank-cached"}``."""
    return dict(_resolve(_ALIASES))


def resolve_method(method: str) -> str:
    """The registered method that ``method`` names (an alias such as ``"default"`` resolved);
    other names pass through unchanged."""
    return reranker_aliases().get(method, method)


def options_class(method: str) -> Any:
    """The typed options class of a built-in method (``heedrank.reranker.options``), or
    ``None`` for a method without one (a registered plugin, ``"none"``)."""
    return _resolve(_OPTION_CLASSES).get(method)


def typed_options(method: str, value: Any) -> Any:
    """``value`` as the options of the registered ``method``: the method's frozen options
    object, parsed from a mapping (or ``None``: every default) or kept when it already is one;
    for a method without an options class, a ``dict`` copy of the mapping.

    Raises:
        ValidationError: unknown names or bad values (the message names the valid ones), or
            set options of another method (all-default ones are dropped: a ``replace`` of
            the method).
    """
    from heedrank.errors import ValidationError

    cls = options_class(method)
    if cls is not None and isinstance(value, cls):
        return value
    if value is not None and not isinstance(value, Mapping):  # another method's typed options
        if not hasattr(value, "to_dict") or value != type(value)():
            raise ValidationError(f"{method} options must be a mapping of option names to values or {method}'s own "
                                  f"options, got {value!r}")
        value = None  # all defaults: dropped (a replace of the method)
    return dict(value or {}) if cls is None else cls.parse(value)


def methods_with_options(names: Any) -> list[str]:
    """The built-in reranker methods whose options class has every option in ``names``."""
    classes = _resolve(_OPTION_CLASSES)
    return sorted(m for m, cls in classes.items() if set(names) <= set(cls.names()))


def recorded_fusion(config: Any) -> float | None:
    """The fusion weight ``config``'s reranker records (``heedrank.reranker.cached.state.recorded_fusion``),
    read without loading a model; ``None`` when it records none."""
    return _resolve("heedrank.reranker.cached.state:recorded_fusion")(config)


def default_max_doc_tokens(method: str) -> int:
    """The per-document LM token budget of ``method`` when none is given."""
    return int(_resolve(_DEFAULT_BUDGET)(method))


def packaged_models() -> list[str]:
    """The packaged LMs' short names (``--model NAME``; :func:`heedrank.reranker.lm.packaged_models`),
    read without importing torch."""
    return list(_resolve(_PACKAGED_LMS)())


def register_retriever(name: str, target: str | Callable[..., Any]) -> None:
    """Register a retriever class under ``name`` (a class or a ``"module:attribute"`` string).

    The class has ``from_index(index, **options)`` and a class attribute ``requires``: the
    index parts it reads (``"bm25"``, ``"dense"``; see :meth:`heedrank.index.store.Index.provides`).
    Every index that has them offers it (:meth:`heedrank.index.store.Index.available_retrievers`),
    so :meth:`heedrank.pipeline.Pipeline.from_config` builds it."""
    _RETRIEVERS[name] = target


def register_reranker(name: str, target: str | Callable[..., Any]) -> None:
    """Register a reranker class (with ``from_config(RerankerConfig)``) under ``name``."""
    _RERANKERS[name] = target


def _lookup(table: dict[str, Any], kind: str, name: str) -> Any:
    try:
        target = table[name]
    except KeyError:
        raise UnknownNameError(f"unknown {kind} {name!r}; choose one of {sorted(table)}") from None
    return _resolve(target)


def retriever_class(name: str) -> Any:
    """The retriever class registered as ``name``. Raises UnknownNameError."""
    return _lookup(_RETRIEVERS, "retriever", name)


def reranker_class(name: str) -> Any:
    """The reranker class registered as ``name`` (or named by an alias). Raises UnknownNameError."""
    return _lookup(_RERANKERS, "reranker", reranker_aliases().get(name, name))


def build_retriever(name: str, index: Any, **options: Any) -> Any:
    """Build retriever ``name`` over an opened index. Raises UnknownNameError."""
    return retriever_class(name).from_index(index, **options)


def build_reranker(config: Any, *, block_cache_bytes: int | None = None, passes: int | None = None) -> Any:
    """Build the reranker named by ``config.method`` from a RerankerConfig. Raises UnknownNameError.

    A class takes a resource when it lists its name in ``build_resources`` and its
    ``from_config`` takes it; ``None``, or a class that does not list it, leaves the class's
    default. Other classes ignore them.

    Args:
        config: The reranker configuration.
        block_cache_bytes: RAM budget of the reranker's tier of blocks outside a store, in
            bytes (default :data:`heedrank.config.BLOCK_CACHE_BUDGET`).
        passes: Query passes the reranker may run at once for concurrent calls (the service's
            rerank ``workers``; default 1).
    """
    cls = reranker_class(config.method)
    takes = cls.build_resources if isinstance(cls, TakesResources) else ()
    given = {"block_cache_bytes": block_cache_bytes, "passes": passes}
    resources = {k: v for k, v in given.items() if v is not None and k in takes}
    return cls.from_config(config, **resources) if resources else cls.from_config(config)


def open_index(path: str, **options: Any) -> Any:
    """Open an index directory (``heedrank.index.store.Index.open``)."""
    return _resolve(_INDEX_OPENER)(path, **options)


def dense_signal(index: Any = None) -> Any:
    """The ``dense`` signal of the default's scorer (``heedrank.index.cosines.DenseSignal``):
    an index's embedder and stored vectors (``None`` for an index without vectors), or, without
    an index, the packaged embedder's."""
    return _resolve(_DENSE_OF_INDEX)(index) if index is not None else _resolve(_DENSE_PACKAGED)()


def kv_codec(header: Any) -> Any:
    """The codec of a document KV store's dtype for ``header`` (``heedrank.index.kv.codec.codec_for``:
    byte counts, encoding and decoding of one block).

    Raises:
        ValidationError: a dtype without a codec.
    """
    return _resolve(_KV_CODEC)(header)


def parse_filter(filter: Any) -> Any:
    """A metadata filter in parsed form (``heedrank.index.filters.as_filter``): JSON is
    parsed, an already parsed filter is returned as it is, ``None``/``{}`` give ``None``.

    Raises:
        FilterError: an invalid filter (a ValidationError naming the offending clause).
    """
    return _resolve(_FILTER_PARSER)(filter)

"""Frozen configurations from which every stage can be built (e.g. by a Ray worker)."""

from __future__ import annotations

import logging
import operator
import os
from dataclasses import dataclass, field, replace
from typing import Any

from heedrank.errors import ValidationError
from heedrank.textrules import is_int

DEFAULT_MAX_DOC_TOKENS = 160
"""Per-document budget in LM tokens of a method without one of its own (ICR, BlockRank);
``blockrank-cached`` (the default) has 128, its weights card's."""

DEFAULT_RERANK_METHOD = "default"
"""The method name of the default reranker: an alias of the best measured configuration
(``blockrank-cached``, :data:`heedrank.reranker.options.DEFAULT_METHOD`)."""

DEFAULT_LM = "smollm2-135m-instruct"
"""Name of the packaged default reranker LM (SmolLM2-135M-Instruct; the packaged LMs: :mod:`heedrank.reranker.lm`)."""

ENV_PREFIX = "HEEDRANK_"
"""Prefix of every setting's environment variable (:class:`heedrank.settings.Settings`)."""


@dataclass(frozen=True)
class ByteBudget:
    """One RAM budget in bytes: the single definition of its :class:`heedrank.settings.Settings`
    field, environment variable, default and meaning.

    The service reads it through ``Settings`` and hands the number down (to
    :meth:`heedrank.index.store.Index.open`, to the reranker factory). Code that builds a
    store or a reranker without a number (a script, a test, a CLI command without the
    setting) gets :meth:`from_env`: the same variable, default and checks.

    Attributes:
        name: The ``Settings`` field (``kv_cache_bytes``).
        default: Bytes when unset.
        description: What the budget bounds.
    """

    name: str
    default: int
    description: str

    @property
    def env(self) -> str:
        """The environment variable: ``HEEDRANK_`` + the upper-cased field name."""
        return ENV_PREFIX + self.name.upper()

    def parse(self, raw: Any) -> int:
        """``raw`` as a byte count: an int ``>= 0``, or a string of one (spaces around and
        ``_`` separators allowed, ``"1_073_741_824"``); ``None`` or a blank string is the default.

        Raises:
            ValidationError: not a whole number, or negative (the message names :attr:`env`).
        """
        if raw is None or (isinstance(raw, str) and not raw.strip()):
            return self.default
        try:
            if isinstance(raw, bool) or not isinstance(raw, (int, str)):
                raise ValueError(raw)
            value = raw if isinstance(raw, int) else int(raw.strip().replace("_", ""))
        except ValueError:
            raise ValidationError(f"{self.env}={raw!r} must be a whole number of bytes (e.g. {self.default})") from None
        if value < 0:
            raise ValidationError(f"{self.env}={raw!r} must be >= 0 bytes")
        return value

    def from_env(self) -> int:
        """The budget from :attr:`env` (:meth:`parse`), else :attr:`default`.

        Raises:
            ValidationError: an invalid value.
        """
        return self.parse(os.environ.get(self.env))


KV_CACHE_BUDGET = ByteBudget(
    "kv_cache_bytes", 512 * 2**20,
    "RAM LRU of each document KV store, in bytes: blocks decoded from disk (float16 in the service), "
    "so that candidates repeated across queries skip the read; 0 disables it.",
)
"""``HEEDRANK_KV_CACHE_BYTES`` (512 MiB): the RAM LRU in front of each document KV store
(:class:`heedrank.index.kv.KVStore`)."""

BLOCK_CACHE_BUDGET = ByteBudget(
    "block_cache_bytes", 1 << 30,
    "RAM cache of cached BlockRank's candidate blocks that come from no store (documents sent to /rerank), "
    "in bytes, keyed by the hash of their tokens; 0 disables it.",
)
"""``HEEDRANK_BLOCK_CACHE_BYTES`` (1 GiB): cached BlockRank's RAM tier of blocks not in a
store (:class:`heedrank.reranker.doccache.BlockSource`)."""


@dataclass(frozen=True)
class KVTiers:
    """The document KV store's disk tier (:class:`heedrank.index.kv.KVStore`): a byte budget,
    what is evicted to stay within it, and what is admitted. The RAM tier in front of it is
    :data:`KV_CACHE_BUDGET`.

    Attributes:
        disk_bytes: Live payload bytes the store may hold on disk (shard files stay within
            about ``1.25 x`` of it); ``None``: unbounded (a full prebuild).
        eviction: ``"lru"``, ``"lfu"`` or ``"fifo"``: which blocks go first when a new one needs room.
        admit_after: A block a search encodes is written on its ``n``-th use (within the
            last 100,000 distinct blocks), so that a one-off candidate does not evict a popular
            one; while the store has room for it, every block is written (nothing is evicted);
            the background fill and ``index kv build`` are not subject to it. ``None``:
            2 with a disk budget, 1 (every block) without.
    """

    disk_bytes: int | None = None
    eviction: str = "lru"
    admit_after: int | None = None

    def store_options(self) -> dict[str, Any]:
        """The keywords of :meth:`heedrank.index.kv.KVStore.open_or_create`."""
        admit = self.admit_after if self.admit_after is not None else (2 if self.disk_bytes else 1)
        return {"disk_budget": self.disk_bytes, "eviction": self.eviction, "admit_after": admit}


@dataclass(frozen=True)
class RerankerConfig:
    """How to build a reranker: a frozen record, picklable (a Ray actor builds its reranker
    from it).

    The options are typed once, when the configuration is made: ``method`` is resolved to the
    registered method it names (``"default"`` becomes ``"blockrank-cached"``) and ``options``,
    given as a mapping (``--opt KEY=VALUE``, a request body, a Python caller) or as that
    method's options object, becomes the method's frozen options object
    (:mod:`heedrank.reranker.options`: ``ICROptions``, ``BlockRankOptions``,
    ``CachedBlockRankOptions``; a registered plugin without an options class keeps a ``dict``).
    :func:`dataclasses.replace` keeps the typed object; replacing ``method`` drops options that
    are all defaults and refuses set ones (they are another method's).

    Attributes:
        method: Registry name (``"icr"``, ``"blockrank"``, ``"blockrank-cached"``) or
            ``"default"``; stored as the registered name.
        model: LM to read attention from: ``None`` or ``"smollm2-135m-instruct"`` for the
            packaged default, an opt-in packaged one (``"gemma3-270m"``,
            ``"qwen2.5-coder-0.5b-instruct"``; :func:`heedrank.reranker.lm.packaged_models`), or
            a local Hugging Face causal-LM directory.
        max_doc_tokens: Per-document budget in LM tokens; longer documents are truncated
            and reported in :attr:`heedrank.protocols.RerankResult.truncated`. ``None`` =
            the method's own (:meth:`resolved`; 128 for ``blockrank-cached``, else
            :data:`DEFAULT_MAX_DOC_TOKENS`).
        device: torch device (``"cpu"``, ``"cuda"``, ``"cuda:1"``).
        dtype: Compute dtype (``"float32"``; ``"bfloat16"`` only on accelerators).
        cache_dir: Where converted model copies are cached; ``None`` = ``$HEEDRANK_CACHE_DIR``
            or ``~/.cache/heedrank``.
        options: The method's typed options (see above; ``options.to_dict()`` for reports).

    Raises:
        ValidationError: unknown option names (the message lists the valid ones), bad values.
        UnknownNameError: is not raised here; an unknown method fails when it is built.
    """

    method: str = DEFAULT_RERANK_METHOD
    model: str | None = None
    max_doc_tokens: int | None = None
    device: str = "cpu"
    dtype: str = "float32"
    cache_dir: str | None = None
    options: Any = None

    def __post_init__(self) -> None:
        from heedrank.registry import resolve_method, typed_options

        method = resolve_method(self.method)
        object.__setattr__(self, "method", method)
        object.__setattr__(self, "options", typed_options(method, self.options))

    @property
    def option_values(self) -> dict[str, Any]:
        """Every option with its value, JSON-ready (``options.to_dict()``; a plugin's dict as given)."""
        to_dict = getattr(self.options, "to_dict", None)
        return dict(to_dict() if to_dict is not None else self.options)

    @property
    def given_options(self) -> dict[str, Any]:
        """The options that differ from the method's defaults, JSON-ready: what a report, a run
        name or a progress header records (every option of a plugin without an options class)."""
        values = self.option_values
        if not hasattr(self.options, "to_dict"):
            return values
        defaults = type(self.options)().to_dict()
        return {k: v for k, v in values.items() if defaults.get(k) != v}

    def with_options(self, **options: Any) -> RerankerConfig:
        """This configuration with ``options`` set over its own (parsed again: a boundary)."""
        return replace(self, options={**self.option_values, **options})

    @property
    def doc_tokens(self) -> int:
        """``max_doc_tokens``, or the method's own budget when it is ``None``."""
        if self.max_doc_tokens is not None:
            return int(self.max_doc_tokens)
        from heedrank.registry import default_max_doc_tokens

        return default_max_doc_tokens(self.method)

    def resolved(self) -> RerankerConfig:
        """This configuration with ``max_doc_tokens`` filled in (:attr:`doc_tokens`)."""
        return self if self.max_doc_tokens is not None else replace(self, max_doc_tokens=self.doc_tokens)


def _bounded(name: str, value: Any, high: int) -> int:
    """``value`` as an int in ``1..high``; else ValidationError ``"<name> must be between 1 and <high>, got <value>"``."""
    try:
        n = operator.index(value)
    except TypeError:
        n = None
    if n is None or isinstance(value, bool) or not 1 <= n <= high:
        raise ValidationError(f"{name} must be between 1 and {high}, got {value!r}")
    return n


@dataclass(frozen=True)
class SearchLimits:
    """The bounds of the searches a :class:`heedrank.pipeline.Pipeline` accepts; every pipeline
    is constructed with one, and its :meth:`~heedrank.pipeline.Pipeline.validate` is the one
    place they are checked (the API fills them from its settings, ``HEEDRANK_MAX_TOP_K`` and
    ``HEEDRANK_MAX_CANDIDATES``; see :meth:`heedrank.settings.Settings.search_limits`).

    Attributes:
        max_top_k: Largest ``top_k`` a search may ask for.
        max_candidates: Largest number of candidates a search may send to the reranker.

    Raises:
        ValidationError: a bound below 1.
    """

    max_top_k: int = 100
    max_candidates: int = 100

    def __post_init__(self) -> None:
        for name in ("max_top_k", "max_candidates"):
            value = getattr(self, name)
            if not is_int(value) or value < 1:
                raise ValidationError(f"{name} must be an integer >= 1, got {value!r}")

    def check_top_k(self, top_k: Any) -> int:
        """``top_k`` if it is an integer in ``1..max_top_k``. Raises ValidationError."""
        return _bounded("top_k", top_k, self.max_top_k)

    def check_candidates(self, candidates: Any) -> int:
        """``candidates`` if it is an integer in ``1..max_candidates``. Raises ValidationError."""
        return _bounded("candidates", candidates, self.max_candidates)


@dataclass(frozen=True)
class PipelineConfig:
    """How to build a :class:`heedrank.pipeline.Pipeline`.

    Attributes:
        index_dir: Index directory written by ``heedrank index build``.
        reranker: Base reranker configuration; ``method`` names the default reranker, and
            other methods reuse the same model and ``max_doc_tokens``.
        max_top_k: Largest ``top_k`` a search may ask for.
        max_candidates: Largest number of candidates a search may send to the reranker.
        show_progress: Progress bars on long loops.
        kv_tiers: The document KV store's disk budget, eviction and admission
            (:class:`KVTiers`; ``None``: unbounded, every block written).
        kv_cache_bytes: RAM LRU of the index's document KV store, bytes
            (:data:`KV_CACHE_BUDGET`; ``None``: its environment variable or default).
        block_cache_bytes: RAM tier of cached BlockRank's blocks outside a store, bytes
            (:data:`BLOCK_CACHE_BUDGET`; ``None``: its environment variable or default).
    """

    index_dir: str
    reranker: RerankerConfig = field(default_factory=RerankerConfig)
    max_top_k: int = 100
    max_candidates: int = 100
    show_progress: bool = False
    kv_cache_bytes: int | None = None
    kv_tiers: KVTiers | None = None
    block_cache_bytes: int | None = None

    @property
    def limits(self) -> SearchLimits:
        """The :class:`SearchLimits` of the pipeline built from this configuration."""
        return SearchLimits(max_top_k=self.max_top_k, max_candidates=self.max_candidates)


NOISY_LOGGERS = ("faiss", "faiss.loader", "httpx", "urllib3", "filelock", "datasets", "sentence_transformers",
                 "transformers", "bm25s")
"""Libraries whose INFO lines read like errors or repeat per request ("Could not load library with AVX512
support", one line per HTTP call), or that log at DEBUG on their own (bm25s sets its logger to DEBUG):
the CLI and the service show them from WARNING up."""


def is_library_noise(record: logging.LogRecord) -> bool:
    """A record below WARNING from one of :data:`NOISY_LOGGERS` (or a child logger). A handler
    filter, because a library may set its logger's level when it is first imported (bm25s sets
    DEBUG), after the CLI set it."""
    return record.levelno < logging.WARNING and record.name.split(".")[0] in NOISY_LOGGERS

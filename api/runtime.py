"""What the service holds while it runs: collections, the shared reranker cache, the
inference pools, metrics and the model-loading state.

Start-up (:meth:`Runtime.open`, called by the app's lifespan) opens every collection's
index (a missing index fails start-up), starts the pools, and starts loading the
configured reranker's model in a background thread; until it is loaded, ``status`` is
``"loading"`` and compute routes answer 503 ``unhealthy``. Then ``"ok"``, or ``"failed"``
(with the error) if loading failed, or if a collection's document KV store was built for
another configuration than the loaded reranker's (cached BlockRank: the message names the
``heedrank index kv build`` command that rebuilds it).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any, Literal

from heedrank.api.costs import MethodCosts
from heedrank.api.deadline import FallbackCosts
from heedrank.api.fill import QuietGate
from heedrank.api.inference import InferencePool
from heedrank.api.metrics import Metrics
from heedrank.errors import NotFoundError, UnhealthyError
from heedrank.pipeline import NO_RERANK, Pipeline, RerankerCache, reranker_factory
from heedrank.protocols import Preloadable
from heedrank.settings import Settings

logger = logging.getLogger(__name__)

LOAD_PROGRESS_SECONDS = 10.0
"""While the models load in the background, a log line says what is loading every this many seconds."""

Status = Literal["loading", "ok", "failed"]


class Runtime:
    """Collections, reranker cache, pools, metrics and readiness of one app.

    Args:
        settings: Service settings.
        collections: Pipelines by collection name, the default collection included.
        owned: Names of the collections this runtime opened (and closes).
    """

    def __init__(self, settings: Settings, collections: Mapping[str, Pipeline], owned: set[str] | None = None) -> None:
        if settings.default_collection not in collections:
            raise ValueError(f"the default collection {settings.default_collection!r} is missing")
        self.settings = settings
        self.collections = dict(collections)
        self.owned = set(owned or ())
        default = self.collections[settings.default_collection]
        self.rerankers: RerankerCache | None = default.rerankers
        self.metrics = Metrics()
        self.costs = MethodCosts()
        self.fallback_costs = FallbackCosts()
        """What each route's deadline fallback costs, reserved from its requests' windows
        (:mod:`heedrank.api.deadline`)."""
        self.pools = {
            "search": InferencePool("search", settings.search_workers, settings.search_queue_size,
                                    observe=self.metrics.observer("search")),
            "rerank": InferencePool("rerank", settings.workers, settings.queue_size,
                                    max_wait=settings.max_queue_wait_s, observe=self.metrics.observer("rerank")),
            # durable writes finish once started, even when their caller stops waiting
            "ingest": InferencePool("ingest", settings.ingest_workers, settings.ingest_queue_size,
                                    observe=self.metrics.observer("ingest"), stop_abandoned=False),
        }
        self.metrics.watch_pools(self.pools)
        self.quiet = QuietGate([self.pools["rerank"], self.pools["search"]], hold=settings.fill_hold_s)
        """When background LM work (the fill, upserted documents' blocks) may go on: no request
        queued or running in the ``rerank`` and ``search`` pools for ``fill_hold_s`` seconds."""
        self.status: Status = "loading"
        self.error: str | None = None
        self.started = time.time()
        self.load_seconds: float | None = None
        self._loader: threading.Thread | None = None
        self.fillers: dict[str, Any] = {}
        """Per collection, the background fill of its document KV store
        (:class:`heedrank.api.fill.BlockFiller`), started once the models are loaded."""
        self.background: set[asyncio.Task[Any]] = set()
        """Best-effort tasks started after an acknowledgement (block encoding after writes);
        held here so they are not collected, and cancelled by :meth:`close`."""

    def spawn(self, coroutine: Any) -> asyncio.Task[Any]:
        """Run ``coroutine`` as a background task of this runtime (on the running loop);
        :meth:`close` cancels the ones still running."""
        task = asyncio.get_running_loop().create_task(coroutine)
        self.background.add(task)
        task.add_done_callback(self.background.discard)
        return task

    # -- construction ----------------------------------------------------------------
    @classmethod
    def open(cls, settings: Settings, pipeline: Pipeline | None = None,
             collections: Mapping[str, Pipeline] | None = None) -> Runtime:
        """Open the configured collections (blocking: run it in a thread).

        Args:
            settings: Service settings (``index``, ``collections``, reranker).
            pipeline: A ready pipeline for the default collection (not closed on shutdown).
            collections: Ready pipelines of named collections (not closed on shutdown);
                configured collections missing here are opened from their directories.

        Raises:
            NotFoundError, IndexMismatchError: an index that cannot be opened.
        """
        given = dict(collections or {})
        if pipeline is not None:
            given[settings.default_collection] = pipeline
        dirs = settings.collection_dirs()
        shared = next((p.rerankers for p in given.values() if p.rerankers is not None), None)
        if shared is None:
            shared = RerankerCache(reranker_factory(settings.pipeline_config().reranker,
                                                    block_cache_bytes=settings.block_cache_bytes,
                                                    passes=settings.workers))
        opened: dict[str, Pipeline] = {}
        try:
            for name, path in dirs.items():
                if name in given:
                    continue
                logger.info("opening collection %r (%s)", name, path)
                opened[name] = Pipeline.from_config(settings.pipeline_config(path), rerankers=shared)
        except BaseException:
            for p in opened.values():
                p.close()
            raise
        ordered = {name: given.get(name) or opened[name] for name in dirs}
        ordered.update({k: v for k, v in given.items() if k not in ordered})
        return cls(settings, ordered, owned=set(opened))

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> None:
        """Start the pools and load the models in the background (progress bars off: the
        service logs lines, :func:`heedrank.progress.quiet_progress_bars`)."""
        from heedrank.progress import quiet_progress_bars

        quiet_progress_bars()
        for pool in self.pools.values():
            pool.start()
        method = self.settings.rerank_method
        if not self.settings.preload or method == NO_RERANK or self.rerankers is None:
            self._set_status("ok")
            return
        self._loader = threading.Thread(target=self._load, args=(method,), name="heedrank-loader", daemon=True)
        self._loader.start()

    def _warm_encoders(self) -> None:
        """Load the dense query encoders of the collections that have vectors (they load
        lazily otherwise, on the first dense search)."""
        for name, p in self.collections.items():
            index = p.index
            if index is None or "dense" not in p.retrievers:
                continue
            try:
                _ = index.encoder.model
            except Exception as exc:  # dense search will report it; BM25 still works
                logger.warning("collection %r: loading the query encoder failed: %s", name, exc)

    def _load(self, method: str) -> None:
        t0 = time.perf_counter()
        stage = ["the query encoders"]
        done = threading.Event()

        def heartbeat() -> None:  # progress while the models load (a first load converts the LM: a minute or more)
            while not done.wait(LOAD_PROGRESS_SECONDS):
                logger.info("still loading (%s), %.0f s so far; /health says 'loading' until it is done",
                            stage[0], time.perf_counter() - t0)

        threading.Thread(target=heartbeat, name="heedrank-load-progress", daemon=True).start()
        try:
            if self.settings.torch_threads is not None:
                import torch

                torch.set_num_threads(self.settings.torch_threads)
            self._warm_encoders()
            logger.info("loading reranker %r", method)
            stage[0] = f"reranker {method!r}: its LM and weights"
            reranker = self.rerankers.get(method)[0]  # type: ignore[union-attr]
            if isinstance(reranker, Preloadable):  # a plug-in without load() loads on first use
                reranker.load()
            stage[0] = "checking the document KV stores"
            self._check_block_stores(reranker)
            if self.settings.warmup:
                stage[0] = "a warm-up reranking"
                self._warm_up(reranker)
            if self.settings.fill_blocks:
                self._start_fill(method)
        except Exception as exc:
            logger.exception("loading reranker %r failed", method)
            self.error = f"loading reranker {method!r} failed: {exc}"
            self._set_status("failed")
            return
        finally:
            done.set()
        self.load_seconds = time.perf_counter() - t0
        logger.info("reranker %r ready in %.1f s", method, self.load_seconds)
        self._set_status("ok")

    def _check_block_stores(self, reranker: Any) -> None:
        """Open each collection's document KV store for the start-up reranker
        (:meth:`heedrank.blocks.BlockSync.check_at_startup`), so that a store built for
        another configuration fails start-up (status ``failed``, the message naming the
        rebuild command) instead of the first search.

        Raises:
            KVStoreMismatchError: a collection's store was built for another configuration.
        """
        for name, p in self.collections.items():
            p.blocks.check_at_startup(reranker, collection=name)

    def _start_fill(self, method: str) -> None:
        """Start the background fill of every collection's document KV store for the start-up
        reranker, and route the blocks a search skips (its recompute budget spent) to it."""
        from heedrank.api.fill import BlockFiller

        assert self.rerankers is not None
        reranker, lock = self.rerankers.get(method)
        by_store: dict[int, Any] = {}
        for name, p in self.collections.items():
            if p.index is None:
                continue
            filler = BlockFiller(p.index, reranker, lock, self.quiet, name=name).start()
            if filler.running:
                self.fillers[name] = filler
                by_store[id(filler.store)] = filler

        def listener(_reranker: Any, store: Any, documents: Any) -> None:
            filler = by_store.get(id(store))
            if filler is not None:
                filler.offer(documents)

        if by_store:
            self.rerankers.cold_listener = listener

    WARMUP_DOCUMENTS = 4

    def _warm_up(self, reranker: Any) -> None:
        """One reranking of ``WARMUP_DOCUMENTS`` passages of about 100 words (first-call
        costs out of the way) whose time seeds the rerank pool's seconds-per-document."""
        from heedrank.types import Document, Query

        words = ("attention reranking reads which passages a language model looks at when it reads a query "
                 "and scores each passage by the attention it draws ").split()
        docs = [Document(f"warmup-{i}", " ".join(words[(i + j) % len(words)] for j in range(100)))
                for i in range(self.WARMUP_DOCUMENTS)]
        t0 = time.perf_counter()
        reranker.rerank(Query("warmup", "which passages does the model attend to"), docs)
        seconds = time.perf_counter() - t0
        self.pools["rerank"].seed(seconds / len(docs))
        logger.info("warm-up reranking of %d documents took %.2f s", len(docs), seconds)
        self._measure_costs(reranker)

    def _measure_costs(self, reranker: Any) -> None:
        """Time the served method's cost per candidate, cold and warm (:func:`heedrank.api.costs.measure`,
        :data:`~heedrank.api.costs.COST_DOCUMENTS` documents), and seed :attr:`costs` with it, so
        that ``GET /info``'s ``reranker.limits`` and the over-budget 422s hold from the first
        request; the cold figure (a new document's cost) also seeds the rerank pool's seconds per
        document. A failure is logged: the figures are then learned from the requests."""
        from heedrank import registry
        from heedrank.api.costs import measure
        from heedrank.capabilities import reads_stored_blocks

        assert self.rerankers is not None
        cache, method = self.rerankers, registry.resolve_method(self.settings.rerank_method)
        t0 = time.perf_counter()
        try:
            warm, cold = measure(lambda q, d: cache.rerank(q, d, method).result, stored_blocks=reads_stored_blocks(reranker))
        except Exception as exc:  # best effort: the service serves without the prior
            logger.warning("timing reranker %r per candidate failed: %s", method, exc)
            return
        self.costs.seed(method, warm, cold)
        if cold is not None:  # a truer start for the pool's wait estimate than the first call (its one-off costs)
            self.pools["rerank"].seed(cold)
        logger.info("reranker %r costs %s s per candidate warm, %s s cold (timed in %.1f s)", method,
                    "?" if warm is None else f"{warm:.3f}", "?" if cold is None else f"{cold:.3f}",
                    time.perf_counter() - t0)

    def _set_status(self, status: Status) -> None:
        self.status = status
        self.metrics.ready.set(1 if status == "ok" else 0)

    def wait_ready(self, timeout: float | None = None) -> bool:
        """Block until loading has ended (ok or failed); whether it did within ``timeout``."""
        if self._loader is not None:
            self._loader.join(timeout)
        return self.status != "loading"

    def close(self) -> None:
        """Cancel background tasks, stop the pools (waiting jobs fail with 503) and close the
        collections opened here."""
        for task in list(self.background):
            task.cancel()
        for filler in self.fillers.values():
            filler.stop()
        for pool in self.pools.values():
            pool.close()
        for name in self.owned:
            try:
                self.collections[name].close()
            except Exception:  # pragma: no cover - best effort at shutdown
                logger.exception("closing collection %r failed", name)

    # -- requests --------------------------------------------------------------------
    def require_ready(self) -> None:
        """Raises UnhealthyError (503) while models load or after loading failed."""
        if self.status == "loading":
            raise UnhealthyError("models are still loading; retry shortly (GET /health says when they are ready)")
        if self.status == "failed":
            raise UnhealthyError(f"the service is unhealthy: {self.error}")

    def pipeline(self, collection: str | None) -> Pipeline:
        """The pipeline of ``collection`` (default collection when ``None``).

        Raises:
            NotFoundError: unknown collection; the message lists the known ones.
        """
        name = collection or self.settings.default_collection
        try:
            return self.collections[name]
        except KeyError:
            raise NotFoundError(f"unknown collection {name!r}; choose one of {sorted(self.collections)}") from None

    def describe(self) -> dict[str, Any]:
        """Collections with live document counts (for ``/info``)."""
        out = {}
        for name, p in self.collections.items():
            try:
                count = len(p.docstore)
            except Exception:  # pragma: no cover - a store that cannot count
                count = None
            out[name] = {**dict(p.describe_index), "num_docs": count, "retrievers": sorted(p.retrievers)}
            filler = self.fillers.get(name)
            if filler is not None:
                out[name]["kv_store"] = filler.describe()
        return out


def lm_name(model: str | None) -> str:
    """Short name of a reranker LM setting: the packaged name, or a directory's name."""
    from pathlib import Path

    if model is None:
        from heedrank.config import DEFAULT_LM

        return DEFAULT_LM
    return Path(model).name or model


def native_model_ids(settings: Settings) -> list[str]:
    """The served reranker's own ids: method, LM name, ``<lm>/<method>``, then ``<name>`` and
    ``<lm>/<name>`` for the method's other names (``default`` and the method it names)."""
    from heedrank import registry

    lm = lm_name(settings.model)
    method = settings.rerank_method
    served = registry.resolve_method(method)
    names = [served, *sorted(a for a, target in registry.reranker_aliases().items() if target == served)]
    return [method, lm, f"{lm}/{method}"] + [i for n in names if n != method for i in (n, f"{lm}/{n}")]


CLIENT_MODEL_IDS = ("rerank-v3.5", "rerank-english-v3.0", "rerank-multilingual-v3.0", "rerank-english-v2.0",
                    "rerank-multilingual-v2.0", "rerank-2", "rerank-2-lite", "rerank-lite-1")
"""Model ids that rerank clients send (Cohere's SDK and LangChain's ``CohereRerank`` require one;
Voyage's ``rerank-2``): served by the service's method out of the box, without a warning."""


def served_model_ids(settings: Settings) -> list[str]:
    """The ``model`` values ``POST /rerank`` names as its own: method, LM name, ``<lm>/<method>``,
    the external ids of ``settings.model_aliases`` (``'*'``, any id, is not listed) and
    :data:`CLIENT_MODEL_IDS`. Any other id is served too, by the service's one method, with a
    warning (:func:`resolve_model`)."""
    native = native_model_ids(settings)
    listed = native + [k for k in settings.model_aliases if k != "*" and k not in native]
    return listed + [k for k in CLIENT_MODEL_IDS if k not in listed]


def check_model_aliases(settings: Settings) -> None:
    """Fail at start-up on an alias that maps to nothing served.

    Raises:
        ValueError: an alias whose target is not one of :func:`native_model_ids`.
    """
    native = native_model_ids(settings)
    for alias, target in settings.model_aliases.items():
        if target not in native:
            raise ValueError(f"model alias {alias!r} maps to {target!r}, which is not served here; map it to one of "
                             f"{native} (HEEDRANK_MODEL_ALIASES)")


def resolve_model(settings: Settings, model: str | None) -> tuple[str | None, str | None]:
    """The served id ``model`` names, and a warning for an id this service does not know.

    ``/rerank`` has one method (the service's), so every id is served by it: a native id as
    itself, an alias as its target (``HEEDRANK_MODEL_ALIASES``, ``'*'`` for any other), a
    :data:`CLIENT_MODEL_IDS` id as the method, and any other id as the method with a warning
    that says which method and LM answered.
    """
    if model is None or model in native_model_ids(settings):
        return model, None
    target = settings.model_aliases.get(model) or settings.model_aliases.get("*")
    if target is not None:
        return target, None
    served = f"{lm_name(settings.model)}/{settings.rerank_method}"
    if model in CLIENT_MODEL_IDS:
        return settings.rerank_method, None
    return settings.rerank_method, (f"model {model!r} is not a model id of this service; {served} answered "
                                    f"(ids: {served_model_ids(settings)})")

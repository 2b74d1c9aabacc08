"""Batch reranking and evaluation beyond one machine, on Ray (``--engine ray``).

The local engine (this process, one query at a time) stays the default and needs no Ray;
Ray is imported only here, lazily, and a missing Ray raises
:class:`~attnrank.errors.MissingDependencyError` naming ``pip install 'attnrank[ray]'``.

How a run is laid out (the same for ``rerank-batch`` and ``eval beir|trec-dl``):

* **Driver** (the process that ran the command): reads the topics and the first stage,
  decides which queries are still to do (``rerank-batch``'s resume rules: the
  ``<out>.progress`` sidecar, see :mod:`attnrank.eval.batch`), runs the first stage and
  hydrates each query's top ``max(top_k, candidates)`` hits from the document store. Each
  query becomes one self-contained row: query, first-stage hits with scores, and the
  passages. Workers therefore need no index directory, run file or shared filesystem, only
  the package and the LM.
* **Ray Data**: ``ray.data.from_items(rows)`` then ``map_batches`` over an actor pool
  (:class:`ray.data.ActorPoolStrategy`, ``size = actors``). Each actor builds its reranker
  once from the frozen :class:`~attnrank.config.RerankerConfig` (the pipeline's reranker
  factory, shipped by value) and loads the LM in its constructor; per batch it builds a
  :class:`~attnrank.pipeline.Pipeline` over the batch's rows (a
  :class:`~attnrank.retriever.run.RunRetriever` and an
  :class:`~attnrank.index.memory.InMemoryDocStore`) sharing that reranker, and runs the very
  code of the local engine on each query (:func:`attnrank.eval.batch.rerank_query`, failure
  isolation included, or :meth:`Pipeline.search`). Rows and results cross as JSON
  (floats as ``repr``, so scores round-trip exactly).
* **Driver** again: results come back in input order (``preserve_order``; a reorder
  buffer on ``seq`` as well) and are committed one by one as the local engine does
  (:func:`attnrank.eval.batch.commit_outcome`: output fsync'd, then the progress line). So
  for the same input and configuration the output is byte-identical to ``--engine local``,
  an interrupted Ray run resumes with either engine, and the eval report equals a local
  run's apart from timings (plus ``params.engine``).

Faults: an actor that dies (killed, OOM, node lost) is restarted by Ray (``max_restarts``)
and the batch it held is retried on the new actor (``max_task_retries``); results already
committed stay committed and the output is still complete and identical. An error inside a
worker that the local engine would raise (a model that cannot load, a missing dependency,
a bad option) is sent back as a typed error and raised on the driver, so the CLI prints one
line and exits 2, with everything committed so far kept for a rerun.

The document KV store is built the same way (``attnrank index kv build --engine ray``,
:func:`build_index_blocks_ray`): the driver keys the blocks and commits, actors encode and
write; each actor writes its own part store (:func:`build_kv_shard`) into the index
directory, which therefore must be on a filesystem every node mounts at the same path, and
the driver adopts each part into the store's manifest atomically
(:meth:`attnrank.index.kvstore.KVStore.adopt`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from attnrank.errors import AttnrankError, ValidationError, require
from attnrank.pipeline import NO_RERANK, Pipeline, RerankerCache, SearchOptions, SearchResult
from attnrank.protocols import Preloadable, RerankResult
from attnrank.types import Document, Query, Ranking, ScoredDoc

if TYPE_CHECKING:
    from attnrank.eval.batch import BatchSummary, Progress
    from attnrank.eval.harness import EngineSearch

logger = logging.getLogger(__name__)

RAY_EXTRA = "ray"
"""The optional extra that installs Ray: ``pip install 'attnrank[ray]'`` (``ray[data]``)."""
ENGINES = ("local", "ray")
"""Engine names of ``--engine``."""
_RUN = "ray-run"
"""Name of the per-batch first stage inside a worker."""
_MAX_BLOCKS = 10_000


class RayExecutionError(AttnrankError):
    """Ray could not run the job (workers kept dying, the cluster went away, a worker raised
    an untyped error). Queries committed before it stay committed; a rerun resumes."""

    error_type = "ray"
    status_code = 500


def require_ray() -> Any:
    """The ``ray`` module, with Ray Data importable.

    Raises:
        MissingDependencyError: Ray (or Ray Data's dependencies) is not installed; the
            message names ``pip install 'attnrank[ray]'``.
    """
    ray = require("ray", RAY_EXTRA)
    require("ray.data", RAY_EXTRA)
    return ray


# ---------------------------------------------------------------------------- options
@dataclass(frozen=True)
class RayOptions:
    """Where and how to run on Ray.

    Attributes:
        address: Cluster to join (``"auto"``, ``"ray://head:10001"``, ``"head:6379"``);
            ``None`` = ``$RAY_ADDRESS`` if set, else a local Ray instance started for the run
            (and stopped after it). A Ray already initialised in this process is used as is.
        actors: Actor pool size: reranker replicas, each loading the LM once.
        num_cpus: CPUs reserved per actor; also the actor's torch thread count (rounded
            down, at least 1).
        num_gpus: GPUs per actor (``0`` on CPU; ``1`` or a fraction on GPU nodes, with
            ``--device cuda``).
        batch_size: Queries per ``map_batches`` call (one query takes seconds, so 1 keeps
            the actors evenly loaded).
        max_restarts: Restarts per actor after it dies (``-1`` = unlimited, Ray Data's default).
        max_task_retries: Retries of a batch whose actor died (``-1`` = unlimited). Bounded by
            default so that a query that kills its actor every time fails the run instead of
            looping; the committed queries stay and a rerun resumes.
        object_store_memory: Object store bytes of a local Ray instance started for the run
            (``None`` = Ray's default); a cluster's is set by ``ray start``.
        worker_setup: Called once in each actor before anything else (e.g. to register a
            custom reranker in :mod:`attnrank.registry`); shipped by value. Not for the CLI.
    """

    address: str | None = None
    actors: int = 1
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    batch_size: int = 1
    max_restarts: int = -1
    max_task_retries: int = 3
    object_store_memory: int | None = None
    worker_setup: Callable[[], Any] | None = None

    def __post_init__(self) -> None:
        def whole(name: str, low: int) -> None:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValidationError(f"ray {name} must be an integer >= {low}, got {value!r}")

        whole("actors", 1)
        whole("batch_size", 1)
        whole("max_restarts", -1)
        whole("max_task_retries", -1)
        for name in ("num_cpus", "num_gpus"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValidationError(f"ray {name} per actor must be a number >= 0, got {value!r}")
        if self.object_store_memory is not None and (
                isinstance(self.object_store_memory, bool) or not isinstance(self.object_store_memory, int)
                or self.object_store_memory < 1):
            raise ValidationError(f"ray object_store_memory must be a positive byte count, got {self.object_store_memory!r}")
        if self.address is not None and not str(self.address).strip():
            raise ValidationError("ray address must not be empty; leave it out to use $RAY_ADDRESS or a local instance")

    def describe(self) -> dict[str, Any]:
        """The options as JSON (recorded as ``params.engine`` of an eval report)."""
        d = asdict(self)
        d.pop("worker_setup")
        d["engine"] = "ray"
        return d


@dataclass
class RunStats:
    """Timings of the last :class:`RayEngine` run (logged; the figures in docs/RESULTS.md).

    Attributes:
        queries: Queries sent to the actors.
        prepare_seconds: Driver: first stage, hydration and rows.
        init_seconds: ``ray.init`` (0 when Ray was already up).
        first_result_seconds: From submitting the dataset to the first query finished by
            an actor (actor start-up, LM load and one query): Ray's fixed overhead with
            ``init_seconds``.
        run_seconds: From submitting the dataset to the last query committed.
        steady_seconds: From the first query finished to the last (actors' wall clocks):
            ``queries - 1`` queries at full speed.
        load_seconds: Slowest actor's reranker load.
    """

    queries: int = 0
    prepare_seconds: float = 0.0
    init_seconds: float = 0.0
    first_result_seconds: float = 0.0
    run_seconds: float = 0.0
    steady_seconds: float = 0.0
    load_seconds: float | None = None

    @property
    def queries_per_second(self) -> float:
        """Queries per second of the whole run (fixed overhead included)."""
        return self.queries / self.run_seconds if self.run_seconds > 0 else 0.0

    @property
    def steady_queries_per_second(self) -> float | None:
        """Queries per second once the first query is done (``None`` below 2 queries)."""
        return (self.queries - 1) / self.steady_seconds if self.queries > 1 and self.steady_seconds > 0 else None


@contextmanager
def ray_session(options: RayOptions) -> Iterator[float]:
    """Join (or start) Ray for one run; yields the seconds ``ray.init`` took.

    A Ray already initialised in this process (a test's session, a notebook) is used and
    left running; one started here is shut down afterwards.

    Raises:
        MissingDependencyError: Ray is not installed.
        RayExecutionError: the cluster cannot be reached.
    """
    ray = require_ray()
    started = False
    t0 = time.perf_counter()
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING}
        if options.address is not None:
            kwargs["address"] = options.address
        elif not os.environ.get("RAY_ADDRESS") and options.object_store_memory is not None:
            kwargs["object_store_memory"] = options.object_store_memory
        try:
            ray.init(**kwargs)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            where = options.address or os.environ.get("RAY_ADDRESS") or "a local instance"
            raise RayExecutionError(f"cannot start or join Ray at {where}: {exc}") from exc
        started = True
    init_seconds = time.perf_counter() - t0
    try:
        yield init_seconds
    finally:
        if started:
            ray.shutdown()


# ---------------------------------------------------------------------------- rows
def _first_stage(pipeline: Pipeline, queries: Sequence[Query], options: SearchOptions) -> tuple[list[Ranking], float, int]:
    """The first stage of every query at once (as :meth:`Pipeline.search_batch` runs it):
    ``(rankings, seconds per query, k1)``."""
    k1 = max(options.top_k, options.candidates) if options.rerank != NO_RERANK else options.top_k
    t0 = time.perf_counter()
    first = pipeline.retrievers[options.retriever].retrieve(list(queries), k1, filter=options.filter)
    return first, (time.perf_counter() - t0) / max(1, len(queries)), k1


def _row(seq: int, query: Query, ranking: Ranking, docs: Mapping[str, Document]) -> dict[str, Any]:
    """One self-contained row: the query, its first-stage hits (scores exact) and passages."""
    payload = {
        "qid": query.query_id, "text": query.text,
        "hits": [[h.doc_id, float(h.score)] for h in ranking.hits],
        "docs": [[d.doc_id, d.text, d.title, dict(d.metadata)] for d in docs.values()],
    }
    return {"seq": seq, "payload": json.dumps(payload, default=str)}


def _worker_pipeline(payloads: Sequence[Mapping[str, Any]], cache: RerankerCache | None, limits: Any) -> Pipeline:
    """A pipeline over one batch's rows, sharing the actor's rerankers."""
    from attnrank.index.memory import InMemoryDocStore
    from attnrank.retriever.run import RunRetriever

    run: dict[str, dict[str, float]] = {}
    docs: dict[str, Document] = {}
    for p in payloads:
        run[p["qid"]] = {doc_id: float(score) for doc_id, score in p["hits"]}
        for doc_id, text, title, metadata in p["docs"]:
            docs.setdefault(doc_id, Document(doc_id, text, title, metadata))
    return Pipeline({_RUN: RunRetriever(run, name=_RUN)}, InMemoryDocStore(docs.values()), rerankers=cache, limits=limits)


def _ranking_json(ranking: Ranking) -> list[list[Any]]:
    return [[h.doc_id, float(h.score)] for h in ranking.hits]


def _error_record(exc: BaseException) -> dict[str, Any]:
    attrs = {k: v for k, v in vars(exc).items() if isinstance(v, (str, int, float, bool, list, tuple, type(None)))}
    return {"type": type(exc).__name__, "module": type(exc).__module__, "message": str(exc), "attrs": attrs,
            "traceback": "".join(traceback.format_exception(exc))}


def _raise_remote(error: Mapping[str, Any]) -> NoReturn:
    """Raise a worker's error on the driver: the same typed error when it is one of
    :mod:`attnrank.errors`, else :class:`RayExecutionError` with the worker's traceback."""
    from attnrank import errors

    cls = getattr(errors, error["type"], None) if error.get("module") == errors.__name__ else None
    if isinstance(cls, type) and issubclass(cls, AttnrankError):
        exc = cls.__new__(cls)
        Exception.__init__(exc, error["message"])
        for key, value in error.get("attrs", {}).items():
            setattr(exc, key, tuple(value) if isinstance(value, list) and key == "fields" else value)
        raise exc
    raise RayExecutionError(f"a Ray worker failed: {error['type']}: {error['message']}\n"
                            f"worker traceback:\n{error.get('traceback', '')}")


class _Worker:
    """One actor of the pool: builds the reranker once (LM loaded in the constructor), then
    runs the local engine's code on each batch of rows.

    Args:
        mode: ``"batch"`` (:func:`attnrank.eval.batch.rerank_query`, one outcome per query)
            or ``"search"`` (:meth:`Pipeline.search`, one search result per query).
        factory: The driver pipeline's reranker factory (``None`` without reranking).
        limits: The driver pipeline's :class:`~attnrank.config.SearchLimits`.
        options: Validated search options (retriever and filter are replaced here: the
            first stage already ran on the driver).
        tag: Run tag (``"batch"``).
        setup: :attr:`RayOptions.worker_setup`.
        threads: torch threads (:attr:`RayOptions.num_cpus`).
    """

    def __init__(self, mode: str, factory: Any, limits: Any, options: SearchOptions, tag: str = "",
                 setup: Callable[[], Any] | None = None, threads: int = 1) -> None:
        self.mode, self.limits, self.tag = mode, limits, tag
        self.options = replace(options, retriever=_RUN, filter=None)
        self.cache = RerankerCache(factory) if factory is not None else None
        self.error: dict[str, Any] | None = None
        self.load_seconds: float | None = None
        self.reranker: Any = None
        try:
            if setup is not None:
                setup()
        except Exception as exc:  # noqa: BLE001 - a failing constructor would only be retried by Ray
            self.error = _error_record(exc)
            return
        if options.rerank != NO_RERANK:
            t0 = time.perf_counter()
            try:
                if self.cache is None:
                    raise ValidationError("reranking is disabled in this pipeline; use rerank='none'")
                self.reranker = self.cache.get(options.rerank, options.rerank_options)[0]
                if isinstance(self.reranker, Preloadable):
                    self.reranker.load()
                if "torch" in sys.modules:  # the LM's threads: the CPUs reserved for this actor
                    sys.modules["torch"].set_num_threads(threads)
            except Exception as exc:  # noqa: BLE001 - reported on the first batch, raised on the driver
                self.error = _error_record(exc)
            self.load_seconds = time.perf_counter() - t0

    def _describe(self) -> Any:
        from attnrank.eval.report import jsonable

        return jsonable(dict(self.reranker.describe())) if self.reranker is not None else None

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        seqs = [int(s) for s in batch["seq"]]
        if self.error is not None:
            return {"seq": seqs, "result": [json.dumps({"error": self.error})] * len(seqs)}
        payloads = [json.loads(p) for p in batch["payload"]]
        pipeline = _worker_pipeline(payloads, self.cache, self.limits)
        out = []
        for p in payloads:
            q = Query(p["qid"], p["text"])
            try:
                record = self._batch(pipeline, q) if self.mode == "batch" else self._search(pipeline, q)
            except Exception as exc:  # noqa: BLE001 - raised on the driver as the local engine would
                record = {"error": _error_record(exc)}
            record["done_at"] = time.time()  # wall clock: the throughput in RunStats
            out.append(record)
        describe = self._describe()
        return {"seq": seqs, "result": [json.dumps({**r, "describe": describe, "load_seconds": self.load_seconds,
                                                    "pid": os.getpid()}) for r in out]}

    def _batch(self, pipeline: Pipeline, q: Query) -> dict[str, Any]:
        from attnrank.eval.batch import rerank_query

        return {"outcome": rerank_query(pipeline, q, self.options, self.tag).to_dict()}

    def _search(self, pipeline: Pipeline, q: Query) -> dict[str, Any]:
        r = pipeline.search(q, self.options)
        rr = r.rerank
        return {
            "ranking": _ranking_json(r.ranking),
            "rerank": None if rr is None else {
                "ranking": _ranking_json(rr.ranking), "truncated": list(rr.truncated),
                "prompt_tokens": int(rr.prompt_tokens), "seconds": float(rr.seconds), "warnings": list(rr.warnings),
            },
            "rerank_seconds": float(r.timings.get("rerank", 0.0)),
        }


# ---------------------------------------------------------------------------- engine
class RayEngine:
    """Runs ``rerank-batch`` and the evaluators' searches on a Ray actor pool (see the module
    docstring). Use :meth:`run_batch` as :func:`attnrank.eval.batch.rerank_batch`'s
    ``runner`` and the engine itself as the evaluators' ``engine``.

    Args:
        options: Where and how to run (default: a local Ray instance, one actor).

    Raises:
        MissingDependencyError: Ray is not installed (checked here, before any data loads).
    """

    def __init__(self, options: RayOptions | None = None) -> None:
        self.options = options or RayOptions()
        require_ray()
        self.last_stats = RunStats()

    def __repr__(self) -> str:
        return f"RayEngine({self.options.describe()})"

    def describe(self) -> dict[str, Any]:
        """Options and Ray version (``params.engine`` of eval reports)."""
        import ray

        return {**self.options.describe(), "ray_version": ray.__version__}

    # -- rerank-batch ------------------------------------------------------------------
    def run_batch(self, pipeline: Pipeline, options: SearchOptions, todo: Sequence[Query], progress: Progress,
                  tag: str, summary: BatchSummary, show_progress: bool) -> None:
        """The Ray :data:`attnrank.eval.batch.BatchRunner`: reranks ``todo`` on the actor pool
        and commits each query in ``todo`` order."""
        from tqdm.auto import tqdm

        from attnrank.eval.batch import QueryOutcome, commit_outcome

        if not todo:
            return
        t0 = time.perf_counter()
        first, _, _ = _first_stage(pipeline, todo, options)
        rows = [_row(i, q, ranking, pipeline.docstore.get_many(ranking.doc_ids))
                for i, (q, ranking) in enumerate(zip(todo, first))]
        prepare = time.perf_counter() - t0
        bar: Any = tqdm(total=len(todo), desc=f"rerank-batch ({options.rerank}, ray x{self.options.actors})",
                        unit="query", disable=not show_progress)
        t_run = time.perf_counter()

        def commit(seq: int, record: Mapping[str, Any]) -> None:
            commit_outcome(progress, summary, QueryOutcome(**record["outcome"]))
            bar.update(1)
            elapsed = time.perf_counter() - t_run
            if show_progress and elapsed > 0:
                bar.set_postfix(qps=f"{summary.done / elapsed:.2f}", docs_s=f"{summary.documents / elapsed:.1f}",
                                failed=sum(len(v) for v in summary.failed_documents.values()))

        factory = pipeline.rerankers.factory if pipeline.rerankers is not None else None
        try:
            self._execute("batch", rows, factory, pipeline.limits, options, tag, commit, prepare)
        finally:
            bar.close()

    # -- evaluation --------------------------------------------------------------------
    def search(self, pipeline: Pipeline, queries: Sequence[Query], options: SearchOptions, *,
               show_progress: bool = True) -> EngineSearch:
        """:meth:`Pipeline.search_batch` on the actor pool, for :func:`attnrank.eval.harness.run_evaluation`:
        the first stage and hydration here, reranking on the actors."""
        from tqdm.auto import tqdm

        from attnrank.eval.harness import EngineSearch

        t0 = time.perf_counter()
        options = pipeline.validate(options)
        for q in queries:
            if not q.text or not q.text.strip():
                raise ValidationError(f"query {q.query_id!r} is empty; send a non-empty query text")
        reranking = options.rerank != NO_RERANK
        first, t_retrieve, k1 = _first_stage(pipeline, queries, options)
        rows, hydrated, t_hydrate = [], [], []
        for i, (q, ranking) in enumerate(zip(queries, first)):
            t1 = time.perf_counter()
            keep = ranking.top(k1)
            docs = pipeline.docstore.get_many(keep.doc_ids)
            hydrated.append(docs)
            t_hydrate.append(time.perf_counter() - t1)
            rows.append(_row(i, q, keep, docs))
        prepare = time.perf_counter() - t0
        results: list[SearchResult | None] = [None] * len(queries)
        info: dict[str, Any] = {"describe": None, "load": None}
        bar: Any = tqdm(total=len(queries), desc=f"search ({options.rerank}, ray x{self.options.actors})",
                        unit="query", disable=not show_progress)

        def collect(seq: int, record: Mapping[str, Any]) -> None:
            q, docs = queries[seq], hydrated[seq]
            final = Ranking(q.query_id, tuple(ScoredDoc(d, s, docs.get(d)) for d, s in record["ranking"]))
            rr = None
            if record["rerank"] is not None:
                r = record["rerank"]
                rr = RerankResult(Ranking(q.query_id, tuple(ScoredDoc(d, s) for d, s in r["ranking"])),
                                  tuple(r["truncated"]), r["prompt_tokens"], r["seconds"], {}, tuple(r["warnings"]))
            t_rerank = float(record["rerank_seconds"])
            timings = {"retrieve": t_retrieve, "hydrate": t_hydrate[seq], "rerank": t_rerank,
                       "total": t_retrieve + t_hydrate[seq] + t_rerank}
            results[seq] = SearchResult(q, final, first[seq], timings, rr)
            if record.get("describe") is not None:
                info["describe"] = record["describe"]
            if record.get("load_seconds") is not None:
                info["load"] = max(info["load"] or 0.0, float(record["load_seconds"]))
            bar.update(1)

        factory = pipeline.rerankers.factory if (reranking and pipeline.rerankers is not None) else None
        try:
            if queries:
                self._execute("search", rows, factory, pipeline.limits, options, "", collect, prepare)
        finally:
            bar.close()
        done = [r for r in results if r is not None]
        if len(done) != len(queries):  # pragma: no cover - _execute checks completeness
            raise RayExecutionError(f"Ray returned {len(done)} of {len(queries)} queries")
        return EngineSearch(done, info["load"] if reranking else None, info["describe"] if reranking else None,
                            self.describe())

    # -- the Ray Data job ----------------------------------------------------------------
    def _execute(self, mode: str, rows: list[dict[str, Any]], factory: Any, limits: Any, options: SearchOptions,
                 tag: str, handle: Callable[[int, Mapping[str, Any]], None], prepare_seconds: float) -> None:
        """Run ``rows`` through the actor pool and call ``handle(seq, record)`` in ``seq`` order.

        Raises:
            The typed error a worker raised (see :func:`_raise_remote`), or
            RayExecutionError: Ray gave up (retries exhausted, cluster lost).
        """

        o = self.options
        stats = RunStats(queries=len(rows), prepare_seconds=prepare_seconds)
        self.last_stats = stats
        with ray_session(o) as init_seconds:
            stats.init_seconds = init_seconds
            t0 = time.perf_counter()
            t0_wall = time.time()
            done_at: list[float] = []
            ds = _actor_pool_dataset(o, rows, _Worker, {
                "mode": mode, "factory": factory, "limits": limits, "options": options, "tag": tag,
                "setup": o.worker_setup, "threads": max(1, int(o.num_cpus))}, batch_size=o.batch_size)
            pending: dict[int, Mapping[str, Any]] = {}
            expected = 0
            iterator = ds.iter_rows()
            with _ray_failures(iterator, lambda: f"{expected} of {len(rows)} queries"):
                for row in iterator:
                    pending[int(row["seq"])] = json.loads(row["result"])
                    while expected in pending:  # in input order, whatever order results come in
                        record = pending.pop(expected)
                        if "error" in record:
                            _raise_remote(record["error"])
                        handle(expected, record)
                        done_at.append(float(record.get("done_at", time.time())))
                        if record.get("load_seconds") is not None:
                            stats.load_seconds = max(stats.load_seconds or 0.0, float(record["load_seconds"]))
                        expected += 1
            stats.run_seconds = time.perf_counter() - t0
            if done_at:
                stats.first_result_seconds = min(done_at) - t0_wall
                stats.steady_seconds = max(done_at) - min(done_at)
        if expected != len(rows):
            raise RayExecutionError(f"Ray returned {expected} of {len(rows)} queries; rerun to resume")
        logger.info(
            "ray: %d queries on %d actor(s) in %.1f s (%.2f queries/s; %s after the first); prepare %.1f s, "
            "ray.init %.1f s, first result after %.1f s, reranker load %s s",
            stats.queries, o.actors, stats.run_seconds, stats.queries_per_second,
            "-" if stats.steady_queries_per_second is None else f"{stats.steady_queries_per_second:.2f}",
            stats.prepare_seconds, stats.init_seconds, stats.first_result_seconds,
            "-" if stats.load_seconds is None else f"{stats.load_seconds:.1f}")


def _actor_pool_dataset(o: RayOptions, rows: list[dict[str, Any]], worker: type, kwargs: Mapping[str, Any], *,
                        batch_size: int, preserve_order: bool = True) -> Any:
    """``ray.data.from_items(rows).map_batches(worker, ...)`` on an actor pool of ``o.actors``
    actors (``o.num_cpus`` / ``o.num_gpus`` each; Ray restarts a dead actor and retries its
    batch per ``o.max_restarts`` / ``o.max_task_retries``), ``batch_size`` rows per call. Ray
    must be initialised (:func:`ray_session`)."""
    import warnings

    import ray
    from ray.data import ActorPoolStrategy

    n_blocks = max(1, min(_MAX_BLOCKS, math.ceil(len(rows) / batch_size)))
    retry_args: dict[str, Any] = {"max_restarts": o.max_restarts}
    if o.max_restarts != 0:
        retry_args["max_task_retries"] = o.max_task_retries
    with warnings.catch_warnings():
        # ray 2.60 marks the generic remote args (max_restarts, max_task_retries) deprecated
        warnings.simplefilter("ignore")
        ds = ray.data.from_items(rows, override_num_blocks=n_blocks)
        ds = ds.map_batches(
            worker,
            fn_constructor_kwargs=dict(kwargs),
            batch_size=batch_size,
            batch_format="numpy",
            compute=ActorPoolStrategy(size=o.actors, max_tasks_in_flight_per_actor=2),
            num_cpus=o.num_cpus,
            num_gpus=o.num_gpus or None,
            **retry_args,
        )
    ctx = ds.context
    ctx.execution_options.preserve_order = preserve_order
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False
    return ds


# ---------------------------------------------------------------------------- KV store build
def kv_shards(doc_ids: Sequence[str], shards: int) -> list[list[str]]:
    """Split ``doc_ids`` (duplicates dropped, order kept) into ``shards`` contiguous,
    near-equal lists: the parts :func:`build_kv_shard` is mapped over.

    Raises:
        ValidationError: ``shards < 1``.
    """
    if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
        raise ValidationError(f"shards must be an integer >= 1, got {shards!r}")
    ids = list(dict.fromkeys(doc_ids))
    size, extra = divmod(len(ids), shards)
    out, start = [], 0
    for i in range(shards):
        end = start + size + (1 if i < extra else 0)
        out.append(ids[start:end])
        start = end
    return out


def build_kv_shard(
    store_dir: str | Path,
    header: Any,
    doc_ids: Sequence[str],
    compute_fn: Callable[[list[str]], Mapping[str, tuple[Any, Any]]],
    *,
    batch_size: int = 32,
) -> dict[str, Any]:
    """One part of the distributed document KV store build (``attnrank index kv build
    --engine ray``, :func:`build_index_blocks_ray`): compute and store one shard of documents.

    Opens (or creates) the KV store at ``store_dir`` for ``header`` and runs
    :func:`attnrank.index.kvstore.build_missing` over ``doc_ids`` with ``compute_fn`` (the
    BlockRank block encoder: ``compute_fn([doc_id, ...]) -> {doc_id: (keys, values)}``). It is
    resumable (a rerun skips what was committed). A store has one writer, so each part
    writes its own directory (``<kv>/parts/part-00000``, ...); each actor of
    :func:`build_index_blocks_ray` runs this per part, and the driver adopts the part into
    the index's store (:meth:`attnrank.index.kvstore.KVStore.adopt`).

    Returns:
        The :class:`~attnrank.index.kvstore.BuildReport` as a dict, with ``store``.

    Raises:
        KVStoreError, KVStoreMismatchError: from the store (another header, a held lock).
    """
    from attnrank.index.kvstore import KVStore, build_missing

    store = KVStore.open_or_create(store_dir, header)
    try:
        report = build_missing(store, list(doc_ids), compute_fn, batch_size=batch_size)
    finally:
        store.close()
    return {**asdict(report), "store": str(Path(store_dir))}


class _KVBuilder:
    """One actor of a distributed KV store build: builds the cached-mode reranker once from
    the frozen :class:`~attnrank.config.RerankerConfig` (LM loaded in the constructor), checks
    that its store header equals the driver's, then builds each row's part store
    (:func:`build_kv_shard`) and reports what it did as JSON.

    Args:
        config: The reranker config (``query_in_instruction=false``).
        header: The driver's :class:`~attnrank.index.kvstore.KVHeader` (as a dict).
        batch_size: Blocks per LM batch and per committed shard of a part.
        setup: :attr:`RayOptions.worker_setup`.
        threads: torch threads (:attr:`RayOptions.num_cpus`).
    """

    def __init__(self, config: Any, header: Mapping[str, Any], batch_size: int = 32,
                 setup: Callable[[], Any] | None = None, threads: int = 1) -> None:
        self.batch_size = batch_size
        self.error: dict[str, Any] | None = None
        self.encoder: Any = None
        self.header: Any = None
        t0 = time.perf_counter()
        try:
            if setup is not None:
                setup()
            from attnrank import registry
            from attnrank.index.kvstore import KVHeader

            self.encoder = registry.build_reranker(config)
            if isinstance(self.encoder, Preloadable):
                self.encoder.load()
            if "torch" in sys.modules:
                sys.modules["torch"].set_num_threads(threads)
            mine = self.encoder.block_store_header()
            if mine is None or dict(mine) != dict(header):
                from attnrank.errors import KVStoreMismatchError

                diff = sorted(k for k in set(header) | set(mine or {}) if (mine or {}).get(k) != header.get(k))
                raise KVStoreMismatchError(
                    f"the Ray worker on {_node()} builds blocks for another configuration than the driver "
                    f"(fields {diff}); install the same attnrank version and model files on every node",
                    tuple(diff))
            self.header = KVHeader.from_dict(header)
        except Exception as exc:  # noqa: BLE001 - reported on the first batch, raised on the driver
            self.error = _error_record(exc)
        self.load_seconds = time.perf_counter() - t0

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        seqs = [int(s) for s in batch["seq"]]
        if self.error is not None:
            return {"seq": seqs, "result": [json.dumps({"error": self.error})] * len(seqs)}
        out = []
        for raw in batch["payload"]:
            p = json.loads(raw)
            try:
                record = self._build(Path(p["part"]), p["keys"], p["texts"])
            except Exception as exc:  # noqa: BLE001 - raised on the driver
                record = {"error": _error_record(exc)}
            out.append(json.dumps({**record, "load_seconds": self.load_seconds, "pid": os.getpid()}))
        return {"seq": seqs, "result": out}

    def _build(self, part: Path, keys: Sequence[str], texts: Sequence[str]) -> dict[str, Any]:
        from attnrank.errors import KVStoreError

        if not part.parent.is_dir():
            raise KVStoreError(
                f"the Ray worker on {_node()} cannot see {part.parent}: a distributed KV store build writes "
                "into the index directory, so it must be on a filesystem every Ray node mounts at the same path")
        by_key = dict(zip(keys, texts))

        def compute(ids: list[str]) -> dict[str, tuple[Any, Any]]:
            return {k: (kk, vv) for k, kk, vv in self.encoder.encode_block_arrays([by_key[k] for k in ids])}

        return {"report": build_kv_shard(part, self.header, list(keys), compute, batch_size=self.batch_size)}


def _node() -> str:
    import socket

    return f"{socket.gethostname()} (pid {os.getpid()})"


def build_index_blocks_ray(
    index: Any,
    encoder: Any,
    config: Any,
    options: RayOptions | None = None,
    *,
    batch_size: int = 32,
    part_batches: int = 4,
    show_progress: bool = False,
    verify_existing: bool = False,
    prune: bool = False,
) -> tuple[Any, Any]:
    """``attnrank index kv build --engine ray``: :func:`attnrank.index.kvstore.build_index_blocks`
    with the LM work spread over a Ray actor pool. Same store, same keys, same blocks.

    The driver (this process) opens the index's store writable (its lock keeps any other
    builder out), adopts parts an interrupted build left (:meth:`KVStore.adopt_parts`), keys
    every live document's block (:func:`attnrank.index.kvstore.index_block_texts`: the hash of
    its token ids, so equal texts share one block, as the local builder does) and leaves out
    the committed ones. The rest is cut into parts of ``part_batches * batch_size`` blocks
    (at least one per actor), each a row ``{part dir, keys, texts}``. Each actor builds its
    reranker from ``config`` and loads the LM once, checks its header against the driver's,
    and writes each of its parts as its own store, ``<kv>/parts/part-NNNNN``
    (:func:`build_kv_shard`: one fsynced, committed shard per batch, resumable). As each part
    comes back the driver commits its shards into the store's manifest in one atomic commit
    (:meth:`KVStore.adopt`, hard links, no copy) and removes it.

    Interruptions: an actor that dies is restarted and its part retried, resuming after the
    part's committed shards; if the driver stops (an error, Ctrl-C, ``kill -9``) a rerun with
    either engine adopts what the parts committed and computes only the rest. A half-written
    shard is never adopted (only a part's manifest-committed shards are; each entry keeps its
    crc32, checked on every read).

    Args:
        index: :class:`attnrank.index.store.Index` opened from a directory that every Ray node
            sees at the same path (a shared filesystem; always true of a local Ray).
        encoder: The driver's cached-mode reranker, built from ``config`` (it gives the header
            and tokenises; its LM does no encoding here).
        config: The frozen :class:`~attnrank.config.RerankerConfig` the actors build their
            reranker from (``query_in_instruction=false``), shipped by value.
        options: Where and how to run (default: a local Ray, one actor).
        batch_size: Blocks per LM batch and per committed shard.
        part_batches: Batches per part (a part is the unit of work an actor takes).
        show_progress: tqdm bars (tokenising; blocks committed, blocks/s).
        verify_existing: crc32-check stored blocks (and adopted parts) first, recompute bad ones.
        prune: Afterwards delete blocks of deleted or replaced documents and compact.

    Returns:
        ``(store, report)``: the index's :class:`~attnrank.index.kvstore.KVStore` and a
        :class:`~attnrank.index.kvstore.BuildReport` (``skipped``: stored before this run,
        adopted leftover parts included; ``shards``: committed by the actors now).

    Raises:
        ValidationError: the encoder is not in cached mode, the index is in memory, or bad sizes.
        KVStoreMismatchError: the store (or a worker's reranker) is for another configuration.
        KVStoreError: a full disk, another writer, or workers that cannot see the index directory.
        MissingDependencyError: Ray is not installed.
        RayExecutionError: Ray gave up (what was committed stays; rerun to resume).
        Any typed error a worker raised (e.g. ModelLoadError), raised here.
    """
    from tqdm.auto import tqdm

    from attnrank.index.kvstore import BuildReport, index_block_texts, open_index_store, prune_blocks

    o = options or RayOptions()
    for name, value in (("batch_size", batch_size), ("part_batches", part_batches)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValidationError(f"{name} must be an integer >= 1, got {value!r}")
    require_ray()
    t0 = time.perf_counter()
    store = open_index_store(index, encoder)
    store.adopt_parts(verify=verify_existing, show_progress=show_progress)
    if verify_existing:
        store.verify(show_progress=show_progress)
    texts = index_block_texts(index, encoder, show_progress=show_progress)
    todo = [k for k in texts if not store.contains(k)]
    skipped = len(texts) - len(todo)
    if skipped:
        logger.info("kv build: %d of %d blocks already stored, computing %d on Ray", skipped, len(texts), len(todo))
    shards = 0
    if todo:
        n_parts = min(len(todo), max(o.actors, math.ceil(len(todo) / (batch_size * part_batches))))
        parts_dir = store.parts_dir()
        parts_dir.mkdir(exist_ok=True)
        # after a part left behind (still locked by a dying actor of an earlier run): never reuse a name
        first = 1 + max((int(p.name[5:]) for p in parts_dir.glob("part-*") if p.name[5:].isdigit()), default=-1)
        rows = []
        for i, keys in enumerate(kv_shards(todo, n_parts)):
            payload = {"part": str(parts_dir / f"part-{first + i:05d}"), "keys": keys, "texts": [texts[k] for k in keys]}
            rows.append({"seq": i, "payload": json.dumps(payload)})
        bar: Any = tqdm(total=len(todo), desc=f"kv build (ray x{o.actors})", unit="block", disable=not show_progress,
                        dynamic_ncols=True)
        bar.set_postfix(skipped=skipped)
        header = encoder.block_store_header()
        try:
            shards = _run_kv_parts(o, rows, config, header, batch_size, store, bar)
        finally:
            bar.close()
    report = BuildReport(len(texts), skipped, len(todo), shards, time.perf_counter() - t0)
    if prune:
        prune_blocks(store, texts, show_progress=show_progress)
    return store, report


@contextmanager
def _ray_failures(iterator: Any, progress: Callable[[], str]) -> Iterator[None]:
    """Around reading an actor pool's results: a typed error from a worker passes through,
    Ray giving up becomes :class:`RayExecutionError` saying how far it got (``progress()``)
    and that a rerun resumes, and ``iterator`` is closed in every case."""
    import ray

    try:
        yield
    except AttnrankError:
        raise
    except ray.exceptions.RayError as exc:
        hint = (" (is attnrank, with the same extras and version, installed on every Ray node?)"
                if "No module named" in str(exc) else "")
        raise RayExecutionError(f"Ray gave up after {progress()} ({type(exc).__name__}: {exc}){hint}; "
                                "what was committed is kept, rerun to resume") from exc
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()


def _run_kv_parts(o: RayOptions, rows: list[dict[str, Any]], config: Any, header: Mapping[str, Any],
                  batch_size: int, store: Any, bar: Any) -> int:
    """Build ``rows``' parts on the actor pool and adopt each as it comes back; the shards
    the actors committed.

    Raises:
        The typed error a worker raised, or RayExecutionError: Ray gave up.
    """

    shards = done = 0
    with ray_session(o):
        ds = _actor_pool_dataset(o, rows, _KVBuilder, {
            "config": config, "header": dict(header), "batch_size": batch_size, "setup": o.worker_setup,
            "threads": max(1, int(o.num_cpus))}, batch_size=1, preserve_order=False)
        iterator = ds.iter_rows()
        with _ray_failures(iterator, lambda: f"{done} of {len(rows)} parts of the KV store build"):
            for row in iterator:
                record = json.loads(row["result"])
                if "error" in record:
                    _raise_remote(record["error"])
                part = json.loads(rows[int(row["seq"])]["payload"])["part"]
                store.adopt(part)  # one atomic manifest commit; the part is removed after it
                shards += int(record["report"]["shards"])
                done += 1
                bar.update(int(record["report"]["requested"]))
    if done != len(rows):
        raise RayExecutionError(f"Ray returned {done} of {len(rows)} parts of the KV store build; rerun to resume")
    return shards

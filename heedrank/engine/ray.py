"""The Ray engine (``--engine ray``): the jobs of :mod:`heedrank.engine` on a Ray actor pool.

The local engine stays the default and needs no Ray; Ray is imported only here, lazily, and
a missing Ray raises :class:`~heedrank.errors.MissingDependencyError` naming ``pip install -e '.[ray]'`` in the heedrank checkout.

How a query job runs (``rerank-batch`` through :meth:`RayEngine.map_queries`, ``eval
beir|trec-dl`` through :meth:`RayEngine.search`):

* **Driver** (the process that ran the command): the job's driver decides which queries are
  still to do (``rerank-batch``'s resume rules: the ``<out>.progress`` sidecar, see
  :mod:`heedrank.eval.batch`); the engine runs the first stage and hydrates each query's top
  ``max(top_k, candidates)`` hits (:meth:`heedrank.pipeline.Pipeline.first_stage_rows`, the
  local search's own step). Each query becomes one self-contained row: query, first-stage
  hits with scores, and the passages. Workers therefore need no index directory, run file or
  shared filesystem, only the package and the LM.
* **Ray Data**: ``ray.data.from_items(rows)`` then ``map_batches`` over an actor pool
  (:class:`ray.data.ActorPoolStrategy`, ``size = actors``). Each actor (an :class:`_ActorUDF`)
  builds its reranker once from the pipeline's reranker factory (the frozen
  :class:`~heedrank.config.RerankerConfig`, shipped by value) and loads the LM in its
  constructor; per batch it builds a :class:`~heedrank.pipeline.Pipeline` over the batch's
  rows (a :class:`~heedrank.retriever.run.RunRetriever` and an
  :class:`~heedrank.index.memory.InMemoryDocStore`) sharing that reranker, and runs the job's
  per-query work on it: the very code of the local engine (:func:`heedrank.eval.batch.rerank_query`,
  failure isolation included, or :meth:`Pipeline.search`). Rows and results cross as JSON
  (floats as ``repr``, so scores round-trip exactly).
* **Driver** again: results come back in input order (``preserve_order``; a reorder buffer
  on ``seq`` as well) and go to the job's driver one by one, which commits them as it does
  for the local engine (:func:`heedrank.eval.batch.commit_outcome`: output fsync'd, then the
  progress line). So for the same input and configuration the output is byte-identical to
  ``--engine local``, an interrupted Ray run resumes with either engine, and the eval report
  equals a local run's apart from timings (plus ``params.engine``).

Faults: an actor that dies (killed, OOM, node lost) is restarted by Ray (``max_restarts``)
and the batch it held is retried on the new actor (``max_task_retries``); results already
committed stay committed and the output is still complete and identical. An error inside a
worker that the local engine would raise (a model that cannot load, a missing dependency,
a bad option) is sent back as a typed error and raised on the driver, so the CLI prints one
line and exits 2, with everything committed so far kept for a rerun.

The document KV store is built the same way (``heedrank index kv build --engine ray``,
:meth:`RayEngine.build_blocks`): the driver plans (:func:`heedrank.index.kv.plan_build`:
keys the blocks, skips the stored ones) and commits, actors encode and write; each actor
writes its own part store (:func:`heedrank.index.kv.build_part`) into the index
directory, which therefore must be on a filesystem every node mounts at the same path, and
the driver adopts each part into the store's manifest atomically
(:meth:`heedrank.index.kv.KVStore.adopt`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
import traceback
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from heedrank import errors, registry
from heedrank.engine import EngineOptions, EngineSearch, QueryWork, RecordSink
from heedrank.errors import HeedrankError, KVStoreError, KVStoreMismatchError, ValidationError, require
from heedrank.jsonable import jsonable
from heedrank.pipeline import NO_RERANK, FirstStageRow, Pipeline, RerankerCache, SearchOptions, SearchResult, check_query_texts
from heedrank.protocols import Preloadable
from heedrank.types import Document, Query, Ranking
from heedrank.textrules import is_int

if TYPE_CHECKING:
    from heedrank.config import RerankerConfig
    from heedrank.engine import BlockPlan

logger = logging.getLogger(__name__)

RAY_EXTRA = "ray"
"""The optional extra that installs Ray: ``pip install -e '.[ray]' (in the heedrank checkout)`` (``ray[data]``)."""
_RUN = "ray-run"
"""Name of the per-batch first stage inside a worker."""
_MAX_BLOCKS = 10_000


class RayExecutionError(HeedrankError):
    """Ray could not run the job (workers kept dying, the cluster went away, a worker raised
    an untyped error). Work committed before it stays committed; a rerun resumes."""

    error_type = "ray"
    status_code = 500


def require_ray() -> Any:
    """The ``ray`` module, with Ray Data importable.

    Raises:
        MissingDependencyError: Ray (or Ray Data's dependencies) is not installed; the
            message names ``pip install -e '.[ray]' (in the heedrank checkout)``.
    """
    ray = require("ray", RAY_EXTRA)
    require("ray.data", RAY_EXTRA)
    return ray


@dataclass
class RunStats:
    """Timings of the last :class:`RayEngine` query job (logged; the figures in docs/results/speed.md).

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
def ray_session(options: EngineOptions) -> Iterator[float]:
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
def _row(seq: int, query: Query, ranking: Ranking, docs: Mapping[str, Document]) -> dict[str, Any]:
    """One self-contained row: the query, its first-stage hits (scores exact) and passages."""
    payload = {
        "qid": query.query_id, "text": query.text,
        "hits": [[h.doc_id, float(h.score)] for h in ranking.hits],
        "docs": [[d.doc_id, d.text, d.title, dict(d.metadata)] for d in docs.values()],
    }
    return {"seq": seq, "payload": json.dumps(payload, default=str)}


def _query_rows(rows: Sequence[FirstStageRow]) -> list[dict[str, Any]]:
    return [_row(i, r.query, r.top, r.docs) for i, r in enumerate(rows)]


def _worker_pipeline(payloads: Sequence[Mapping[str, Any]], cache: RerankerCache | None, limits: Any) -> Pipeline:
    """A pipeline over one batch's rows, sharing the actor's rerankers."""
    from heedrank import registry
    from heedrank.index.memory import InMemoryDocStore
    from heedrank.retriever.run import RunRetriever

    run: dict[str, dict[str, float]] = {}
    docs: dict[str, Document] = {}
    for p in payloads:
        run[p["qid"]] = {doc_id: float(score) for doc_id, score in p["hits"]}
        for doc_id, text, title, metadata in p["docs"]:
            docs.setdefault(doc_id, Document(doc_id, text, title, metadata))
    return Pipeline({_RUN: RunRetriever(run, name=_RUN)}, InMemoryDocStore(docs.values()), rerankers=cache, limits=limits,
                    dense=registry.dense_signal())


def search_record(pipeline: Pipeline, q: Query, options: SearchOptions) -> dict[str, Any]:
    """The :data:`~heedrank.engine.QueryWork` of :meth:`RayEngine.search`: one
    :meth:`Pipeline.search` as JSON (:meth:`SearchResult.to_json`; the driver rebuilds it
    with :meth:`SearchResult.from_json`)."""
    return pipeline.search(q, options).to_json()


def _error_record(exc: BaseException) -> dict[str, Any]:
    attrs = {k: v for k, v in vars(exc).items() if isinstance(v, (str, int, float, bool, list, tuple, type(None)))}
    return {"type": type(exc).__name__, "module": type(exc).__module__, "message": str(exc), "attrs": attrs,
            "traceback": "".join(traceback.format_exception(exc))}


def _raise_remote(error: Mapping[str, Any]) -> NoReturn:
    """Raise a worker's error on the driver: the same typed error when it is one of
    :mod:`heedrank.errors`, else :class:`RayExecutionError` with the worker's traceback."""
    cls = getattr(errors, error["type"], None) if error.get("module") == errors.__name__ else None
    if isinstance(cls, type) and issubclass(cls, HeedrankError):
        exc = cls.__new__(cls)
        Exception.__init__(exc, error["message"])
        for key, value in error.get("attrs", {}).items():
            setattr(exc, key, tuple(value) if isinstance(value, list) and key == "fields" else value)
        raise exc
    raise RayExecutionError(f"a Ray worker failed: {error['type']}: {error['message']}\n"
                            f"worker traceback:\n{error.get('traceback', '')}")


def _node() -> str:
    import socket

    return f"{socket.gethostname()} (pid {os.getpid()})"


# ---------------------------------------------------------------------------- actors
class _ActorUDF:
    """The base of every actor of the pool (a Ray Data callable class, in the shape of Ray's
    ``StatefulStageUDF``).

    The constructor runs once per actor: the worker setup (:attr:`EngineOptions.worker_setup`),
    :meth:`build`, then ``load()`` of what it returned (:class:`~heedrank.protocols.Preloadable`),
    torch's thread count (the CPUs reserved for the actor), then :meth:`ready`. An exception
    there is kept as an error record and every batch is answered with it, so the driver
    raises it, typed, once (a raising constructor would only be retried by Ray). Otherwise
    each batch's payloads (JSON) go to :meth:`process`, one record per payload.

    Args:
        setup: :attr:`EngineOptions.worker_setup`.
        threads: torch threads (:attr:`EngineOptions.num_cpus`, at least 1).
    """

    def __init__(self, setup: Callable[[], Any] | None = None, threads: int = 1) -> None:
        self.error: dict[str, Any] | None = None
        self.load_seconds: float | None = None
        t0 = time.perf_counter()
        try:
            if setup is not None:
                setup()
            model = self.build()
            if model is not None:
                if isinstance(model, Preloadable):
                    model.load()
                if "torch" in sys.modules:  # the LM's threads: the CPUs reserved for this actor
                    sys.modules["torch"].set_num_threads(threads)
                self.ready(model)
                self.load_seconds = time.perf_counter() - t0
        except Exception as exc:  # noqa: BLE001 - reported on the first batch, raised on the driver
            self.error = _error_record(exc)

    def build(self) -> Any:
        """Build what the actor keeps (its reranker); ``None`` when it needs no model."""
        return None

    def ready(self, model: Any) -> None:
        """Checks once ``model`` is loaded (raise to fail every batch)."""

    def process(self, payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """One JSON-ready record per payload, in order (an ``"error"`` key for a failure)."""
        raise NotImplementedError

    def __call__(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        seqs = [int(s) for s in batch["seq"]]
        if self.error is not None:
            records = [{"error": self.error}] * len(seqs)
        else:
            records = self.process([json.loads(p) for p in batch["payload"]])
        return {"seq": seqs, "result": [json.dumps(r) for r in records]}


class _QueryWorker(_ActorUDF):
    """An actor of a query job: builds the reranker once, then runs ``work`` on each query
    of a batch over a pipeline of the batch's rows.

    Args:
        work: The job's :data:`~heedrank.engine.QueryWork`.
        factory: The driver pipeline's reranker factory (``None`` without reranking).
        limits: The driver pipeline's :class:`~heedrank.config.SearchLimits`.
        options: Validated search options (retriever and filter are replaced here: the
            first stage already ran on the driver).
        setup, threads: See :class:`_ActorUDF`.
    """

    def __init__(self, work: QueryWork, factory: Any, limits: Any, options: SearchOptions,
                 setup: Callable[[], Any] | None = None, threads: int = 1) -> None:
        self.work, self.limits = work, limits
        self.options = replace(options, retriever=_RUN, filter=None)
        self.cache = RerankerCache(factory) if factory is not None else None
        self.reranker: Any = None
        super().__init__(setup, threads)

    def build(self) -> Any:
        if self.options.rerank == NO_RERANK:
            return None
        if self.cache is None:
            raise ValidationError("reranking is disabled in this pipeline; use rerank='none'")
        self.reranker = self.cache.get(self.options.rerank, self.options.rerank_options)[0]
        return self.reranker

    def process(self, payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
        pipeline = _worker_pipeline(payloads, self.cache, self.limits)
        out = []
        for p in payloads:
            q = Query(p["qid"], p["text"])
            try:
                record: dict[str, Any] = {"result": self.work(pipeline, q, self.options)}
            except Exception as exc:  # noqa: BLE001 - raised on the driver as the local engine would
                record = {"error": _error_record(exc)}
            record["done_at"] = time.time()  # wall clock: the throughput in RunStats
            out.append(record)
        describe = jsonable(dict(self.reranker.describe())) if self.reranker is not None else None
        return [{**r, "describe": describe, "load_seconds": self.load_seconds, "pid": os.getpid()} for r in out]


class _BlockEncoder(_ActorUDF):
    """An actor of a distributed KV store build: builds the cached-mode reranker once from
    the frozen :class:`~heedrank.config.RerankerConfig`, checks that its store header equals
    the driver's, then writes each row's part store (:func:`heedrank.index.kv.build_part`)
    and reports what it did.

    Args:
        config: The config of a cached BlockRank reranker (method ``blockrank-cached``).
        header: The driver's :class:`~heedrank.index.kv.KVHeader` (or its :meth:`~heedrank.blocks.KVHeader.to_dict`).
        batch_size: Blocks per LM batch and per committed shard of a part.
        setup, threads: See :class:`_ActorUDF`.
    """

    def __init__(self, config: Any, header: Any, batch_size: int = 32,
                 setup: Callable[[], Any] | None = None, threads: int = 1) -> None:
        from heedrank.blocks import as_header

        self.config, self.driver_header, self.batch_size = config, as_header(header).to_dict(), batch_size
        self.encoder: Any = None
        self.header: Any = None
        super().__init__(setup, threads)

    def build(self) -> Any:
        self.encoder = registry.build_reranker(self.config)
        return self.encoder

    def ready(self, model: Any) -> None:
        from heedrank.blocks import as_header
        from heedrank.index.kv import KVHeader

        header = self.driver_header
        mine = model.block_store_header()
        ours = {} if mine is None else as_header(mine).to_dict()
        if ours != header:
            diff = sorted(k for k in set(header) | set(ours) if ours.get(k) != header.get(k))
            raise KVStoreMismatchError(
                f"the Ray worker on {_node()} builds blocks for another configuration than the driver "
                f"(fields {diff}); install the same heedrank version and model files on every node",
                tuple(diff))
        self.header = KVHeader.from_dict(header)

    def process(self, payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for p in payloads:
            try:
                record = self._build(Path(p["part"]), p["keys"], p["texts"])
            except Exception as exc:  # noqa: BLE001 - raised on the driver
                record = {"error": _error_record(exc)}
            out.append({**record, "load_seconds": self.load_seconds, "pid": os.getpid()})
        return out

    def _build(self, part: Path, keys: Sequence[str], texts: Sequence[str]) -> dict[str, Any]:
        from heedrank.index.kv import build_part

        if not part.parent.is_dir():
            raise KVStoreError(
                f"the Ray worker on {_node()} cannot see {part.parent}: a distributed KV store build writes "
                "into the index directory, so it must be on a filesystem every Ray node mounts at the same path")
        by_key = dict(zip(keys, texts))

        def compute(ids: list[str]) -> dict[str, tuple[Any, Any]]:
            return {k: (kk, vv) for k, kk, vv in self.encoder.encode_block_arrays([by_key[k] for k in ids])}

        return {"report": build_part(part, self.header, list(keys), compute, batch_size=self.batch_size)}


class _VectorEncoder(_ActorUDF):
    """An actor of a distributed index build's dense encoding: builds the embedder once
    (``job.make_encoder``, with the actor's torch threads set first, so an ONNX Runtime
    session gets the same count), checks that it gives the driver's vectors (its
    :func:`heedrank.index.builder.encoder_identity`), then encodes each row's chunk into the
    build's checkpoint.

    Args:
        job: The build's :class:`heedrank.index.builder.VectorJob`, without its chunks' texts
            (they come in the rows).
        setup, threads: See :class:`_ActorUDF`.
    """

    def __init__(self, job: Any, setup: Callable[[], Any] | None = None, threads: int = 1) -> None:
        self.job, self.threads = job, threads
        self.encoder: Any = None
        super().__init__(setup, threads)

    def build(self) -> Any:
        import torch

        torch.set_num_threads(self.threads)
        self.encoder = self.job.make_encoder()
        return self.encoder

    def ready(self, model: Any) -> None:
        from heedrank.index.builder import encoder_identity

        mine, driver = encoder_identity(model), dict(self.job.identity)
        if mine != driver:
            diff = sorted(k for k in set(mine) | set(driver) if mine.get(k) != driver.get(k))
            raise ValidationError(f"the Ray worker on {_node()} encodes with another embedder than the driver "
                                  f"(fields {diff}); install the same heedrank version, extras and model files "
                                  "on every node")

    def process(self, payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for p in payloads:
            try:
                if not self.job.folder.is_dir():
                    raise ValidationError(
                        f"the Ray worker on {_node()} cannot see {self.job.folder}: a distributed index build writes "
                        "its vectors beside the index directory, so it must be on a filesystem every Ray node "
                        "mounts at the same path")
                docs = [Document(d["id"], d["text"], d["title"]) for d in p["docs"]]
                record: dict[str, Any] = {"vectors": self.job.encode(self.encoder, int(p["chunk"]), docs),
                                          "docs": len(docs)}
            except Exception as exc:  # noqa: BLE001 - raised on the driver
                record = {"error": _error_record(exc)}
            out.append({**record, "pid": os.getpid()})
        return out


_Key = TypeVar("_Key", bound=str)


def split_parts(keys: Sequence[_Key], parts: int) -> list[list[_Key]]:
    """Split ``keys`` (duplicates dropped, order kept) into ``parts`` contiguous, near-equal
    lists: the parts of a distributed KV store build, one part store each.

    Raises:
        ValidationError: ``parts < 1``.
    """
    if not is_int(parts) or parts < 1:
        raise ValidationError(f"parts must be an integer >= 1, got {parts!r}")
    ids = list(dict.fromkeys(keys))
    size, extra = divmod(len(ids), parts)
    out: list[list[_Key]] = []
    start = 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(ids[start:end])
        start = end
    return out


# ---------------------------------------------------------------------------- engine
class RayEngine:
    """The :class:`~heedrank.engine.Engine` on a Ray actor pool (see the module docstring).

    Args:
        options: Where and how to run (default: a local Ray instance, one actor); its
            ``engine`` field is taken as ``"ray"``.
        part_batches: KV store builds: batches per part (a part is the unit of work an
            actor takes, written as one part store).

    Raises:
        ValidationError: ``part_batches < 1``.
        MissingDependencyError: Ray is not installed (checked here, before any data loads).
    """

    name = "ray"
    in_process = False

    def __init__(self, options: EngineOptions | None = None, *, part_batches: int = 4) -> None:
        if not is_int(part_batches) or part_batches < 1:
            raise ValidationError(f"part_batches must be an integer >= 1, got {part_batches!r}")
        options = options or EngineOptions(engine="ray")
        self.options = options if options.engine == "ray" else replace(options, engine="ray")
        self.part_batches = part_batches
        require_ray()
        self.last_stats = RunStats()

    def __repr__(self) -> str:
        return f"RayEngine({self.options.describe()})"

    @property
    def label(self) -> str:
        return f"ray x{self.options.actors}"

    def describe(self) -> dict[str, Any]:
        """Options and Ray version (``params.engine`` of eval reports)."""
        import ray

        return {**self.options.describe(), "ray_version": ray.__version__}

    # -- rerank-batch ------------------------------------------------------------------
    def map_queries(self, pipeline: Pipeline, options: SearchOptions, queries: Sequence[Query],
                    work: QueryWork, sink: RecordSink) -> None:
        """``work`` on the actor pool; each record handed to ``sink`` in ``queries`` order."""
        if not queries:
            return
        t0 = time.perf_counter()
        rows = _query_rows(list(pipeline.first_stage_rows(queries, options)))
        factory = pipeline.rerankers.factory if pipeline.rerankers is not None else None
        self._run_queries(rows, work, factory, pipeline.limits, options, lambda seq, record: sink(record["result"]),
                          time.perf_counter() - t0)

    # -- evaluation --------------------------------------------------------------------
    def search(self, pipeline: Pipeline, queries: Sequence[Query], options: SearchOptions, *,
               show_progress: bool = True) -> EngineSearch:
        """:meth:`Pipeline.search_batch` on the actor pool, for :func:`heedrank.eval.harness.run_evaluation`:
        the first stage and hydration here, reranking on the actors."""
        from heedrank.progress import Progress

        t0 = time.perf_counter()
        options = pipeline.validate(options)
        check_query_texts(queries)
        reranking = options.rerank != NO_RERANK
        first = list(pipeline.first_stage_rows(queries, options))
        rows = _query_rows(first)
        prepare = time.perf_counter() - t0
        results: list[SearchResult | None] = [None] * len(queries)
        info: dict[str, Any] = {"describe": None, "load": None}
        bar = Progress(total=len(queries), desc=f"search ({options.rerank}, {self.label})", unit="query",
                       show_progress=show_progress, log=logger)

        def collect(seq: int, record: Mapping[str, Any]) -> None:
            row = first[seq]
            done = SearchResult.from_json(record["result"], row.docs)
            t_rerank = float(done.timings.get("rerank", 0.0))
            timings = {"retrieve": row.retrieve_seconds, "hydrate": row.hydrate_seconds, "rerank": t_rerank,
                       "total": row.retrieve_seconds + row.hydrate_seconds + t_rerank}
            # the driver's query and first stage (the actor saw only the top k1 of it)
            results[seq] = replace(done, query=row.query, first_stage=row.ranking, timings=timings)
            if record.get("describe") is not None:
                info["describe"] = record["describe"]
            if record.get("load_seconds") is not None:
                info["load"] = max(info["load"] or 0.0, float(record["load_seconds"]))
            bar.update(1)

        factory = pipeline.rerankers.factory if (reranking and pipeline.rerankers is not None) else None
        try:
            if queries:
                self._run_queries(rows, search_record, factory, pipeline.limits, options, collect, prepare)
        finally:
            bar.close()
        done = [r for r in results if r is not None]
        if len(done) != len(queries):  # pragma: no cover - _stream checks completeness
            raise RayExecutionError(f"Ray returned {len(done)} of {len(queries)} queries")
        return EngineSearch(done, info["load"] if reranking else None, info["describe"] if reranking else None,
                            self.describe())

    # -- KV store build ----------------------------------------------------------------
    def build_blocks(self, plan: BlockPlan, config: RerankerConfig | None, *, batch_size: int,
                     progress: Callable[[int], Any]) -> int:
        """Encode ``plan.todo`` on the actor pool: cut into parts of :attr:`part_batches` *
        ``batch_size`` blocks (at least one per actor), each written by an actor as its own
        part store (one fsynced, committed shard per batch, resumable) and adopted by
        ``plan`` as it comes back. An actor that dies is restarted and its part resumes
        after the part's committed shards; a part left by a stopped build is adopted by the
        next one (either engine).

        Args:
            plan: The build's plan (:func:`heedrank.index.kv.plan_build`).
            config: The frozen cached BlockRank config the actors build their encoder
                from, shipped by value.
            batch_size: Blocks per LM batch and per committed shard.
            progress: Called with the blocks of each part adopted.

        Returns:
            The shards the actors committed.

        Raises:
            ValidationError: no ``config``.
            KVStoreError: workers that cannot see the index directory, a full disk.
            KVStoreMismatchError: a worker's reranker is for another configuration.
            RayExecutionError: Ray gave up (what was adopted stays; rerun to resume).
            Any typed error a worker raised (e.g. ModelLoadError), raised here.
        """
        if config is None:
            raise ValidationError("a Ray KV store build needs the encoder's RerankerConfig (config=...): "
                                  "each actor builds its own encoder from it")
        todo = list(plan.todo)
        if not todo:
            return 0
        o = self.options
        n_parts = min(len(todo), max(o.actors, math.ceil(len(todo) / (batch_size * self.part_batches))))
        parts = list(zip(plan.part_dirs(n_parts), split_parts(todo, n_parts)))
        rows = [{"seq": i, "payload": json.dumps({"part": str(part), "keys": keys,
                                                  "texts": [plan.texts[k] for k in keys]})}
                for i, (part, keys) in enumerate(parts)]
        shards = 0
        kwargs = {"config": config, "header": plan.header, "batch_size": batch_size, "setup": o.worker_setup,
                  "threads": max(1, int(o.num_cpus))}
        with ray_session(o):
            with closing(self._stream(rows, _BlockEncoder, kwargs, batch_size=1, ordered=False,
                                      what="parts of the KV store build")) as results:
                for seq, record in results:
                    plan.adopt(parts[seq][0])  # one atomic manifest commit; the part is removed after it
                    shards += int(record["report"]["shards"])
                    progress(int(record["report"]["requested"]))
        return shards

    def encode_vectors(self, job: Any, *, progress: Callable[[int], Any]) -> int:
        """Encode the chunks ``job.todo`` of an index build on the actor pool, one chunk per
        row, each actor writing its chunks into the build's checkpoint (whole files, renamed
        into place: a chunk is done or absent, so a stopped build resumes with either engine).

        Args:
            job: The build's :class:`heedrank.index.builder.VectorJob` (shipped to the actors
                by value, its encoder as the factory it names).
            progress: Called with the documents of each chunk encoded.

        Returns:
            The chunks encoded.

        Raises:
            ValidationError: a worker that cannot see the checkpoint folder, or encodes with
                another embedder than the driver.
            RayExecutionError: Ray gave up (the chunks written stay; rerun to resume).
            Any typed error a worker raised (e.g. ModelLoadError), raised here.
        """
        rows = [{"seq": i, "payload": json.dumps({"chunk": k, "docs": [{"id": d.doc_id, "title": d.title,
                                                                       "text": d.text} for d in docs]})}
                for i, (k, docs) in enumerate(job.chunks())]
        if not rows:
            return 0
        o = self.options
        kwargs = {"job": job, "setup": o.worker_setup, "threads": max(1, int(o.num_cpus))}
        with ray_session(o), closing(self._stream(rows, _VectorEncoder, kwargs, batch_size=1, ordered=False,
                                                  what="chunks of the dense encoding")) as results:
            for _, record in results:
                progress(int(record["docs"]))
        return len(rows)

    # -- the Ray Data jobs ---------------------------------------------------------------
    def _run_queries(self, rows: list[dict[str, Any]], work: QueryWork, factory: Any, limits: Any,
                     options: SearchOptions, handle: Callable[[int, Mapping[str, Any]], None],
                     prepare_seconds: float) -> None:
        """Run ``rows`` through a pool of :class:`_QueryWorker` and call ``handle(seq, record)``
        in ``seq`` order; the timings go to :attr:`last_stats` and the log.

        Raises:
            The typed error a worker raised (see :func:`_raise_remote`), or
            RayExecutionError: Ray gave up (retries exhausted, cluster lost).
        """
        o = self.options
        stats = RunStats(queries=len(rows), prepare_seconds=prepare_seconds)
        self.last_stats = stats
        kwargs = {"work": work, "factory": factory, "limits": limits, "options": options, "setup": o.worker_setup,
                  "threads": max(1, int(o.num_cpus))}
        with ray_session(o) as init_seconds:
            stats.init_seconds = init_seconds
            t0 = time.perf_counter()
            t0_wall = time.time()
            done_at: list[float] = []
            with closing(self._stream(rows, _QueryWorker, kwargs, batch_size=o.batch_size, ordered=True,
                                      what="queries")) as results:
                for seq, record in results:
                    handle(seq, record)
                    done_at.append(float(record.get("done_at", time.time())))
                    if record.get("load_seconds") is not None:
                        stats.load_seconds = max(stats.load_seconds or 0.0, float(record["load_seconds"]))
            stats.run_seconds = time.perf_counter() - t0
            if done_at:
                stats.first_result_seconds = min(done_at) - t0_wall
                stats.steady_seconds = max(done_at) - min(done_at)
        logger.info(
            "ray: %d queries on %d actor(s) in %.1f s (%.2f queries/s; %s after the first); prepare %.1f s, "
            "ray.init %.1f s, first result after %.1f s, reranker load %s s",
            stats.queries, o.actors, stats.run_seconds, stats.queries_per_second,
            "-" if stats.steady_queries_per_second is None else f"{stats.steady_queries_per_second:.2f}",
            stats.prepare_seconds, stats.init_seconds, stats.first_result_seconds,
            "-" if stats.load_seconds is None else f"{stats.load_seconds:.1f}")

    def _stream(self, rows: list[dict[str, Any]], udf: type[_ActorUDF], kwargs: Mapping[str, Any], *,
                batch_size: int, ordered: bool, what: str) -> Generator[tuple[int, dict[str, Any]], None, None]:
        """``(seq, record)`` of every row from an actor pool of ``udf``: in ``seq`` order when
        ``ordered`` (a reorder buffer), else as they come. A worker's error record is raised
        as it comes up. Ray must be initialised (:func:`ray_session`); close the iterator
        (:func:`contextlib.closing`) so that Ray stops when the consumer does.

        Raises:
            The typed error a worker raised, or RayExecutionError: Ray gave up, or returned
            fewer records than rows (``what`` names them in the message).
        """
        ds = _actor_pool_dataset(self.options, rows, udf, kwargs, batch_size=batch_size, preserve_order=ordered)
        iterator = ds.iter_rows()
        done = 0
        pending: dict[int, dict[str, Any]] = {}
        with _ray_failures(iterator, lambda: f"{done} of {len(rows)} {what}"):
            for row in iterator:
                pending[int(row["seq"])] = json.loads(row["result"])
                ready = list(pending) if not ordered else []
                while ordered and done + len(ready) in pending:  # in input order, whatever order results come in
                    ready.append(done + len(ready))
                for seq in ready:
                    record = pending.pop(seq)
                    if "error" in record:
                        _raise_remote(record["error"])
                    yield seq, record
                    done += 1
        if done != len(rows):
            raise RayExecutionError(f"Ray returned {done} of {len(rows)} {what}; rerun to resume")


def _actor_pool_dataset(o: EngineOptions, rows: list[dict[str, Any]], worker: type, kwargs: Mapping[str, Any], *,
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
        ds: Any = ray.data.from_items(rows, override_num_blocks=n_blocks)
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


@contextmanager
def _ray_failures(iterator: Any, progress: Callable[[], str]) -> Iterator[None]:
    """Around reading an actor pool's results: a typed error from a worker passes through,
    Ray giving up becomes :class:`RayExecutionError` saying how far it got (``progress()``)
    and that a rerun resumes, and ``iterator`` is closed in every case."""
    import ray

    try:
        yield
    except HeedrankError:
        raise
    except ray.exceptions.RayError as exc:
        hint = (" (is heedrank, with the same extras and version, installed on every Ray node?)"
                if "No module named" in str(exc) else "")
        raise RayExecutionError(f"Ray gave up after {progress()} ({type(exc).__name__}: {exc}){hint}; "
                                "what was committed is kept, rerun to resume") from exc
    finally:
        close = getattr(iterator, "close", None)
        if close is not None:
            close()


__all__ = [
    "RAY_EXTRA",
    "RayEngine",
    "RayExecutionError",
    "RunStats",
    "ray_session",
    "require_ray",
    "search_record",
    "split_parts",
]

"""Where the work runs: one :class:`Engine` seam, a local and a Ray implementation.

Three jobs need many model passes, and each has one driver, written once, that runs on
either engine:

* **Evaluation searches** (``eval beir|trec-dl``): :func:`heedrank.eval.harness.run_evaluation`
  calls :meth:`Engine.search`.
* **Batch reranking** (``rerank-batch``): :func:`heedrank.eval.batch.rerank_batch` plans,
  resumes and commits; :meth:`Engine.map_queries` runs one query's work per query and
  hands each record back in order.
* **Dense encoding of an index build** (``index build``): :func:`heedrank.index.builder.build_index`
  names the chunks left to encode (:class:`heedrank.index.builder.VectorJob`);
  :meth:`Engine.encode_vectors` writes them into the build's checkpoint, which the build then
  reads back as on a resume.
* **Document KV store builds** (``index kv build``): :func:`heedrank.index.kv.build_index_blocks`
  plans the build (:func:`heedrank.index.kv.plan_build`: open the store, adopt parts,
  key the texts, skip stored blocks) and prunes; :meth:`Engine.build_blocks` encodes and
  commits what the plan says is missing.

:class:`LocalEngine` runs them in this process (the default; needs nothing more).
:class:`heedrank.engine.ray.RayEngine` runs them on a Ray actor pool (``pip install -e '.[ray]'`` in the heedrank checkout), with the same output: byte-identical runs, equal reports apart from
timings, the same store. Both take one :class:`EngineOptions`, built once by the CLI from
its engine flags (:func:`make_engine`).

This package is part of the core: it imports the index, retriever and reranker layers only
inside functions (never the evaluation or the service), so importing it is light and the
layering stays one way (``tests/heedrank/test_layering.py``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast, runtime_checkable

from heedrank.errors import ValidationError
from heedrank.pipeline import NO_RERANK, Pipeline, SearchOptions, SearchResult
from heedrank.protocols import Preloadable
from heedrank.types import Query
from heedrank.textrules import is_int, is_number

if TYPE_CHECKING:
    from heedrank.blocks import BlockKey
    from heedrank.config import RerankerConfig

logger = logging.getLogger(__name__)

EngineName = Literal["local", "ray"]
ENGINES: tuple[EngineName, ...] = ("local", "ray")
"""Engine names (``--engine``)."""

QueryWork = Callable[[Pipeline, Query, SearchOptions], dict[str, Any]]
"""One query's work in :meth:`Engine.map_queries`: ``work(pipeline, query, options)`` returns
a JSON-ready record. The pipeline and options it gets are the engine's (on Ray, a pipeline
over the query's first-stage hits, with ``options.retriever`` replaced), so it must search
with those. It travels to Ray workers by reference: a module-level function, or a
:func:`functools.partial` of one."""

RecordSink = Callable[[Mapping[str, Any]], None]
"""Receives each record of :meth:`Engine.map_queries`, in query order, in this process."""


def check_engine_name(name: str) -> EngineName:
    """``name`` if it is an engine name. Raises ValidationError naming the valid ones."""
    if name not in ENGINES:
        raise ValidationError(f"unknown engine {name!r}; choose one of {list(ENGINES)}")
    return cast(EngineName, name)


# ---------------------------------------------------------------------------- options
@dataclass(frozen=True)
class EngineOptions:
    """Which engine runs the work, and where and how Ray runs it.

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
            custom reranker in :mod:`heedrank.registry`); shipped by value. Not for the CLI.
        engine: ``"local"`` (this process; the Ray fields are unused) or ``"ray"``.

    Raises:
        ValidationError: an unknown engine, or a field out of range (the message names it).
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
    engine: EngineName = "local"

    def __post_init__(self) -> None:
        check_engine_name(self.engine)

        def whole(name: str, low: int) -> None:
            value = getattr(self, name)
            if not is_int(value) or value < low:
                raise ValidationError(f"ray {name} must be an integer >= {low}, got {value!r}")

        whole("actors", 1)
        whole("batch_size", 1)
        whole("max_restarts", -1)
        whole("max_task_retries", -1)
        for name in ("num_cpus", "num_gpus"):
            value = getattr(self, name)
            if not is_number(value) or not math.isfinite(value) or value < 0:
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
        return d


# ---------------------------------------------------------------------------- seam
@dataclass
class EngineSearch:
    """What :meth:`Engine.search` hands back to :func:`heedrank.eval.harness.run_evaluation`.

    Attributes:
        results: One :class:`~heedrank.pipeline.SearchResult` per query, in query order, as
            :meth:`Pipeline.search_batch` would return them.
        load_seconds: Reranker load time (the slowest worker's), ``None`` without reranking.
        reranker: The reranker's ``describe()``, as the engine built it (``None`` without reranking).
        engine: How the search ran (:meth:`Engine.describe`; a report records it as
            ``params.engine`` for engines other than the local one).
    """

    results: list[SearchResult]
    load_seconds: float | None = None
    reranker: Mapping[str, Any] | None = None
    engine: Mapping[str, Any] = field(default_factory=dict)


class BlockPlan(Protocol):
    """What a document KV store build has left to do, as :meth:`Engine.build_blocks` reads
    it (:class:`heedrank.index.kv.BlockBuildPlan`, made by
    :func:`heedrank.index.kv.plan_build`)."""

    @property
    def texts(self) -> Mapping[BlockKey, str]:
        """``{block key: text}`` of every live document."""
        ...

    @property
    def todo(self) -> Sequence[BlockKey]:
        """Block keys not stored yet, in document order."""
        ...

    @property
    def header(self) -> dict[str, Any]:
        """The store header the blocks are encoded for (the encoder's)."""
        ...

    def part_dirs(self, n: int) -> list[Path]:
        """``n`` fresh part store directories (a distributed build writes one per part)."""
        ...

    def adopt(self, part: str | Path) -> None:
        """Commit a finished part store into the store (one atomic manifest commit)."""
        ...

    def encode_here(self, *, batch_size: int, progress: Callable[[int], Any]) -> int:
        """Encode and commit ``todo`` in this process; returns the shards committed."""
        ...


class VectorPlan(Protocol):
    """The dense chunks an index build has left, as :meth:`Engine.encode_vectors` reads them
    (:class:`heedrank.index.builder.VectorJob`)."""

    @property
    def todo(self) -> Sequence[int]:
        """Chunk numbers not encoded yet."""
        ...

    @property
    def folder(self) -> Path:
        """The build's checkpoint folder (where the chunks go)."""
        ...

    def chunks(self) -> Iterator[tuple[int, list[Any]]]:
        """``(k, documents)`` of every chunk left, read from the corpus."""
        ...

    def encode(self, encoder: Any, k: int, docs: Sequence[Any]) -> int:
        """Encode chunk ``k`` and save it in the checkpoint; the vectors written."""
        ...


@runtime_checkable
class Engine(Protocol):
    """Runs the model passes of a job, here or elsewhere; the job's driver is the same
    whichever runs it (see the module docstring).

    Attributes:
        name: ``"local"`` or ``"ray"``.
        in_process: Whether the work (and the LM) runs in this process; a driver whose LM
            only tokenises keeps it on the CPU otherwise.
        label: Short text for progress bars (``""`` for the local engine, ``"ray x4"``).
    """

    name: str
    in_process: bool

    @property
    def label(self) -> str: ...

    def describe(self) -> dict[str, Any]:
        """How the engine runs, as JSON (a report's ``params.engine``)."""
        ...

    def search(self, pipeline: Pipeline, queries: Sequence[Query], options: SearchOptions, *,
               show_progress: bool = True) -> EngineSearch:
        """:meth:`Pipeline.search_batch` of ``queries``, the reranker loaded before the
        first query (its load time reported apart)."""
        ...

    def map_queries(self, pipeline: Pipeline, options: SearchOptions, queries: Sequence[Query],
                    work: QueryWork, sink: RecordSink) -> None:
        """Run ``work`` on each query (first stage from ``pipeline``) and hand each record to
        ``sink`` in query order; ``options`` are validated. A typed error raised by ``work``
        stops the run, raised here, after the records before it were handed over."""
        ...

    def build_blocks(self, plan: BlockPlan, config: RerankerConfig | None, *, batch_size: int,
                     progress: Callable[[int], Any]) -> int:
        """Encode and commit the blocks ``plan.todo``; ``config`` is the encoder's
        configuration (workers elsewhere build their encoder from it). ``progress(n)`` counts
        blocks committed. Returns the shards committed."""
        ...

    def encode_vectors(self, job: VectorPlan, *, progress: Callable[[int], Any]) -> int:
        """Encode the chunks ``job.todo`` into the build's checkpoint before the build reads
        them; ``progress(n)`` counts documents. Returns the chunks encoded."""
        ...


def preload(pipeline: Pipeline, method: str) -> float:
    """Build reranker ``method`` and load its model now, so that model loading is not
    counted in the first query's latency; the seconds it took."""
    t0 = time.perf_counter()
    reranker = pipeline.reranker(method)
    if isinstance(reranker, Preloadable):
        reranker.load()
    return time.perf_counter() - t0


class LocalEngine:
    """This process, one query at a time (the default engine; nothing to install)."""

    name = "local"
    in_process = True
    label = ""

    def __repr__(self) -> str:
        return "LocalEngine()"

    def describe(self) -> dict[str, Any]:
        return {"engine": "local"}

    def search(self, pipeline: Pipeline, queries: Sequence[Query], options: SearchOptions, *,
               show_progress: bool = True) -> EngineSearch:
        """:meth:`Pipeline.search_batch` here, after loading the reranker."""
        reranking = options.rerank != NO_RERANK
        load_seconds = None
        if reranking:
            load_seconds = preload(pipeline, options.rerank)
            logger.info("reranker %r ready in %.1f s", options.rerank, load_seconds)
        results = pipeline.search_batch(list(queries), options, show_progress=show_progress)
        described = dict(pipeline.reranker(options.rerank).describe()) if reranking else None
        return EngineSearch(results, load_seconds, described, self.describe())

    def map_queries(self, pipeline: Pipeline, options: SearchOptions, queries: Sequence[Query],
                    work: QueryWork, sink: RecordSink) -> None:
        """``sink(work(pipeline, q, options))`` for each query, the reranker loaded first."""
        if not queries:
            return
        if options.rerank != NO_RERANK:
            preload(pipeline, options.rerank)
        for q in queries:
            sink(work(pipeline, q, options))

    def build_blocks(self, plan: BlockPlan, config: RerankerConfig | None, *, batch_size: int,
                     progress: Callable[[int], Any]) -> int:
        """The plan's encoder encodes here (``config`` is not needed)."""
        return plan.encode_here(batch_size=batch_size, progress=progress)

    def encode_vectors(self, job: VectorPlan, *, progress: Callable[[int], Any]) -> int:
        """Nothing ahead: the build encodes each chunk here as it reads it. Returns 0."""
        return 0


def make_engine(options: EngineOptions | None = None) -> Engine:
    """The engine ``options.engine`` names (default: :class:`LocalEngine`).

    Raises:
        MissingDependencyError: ``engine="ray"`` without Ray installed (the message names
            ``pip install -e '.[ray]' (in the heedrank checkout)``).
    """
    if options is None or options.engine == "local":
        return LocalEngine()
    from heedrank.engine.ray import RayEngine

    return RayEngine(options)


__all__ = [
    "ENGINES",
    "BlockPlan",
    "Engine",
    "EngineName",
    "EngineOptions",
    "EngineSearch",
    "LocalEngine",
    "QueryWork",
    "RecordSink",
    "VectorPlan",
    "check_engine_name",
    "make_engine",
    "preload",
]

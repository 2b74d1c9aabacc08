"""Batch reranking of a first-stage TREC run, streaming and resumable.

``heedrank rerank-batch --topics F --run F.trec --docs INDEX_DIR|run.json --out F.trec``
reranks each query of a run with the same :class:`~heedrank.pipeline.Pipeline` the API
and the evaluator use (a :class:`heedrank.retriever.run.RunRetriever` over the run, the passages
from an index directory or a rank_llm run JSON), and appends each query's ranking to the
output as soon as it is done.

Resumption. The output is append-only; beside it, ``<out>.progress`` is a JSON-lines
sidecar: a header line with the parameters, then one line per completed query with the
output's byte length after that query. Each query is written, flushed and fsync'd to the
output, then its progress line is written, flushed and fsync'd. A restart reads the
sidecar (dropping a torn last line), truncates the output to the last recorded length
(dropping a partly written query) and skips the completed queries, so that an interrupted
and resumed run writes the same bytes as an uninterrupted one. A sidecar whose header
differs from the new parameters is an error (``--overwrite`` starts afresh).

Failure isolation. When reranking a query fails, the prompt is retried without the
documents that fail on their own (each is logged and ranked below the reranked ones in
first-stage order); when the prompt overflows the model's context, the candidates that fit
are reranked. If nothing can be reranked, the query is written in first-stage order. Every
query completes; the progress line and the summary count what happened.

Output: 6-column TREC lines ``qid Q0 docid rank score tag``; each query's hits as
:meth:`heedrank.pipeline.Pipeline.search` ranks them (reranked candidates, then the rest
of the first stage below), scores printed with ``repr``.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from heedrank.config import RerankerConfig, SearchLimits
from heedrank.engine import Engine, LocalEngine
from heedrank.files import file_sha256, fsync_dir
from heedrank.errors import ContextOverflowError, MissingDependencyError, ModelLoadError, ValidationError
from heedrank.pipeline import NO_RERANK, Pipeline, RerankerFactory, SearchOptions, merge_served, reranker_factory
from heedrank.types import Query, Ranking

logger = logging.getLogger(__name__)

PROGRESS_FORMAT = 1


@dataclass
class BatchSummary:
    """What a :func:`rerank_batch` call did.

    Attributes:
        out: The output run file.
        queries: Queries of the batch (topics with hits in the run, after ``max_queries``).
        skipped: Queries already completed by an earlier (interrupted) call.
        done: Queries reranked and written by this call.
        documents: Candidate documents reranked by this call.
        failed_documents: ``{query_id: [doc_id, ...]}`` left out of reranking after failing.
        missing_documents: ``{query_id: [doc_id, ...]}`` of first-stage hits missing from the
            document store (neither reranked nor written).
        first_stage_queries: Queries written in first-stage order (nothing could be reranked).
        seconds: Wall-clock time of this call.
    """

    out: Path
    queries: int
    skipped: int = 0
    done: int = 0
    documents: int = 0
    failed_documents: dict[str, list[str]] = field(default_factory=dict)
    missing_documents: dict[str, list[str]] = field(default_factory=dict)
    first_stage_queries: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def queries_per_second(self) -> float:
        return self.done / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["out"] = str(self.out)
        d["queries_per_second"] = self.queries_per_second
        return d




def trec_lines(ranking: Ranking, tag: str) -> str:
    """TREC run lines of one ranking (ranks from 1, scores with ``repr``)."""
    return "".join(
        f"{ranking.query_id} Q0 {h.doc_id} {rank} {float(h.score)!r} {tag}\n" for rank, h in enumerate(ranking.hits, 1)
    )


# ---------------------------------------------------------------------------- progress
class Progress:
    """The ``<out>.progress`` sidecar and the output it describes (see the module docstring).

    Args:
        out: The output run file.
        header: Parameters of this batch; a sidecar with another header is refused.
        overwrite: Start afresh, deleting an existing output and sidecar.

    Raises:
        ValidationError: an output without a sidecar, a sidecar of other parameters, or an
            output shorter than the sidecar says (without ``overwrite``).
    """

    def __init__(self, out: Path, header: Mapping[str, Any], *, overwrite: bool = False) -> None:
        self.out = Path(out)
        self.path = self.out.with_name(self.out.name + ".progress")
        self.header = dict(header)
        self.completed: dict[str, dict[str, Any]] = {}
        if overwrite:
            for p in (self.out, self.path):
                p.unlink(missing_ok=True)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        offset = self._recover()
        self._out = open(self.out, "ab")
        self._out.truncate(offset)
        self._out.seek(offset)
        os.fsync(self._out.fileno())
        self._progress = open(self.path, "ab")
        if not self.completed and self._progress.tell() == 0:
            self._append({"header": self.header})
        fsync_dir(self.out.parent)

    def _recover(self) -> int:
        """Read the sidecar; returns the output length to keep."""
        if not self.path.exists():
            if self.out.exists() and self.out.stat().st_size > 0:
                raise ValidationError(
                    f"{self.out} exists without its progress file {self.path.name}; pass --overwrite to replace it"
                )
            return 0
        raw = self.path.read_bytes()
        lines = raw.split(b"\n")
        good = 0  # bytes of complete, parseable lines
        records: list[dict[str, Any]] = []
        for line in lines[:-1]:  # the last element is after the final newline (torn or empty)
            try:
                records.append(json.loads(line))
            except ValueError:
                break
            good += len(line) + 1
        if good < len(raw):
            logger.warning("dropping a torn last line of %s", self.path)
            with open(self.path, "r+b") as f:
                f.truncate(good)
                os.fsync(f.fileno())
        if not records:
            return 0
        old = records[0].get("header")
        if old != self.header:
            diff = sorted(k for k in set(old or {}) | set(self.header) if (old or {}).get(k) != self.header.get(k))
            raise ValidationError(
                f"{self.path} belongs to a batch with other parameters (differing: {diff}); "
                "rerun with the same ones to resume, or pass --overwrite to start afresh"
            )
        offset = 0
        for rec in records[1:]:
            self.completed[rec["qid"]] = rec
            offset = int(rec["offset"])
        size = self.out.stat().st_size if self.out.exists() else 0
        if size < offset:
            raise ValidationError(
                f"{self.out} has {size} bytes but {self.path.name} records {offset}; the output was modified. "
                "Pass --overwrite to start afresh"
            )
        if size > offset:
            logger.info("truncating a partly written query from %s (%d -> %d bytes)", self.out, size, offset)
        return offset

    def _append(self, record: Mapping[str, Any]) -> None:
        self._progress.write((json.dumps(record, sort_keys=True) + "\n").encode())
        self._progress.flush()
        os.fsync(self._progress.fileno())

    def commit(self, query_id: str, data: str, record: Mapping[str, Any]) -> None:
        """Append one query's lines to the output (fsync), then its progress line (fsync)."""
        self._out.write(data.encode())
        self._out.flush()
        os.fsync(self._out.fileno())
        rec = {"qid": query_id, "offset": self._out.tell(), **record}
        self._append(rec)
        self.completed[query_id] = rec

    def close(self) -> None:
        self._out.close()
        self._progress.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# ---------------------------------------------------------------------------- reranking
def _isolate(
    pipeline: Pipeline, query: Query, options: SearchOptions, error: Exception
) -> tuple[Ranking, list[str], bool, list[str]]:
    """Rerank ``query`` despite ``error``: without failing documents, or the candidates that fit,
    through :meth:`Pipeline.rerank_documents` (the step :meth:`Pipeline.search` takes: the same
    first stage and filter, document KV store, cold budget and serving).

    Returns:
        ``(ranking, failed_doc_ids, reranked, missing_doc_ids)``.
    """
    options = pipeline.validate(options)
    row = next(iter(pipeline.first_stage_rows([query], options)))
    hydrated, missing = row.hydrated, list(row.missing)
    cands = list(hydrated.top(options.candidates).hits)
    failed: list[str] = []
    if isinstance(error, ContextOverflowError) and error.max_candidates > 0:
        logger.warning("query %s: the prompt overflows the context; reranking the top %d of %d candidates",
                       query.query_id, error.max_candidates, len(cands))
        cands = cands[: error.max_candidates]
    else:
        keep = []
        for hit in cands:
            try:
                pipeline.rerank_documents(query, Ranking(query.query_id, (hit,)), options)
            except (ModelLoadError, MissingDependencyError):
                raise
            except Exception as exc:  # noqa: BLE001 - each failing document is logged and left out
                logger.warning("query %s: document %s cannot be reranked (%s: %s); ranked below the reranked ones",
                               query.query_id, hit.doc_id, type(exc).__name__, exc)
                failed.append(hit.doc_id)
            else:
                keep.append(hit)
        cands = keep
    if cands:
        try:
            done = pipeline.rerank_documents(query, Ranking(query.query_id, tuple(cands)), options)
        except Exception as exc:  # noqa: BLE001
            logger.error("query %s: reranking failed again (%s: %s); writing first-stage order",
                         query.query_id, type(exc).__name__, exc)
        else:
            return merge_served(hydrated, done.served, options.top_k), failed, True, missing
    return hydrated.top(options.top_k), failed, False, missing


def iter_queries(topics: Mapping[str, Query], run_ids: Sequence[str], max_queries: int | None) -> list[Query]:
    """Topics (file order) that have hits in the run, cut to ``max_queries``; logs the others."""
    in_run = set(run_ids)
    chosen = [q for qid, q in topics.items() if qid in in_run]
    no_hits = [qid for qid in topics if qid not in in_run]
    no_topic = sorted(in_run - set(topics))
    if no_hits:
        logger.warning("%d topics have no hits in the run and are skipped: %s", len(no_hits), no_hits[:10])
    if no_topic:
        logger.warning("%d run queries have no topic text and are skipped: %s", len(no_topic), no_topic[:10])
    if max_queries is not None:
        if max_queries < 1:
            raise ValidationError(f"max_queries must be >= 1, got {max_queries}")
        chosen = chosen[:max_queries]
    return chosen


def _open_docs(docs: Path) -> tuple[Any, Any]:
    """A document store from an index directory or a run JSON, and the object to close."""
    if docs.is_dir():
        from heedrank import registry

        index = registry.open_index(str(docs))
        return index.docstore, index
    from heedrank.data import load_run_json
    from heedrank.index.memory import InMemoryDocStore

    _, passages, _ = load_run_json(docs)
    return InMemoryDocStore(passages.values()), None


def rerank_batch(
    topics: str | Path,
    run: str | Path,
    docs: str | Path,
    out: str | Path,
    *,
    method: str = "blockrank",
    candidates: int = 20,
    depth: int | None = None,
    tag: str | None = None,
    max_queries: int | None = None,
    reranker_config: RerankerConfig | None = None,
    factory: RerankerFactory | None = None,
    overwrite: bool = False,
    show_progress: bool = True,
    fusion: float | None = None,
    engine: Engine | None = None,
) -> BatchSummary:
    """Rerank every query of a TREC run, appending each query's ranking to ``out`` (resumable).

    Args:
        topics: TREC topics (``qid<TAB>text``).
        run: First-stage TREC run (6 columns).
        docs: Index directory (``heedrank index build``) or rank_llm run JSON with the passages.
        out: Output TREC run; ``<out>.progress`` is written beside it.
        method: Reranker name.
        candidates: Top first-stage hits reranked per query.
        depth: Hits written per query (default: all of the run's hits).
        tag: Run tag (default: ``heedrank-<method>-c<candidates>``).
        max_queries: Only the first ``max_queries`` queries (topics-file order).
        reranker_config: Model, ``max_doc_tokens``, device; its method is replaced by ``method``.
        factory: Reranker factory to use instead of the registry (tests).
        fusion: ``alpha``: order by ``alpha z(first stage) + (1 - alpha) z(reranker)``
            (:attr:`heedrank.pipeline.SearchOptions.fusion`); ``None`` = the reranker's order.
        overwrite: Start afresh instead of resuming.
        show_progress: Progress bar with queries/s and documents/s.
        engine: Where the queries are reranked (:class:`heedrank.engine.Engine`; default:
            :class:`~heedrank.engine.LocalEngine`, this process, one query at a time). The
            output and the resume rules are the same whichever runs (:func:`run_on_engine`),
            so a batch may be resumed on another engine.

    Returns:
        The :class:`BatchSummary` of this call.

    Raises:
        ValidationError: bad parameters, or an output/sidecar that does not match (see :class:`Progress`).
        NotFoundError: missing input files.
        UnknownNameError: unknown reranker.
        Whatever the engine raises (a typed worker error, RayExecutionError; the queries
        committed before it stay, a rerun resumes).
    """
    from heedrank.data import load_trec_run, load_trec_topics
    from heedrank.registry import reranker_class
    from heedrank.retriever.run import RunRetriever

    t_start = time.perf_counter()
    if method == NO_RERANK:
        raise ValidationError("rerank-batch needs a reranker method")
    if factory is None:
        reranker_class(method)  # fail on an unknown name before loading anything
    SearchLimits(max_candidates=max(candidates, 1)).check_candidates(candidates)  # the pipeline's check, early
    topics, run, docs, out = Path(topics), Path(run), Path(docs), Path(out)
    tag = tag or f"heedrank-{method}-c{candidates}"
    if any(c.isspace() for c in tag):
        raise ValidationError(f"run tag must have no whitespace, got {tag!r}")
    run_map = load_trec_run(run)
    queries = iter_queries(load_trec_topics(topics), list(run_map), max_queries)
    k = depth or max((len(v) for v in run_map.values()), default=1)
    limits = SearchLimits(max_top_k=max(k, candidates), max_candidates=candidates)  # admit what was asked
    config = replace(reranker_config or RerankerConfig(), method=method)
    header = {
        "format": PROGRESS_FORMAT, "method": method, "candidates": candidates, "depth": k, "tag": tag,
        "max_queries": max_queries, "topics_sha256": file_sha256(topics), "run_sha256": file_sha256(run),
        "docs": str(docs.resolve()), "model": config.model, "max_doc_tokens": config.max_doc_tokens,
        "options": config.given_options, **({"fusion": fusion} if fusion is not None else {}),
    }
    summary = BatchSummary(out=out, queries=len(queries))
    from heedrank import registry

    store, closer = _open_docs(docs)
    try:
        pipeline = Pipeline(
            retrievers={"run": RunRetriever(run_map, name=run.name)},
            docstore=store,
            reranker_factory=factory or reranker_factory(config),
            limits=limits,
            dense=registry.dense_signal(closer),  # an index's stored vectors, else the packaged embedder
        )
        options = pipeline.validate(SearchOptions(top_k=k, retriever="run", rerank=method, candidates=candidates,
                                                  fusion=fusion))
        with Progress(out, header, overwrite=overwrite) as progress:
            todo = [q for q in queries if q.query_id not in progress.completed]
            summary.skipped = len(queries) - len(todo)
            if summary.skipped:
                logger.info("resuming %s: %d of %d queries already done", out, summary.skipped, len(queries))
            run_on_engine(engine or LocalEngine(), pipeline, options, todo, progress, tag, summary, show_progress)
    finally:
        if closer is not None:
            closer.close()
    summary.seconds = time.perf_counter() - t_start
    logger.info(
        "rerank-batch %s: %d queries done (%d resumed as done) in %.1f s (%.2f queries/s, %.1f documents/s); "
        "%d documents failed, %d missing from the document store (%d queries), %d queries in first-stage order",
        out, summary.done, summary.skipped, summary.seconds, summary.queries_per_second,
        summary.documents / summary.seconds if summary.seconds > 0 else 0.0,
        sum(len(v) for v in summary.failed_documents.values()),
        sum(len(v) for v in summary.missing_documents.values()), len(summary.missing_documents),
        len(summary.first_stage_queries),
    )
    return summary


@dataclass
class QueryOutcome:
    """One query of a batch, reranked: what :func:`commit_outcome` writes.

    Attributes:
        query_id: The query.
        lines: Its TREC lines (:func:`trec_lines`).
        hits: Hits written.
        status: ``"reranked"``, ``"partial"`` (some documents failed) or ``"first_stage"``.
        failed: Documents left out of reranking after failing.
        missing: First-stage hits missing from the document store.
        documents: Candidates reranked.
        seconds: Wall-clock time of the query.
    """

    query_id: str
    lines: str
    hits: int
    status: str = "reranked"
    failed: list[str] = field(default_factory=list)
    documents: int = 0
    seconds: float = 0.0
    missing: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def rerank_query(pipeline: Pipeline, q: Query, options: SearchOptions, tag: str) -> QueryOutcome:
    """Rerank one query of a batch with failure isolation (see the module docstring).

    Raises:
        ModelLoadError, MissingDependencyError: nothing can be reranked (the batch stops and
            leaves the query to a rerun).
    """
    tq = time.perf_counter()
    failed: list[str] = []
    status = "reranked"
    try:
        result = pipeline.search(q, options)
        ranking = result.ranking
        missing = list(result.missing)
        n_docs = len(result.rerank.ranking) if result.rerank is not None else 0
    except (ModelLoadError, MissingDependencyError):
        raise  # nothing can be reranked: stop, leaving the query to a rerun
    except Exception as exc:  # noqa: BLE001 - isolate the failure, the query still completes
        logger.warning("query %s: reranking failed (%s: %s); isolating the failure",
                       q.query_id, type(exc).__name__, exc)
        ranking, failed, reranked, missing = _isolate(pipeline, q, options, exc)
        n_docs = min(options.candidates, len(ranking)) - len(failed) if reranked else 0
        status = "partial" if reranked else "first_stage"
    return QueryOutcome(q.query_id, trec_lines(ranking, tag), len(ranking), status, failed, max(0, n_docs),
                        time.perf_counter() - tq, missing)


def commit_outcome(progress: Progress, summary: BatchSummary, outcome: QueryOutcome) -> None:
    """Write one query's outcome (output, then progress line) and count it in ``summary``."""
    if outcome.failed:
        summary.failed_documents[outcome.query_id] = list(outcome.failed)
    if outcome.missing:
        summary.missing_documents[outcome.query_id] = list(outcome.missing)
    if outcome.status == "first_stage":
        summary.first_stage_queries.append(outcome.query_id)
    progress.commit(outcome.query_id, outcome.lines,
                    {"hits": outcome.hits, "status": outcome.status, "failed": list(outcome.failed),
                     "seconds": round(outcome.seconds, 4), **({"missing": list(outcome.missing)} if outcome.missing else {})})
    summary.done += 1
    summary.documents += outcome.documents


def batch_record(pipeline: Pipeline, q: Query, options: SearchOptions, *, tag: str) -> dict[str, Any]:
    """One query's work in a batch (:data:`heedrank.engine.QueryWork`): :func:`rerank_query`
    as a JSON-ready :class:`QueryOutcome` dict."""
    return rerank_query(pipeline, q, options, tag).to_dict()


def run_on_engine(engine: Engine, pipeline: Pipeline, options: SearchOptions, todo: Sequence[Query],
                  progress: Progress, tag: str, summary: BatchSummary, show_progress: bool) -> None:
    """The batch's driver on any engine: ``engine`` reranks each query of ``todo``
    (:func:`batch_record`, where it runs the work) and each outcome, in ``todo`` order, is
    committed here (:func:`commit_outcome`) under one progress bar (queries/s, documents/s,
    failed documents).

    Raises:
        ModelLoadError, MissingDependencyError: nothing can be reranked (the queries
            committed before it stay).
        Whatever else the engine raises (e.g. RayExecutionError).
    """
    from heedrank.progress import Progress

    where = f", {engine.label}" if engine.label else ""
    bar = Progress(total=len(todo), desc=f"rerank-batch ({options.rerank}{where})", unit="query",
                   show_progress=show_progress)
    t0 = time.perf_counter()

    def commit(record: Mapping[str, Any]) -> None:
        commit_outcome(progress, summary, QueryOutcome(**record))
        bar.update(1)
        elapsed = time.perf_counter() - t0
        if show_progress and elapsed > 0:
            bar.set_postfix(qps=f"{summary.done / elapsed:.2f}", docs_s=f"{summary.documents / elapsed:.1f}",
                            failed=sum(len(v) for v in summary.failed_documents.values()))

    try:
        engine.map_queries(pipeline, options, todo, functools.partial(batch_record, tag=tag), commit)
    finally:
        bar.close()

"""TREC DL passage evaluation: rerank a fixed first-stage run (top-100 with passage text).

The first stage is a published run (e.g. Anserini BM25) read from a rank_llm
``retrieve_results_<RUN>_dlNN_top100.json[.gz]`` file of any track year (2019: ``dl19``,
2020: ``dl20``, ...; see :func:`attnrank.data.trec_dl_paths` for the recognised names, or
give explicit paths), served by
:class:`attnrank.retriever.run.RunRetriever` over an :class:`attnrank.index.memory.InMemoryDocStore` of its
passages, through the same :class:`attnrank.pipeline.Pipeline` as the API.

Metrics: nDCG@10 (graded), R@100 and RR@10 with grade >= 2 as relevant (TREC DL
convention for passages), and Judged@10, since the candidates are a subset of MS MARCO
and unjudged passages count as non-relevant. When reranking, the report also holds the
first-stage run's own metrics (base vs reranked).

Example:
    >>> report = evaluate_trec_dl("data/msmarco-trec-dl-2019-passage", run_name="BM25",
    ...                           rerank="icr", candidates=20)        # doctest: +SKIP
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from attnrank.config import RerankerConfig
from attnrank.engine import Engine
from attnrank.pipeline import NO_RERANK, Pipeline, SearchOptions
from attnrank.eval.harness import (
    EVAL_TOP_K,
    check_rerank_name,
    config_dict,
    file_sha256,
    report_name,
    run_evaluation,
    select_queries,
    subset_suffix,
    config_suffix,
)
from attnrank.eval.metrics import TREC_DL_METRICS
from attnrank.eval.report import EvalReport

logger = logging.getLogger(__name__)


def evaluate_trec_dl(
    data_dir: str | Path | None,
    *,
    run_name: str | None = None,
    rerank: str = NO_RERANK,
    candidates: int = 20,
    max_queries: int | None = None,
    seed: int = 0,
    out_dir: str | Path = "runs",
    reranker_config: RerankerConfig | None = None,
    metrics: tuple[str, ...] = TREC_DL_METRICS,
    year: str | None = None,
    show_progress: bool = True,
    dump_dir: str | Path | None = None,
    topics: str | Path | None = None,
    qrels: str | Path | None = None,
    run_file: str | Path | None = None,
    engine: Engine | None = None,
    fusion: float | None = None,
) -> EvalReport:
    """Rerank a TREC DL first-stage run and evaluate it; writes a TREC run and a JSON report.

    Args:
        data_dir: Folder with the topics, qrels and ``retrieve_results_<RUN>_<year>_top100.json[.gz]``
            of one year under Anserini / rank_llm names (``topics.dl19-passage.txt``,
            ``topics.dl21.txt``, ``qrels.dl20-passage.txt``, ...); ``None`` when ``topics``,
            ``qrels`` and ``run_file`` are all given.
        run_name: First-stage run, e.g. ``"BM25"``, ``"SPLADE_P_P_ENSEMBLE_DISTIL"``;
            default ``"BM25"``, or with ``run_file`` the ``<RUN>`` of its name (else its stem).
        rerank: Reranker name, or ``"none"`` (evaluates the run itself).
        candidates: Top first-stage hits reranked per query (at most 100 exist).
        max_queries: Evaluate a fixed seeded subset of this many judged queries.
        seed: Seed of the subset.
        out_dir: Folder of ``<name>.trec`` and ``<name>.json``.
        reranker_config: Model, ``max_doc_tokens``, device...; its ``method`` is replaced
            by ``rerank``. Default: ``RerankerConfig()``.
        metrics: Metric names (see :mod:`attnrank.eval.metrics`).
        year: Track year (``"dl21"``, ``"2021"``); default: detected from the file names.
        show_progress: Progress bars.
        dump_dir: Also save an attention dump of the reranked queries (ICR with option
            ``keep_attention``), for head detection and ablations.
        topics, qrels, run_file: Explicit file paths (topics TSV, qrels, rank_llm run
            JSON), for files named otherwise; they replace the ones found in ``data_dir``.
        fusion: ``alpha`` in [0, 1]: rank by ``alpha * z(first stage) + (1 - alpha) *
            z(reranker)`` (:attr:`attnrank.pipeline.SearchOptions.fusion`, the served fused
            path); ``None`` = the reranker's order. Named ``-f<alpha>`` in the report.
        engine: Run the searches elsewhere, e.g. on Ray
            (:class:`attnrank.engine.ray.RayEngine`); default: this process. The report
            is the same apart from timings and ``params.engine``.

    Returns:
        The saved report; ``name`` is ``<dataset>-<year>-<run>-<rerank>[-c<candidates>][-q<n>-s<seed>]``
        (``<dataset>`` is the folder's name, or the run file's folder without ``data_dir``;
        ``<year>`` is left out when unknown);
        ``first_stage_metrics`` holds the run's own metrics when reranking.

    Raises:
        NotFoundError: missing files (the message lists available runs).
        UnknownNameError: unknown reranker or metric.
        ValidationError: bad ``candidates``/``max_queries``; several years in ``data_dir``
            and no ``year``; malformed files.
    """
    from attnrank.data import load_run_json, load_trec_qrels, load_trec_topics, trec_dl_paths
    from attnrank.registry import build_reranker
    from attnrank.index.memory import InMemoryDocStore
    from attnrank.retriever.run import RunRetriever

    check_rerank_name(rerank)
    if run_name is None:
        run_name = _run_name_of(Path(run_file)) if run_file is not None else "BM25"
    data_dir = Path(data_dir) if data_dir is not None else None
    paths = trec_dl_paths(data_dir, run_name, year=year, topics=topics, qrels=qrels, run_file=run_file)
    dataset = (data_dir if data_dir is not None else paths.run_json.parent).resolve().name
    topic_queries = load_trec_topics(paths.topics)
    qrels = load_trec_qrels(paths.qrels)
    run, docs, run_queries = load_run_json(paths.run_json)
    # Official topic texts; the run file's own query text only where a topic is missing.
    queries = {**run_queries, **topic_queries}
    judged_without_run = sorted(q for q in qrels if qrels[q] and q in queries and q not in run)
    if judged_without_run:
        logger.warning("%d judged queries have no hits in run %s and will score 0: %s",
                       len(judged_without_run), run_name, judged_without_run[:10])
    selected, missing = select_queries(queries, qrels, max_queries, seed)

    base_config = reranker_config or RerankerConfig()
    pipeline = Pipeline(
        retrievers={"run": RunRetriever(run, name="run")},
        docstore=InMemoryDocStore(docs.values()),
        reranker_factory=lambda m: build_reranker(replace(base_config, method=m)),
        max_top_k=1000,
        max_candidates=1000,
    )
    options = SearchOptions(top_k=EVAL_TOP_K, retriever="run", rerank=rerank, candidates=candidates,
                            fusion=fusion)
    reranking = rerank != NO_RERANK
    name = report_name(
        dataset, paths.year, run_name, rerank,
        f"c{candidates}" if reranking else None,
        f"f{fusion:g}" if reranking and fusion is not None else None,
        config_suffix(reranker_config, reranking),
        subset_suffix(len(selected), max_queries, seed),
    )
    inputs: dict[str, Any] = {
        name_: {"path": str(p), "sha256": file_sha256(p)}
        for name_, p in (("topics", paths.topics), ("qrels", paths.qrels), ("run_json", paths.run_json))
    }
    inputs["passages"] = len(docs)
    params = {
        "data_dir": str(data_dir) if data_dir is not None else None, "run_name": run_name, "rerank": rerank,
        "candidates": candidates, "max_queries": max_queries, "seed": seed, "out_dir": str(out_dir),
        "year": paths.year, "topics": str(paths.topics), "qrels": str(paths.qrels), "run_file": str(paths.run_json),
        "reranker_config": config_dict(base_config) if reranking else None,
        "metrics": list(metrics), "fusion": fusion,
    }
    return run_evaluation(
        pipeline, selected, qrels, options, metrics,
        name=name, dataset=dataset, split="test", first_stage=f"run:{run_name}", out_dir=out_dir,
        inputs=inputs, params=params, missing=missing, show_progress=show_progress, dump_dir=dump_dir,
        engine=engine,
    )



def _run_name_of(path: Path) -> str:
    """``<RUN>`` of ``retrieve_results_<RUN>_<year>_top100.json[.gz]``, else the file's stem."""
    import re

    name = path.name.removesuffix(".gz").removesuffix(".json")
    m = re.fullmatch(r"retrieve_results_(.+)_dl\d\d_top100", name)
    return m.group(1) if m else name

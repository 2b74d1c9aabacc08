"""TREC DL passage evaluation: rerank a fixed first-stage run (top-100 with passage text).

The first stage is a published run (e.g. Anserini BM25) read from a rank_llm
``retrieve_results_<RUN>_dl19_top100.json[.gz]`` file, served by
:class:`retriever.run.RunRetriever` over an :class:`index.memory.InMemoryDocStore` of its
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
from attnrank.pipeline import NO_RERANK, Pipeline, SearchOptions
from eval.harness import (
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
from eval.metrics import TREC_DL_METRICS
from eval.report import EvalReport

logger = logging.getLogger(__name__)


def evaluate_trec_dl(
    data_dir: str | Path,
    *,
    run_name: str = "BM25",
    rerank: str = NO_RERANK,
    candidates: int = 20,
    max_queries: int | None = None,
    seed: int = 0,
    out_dir: str | Path = "runs",
    reranker_config: RerankerConfig | None = None,
    metrics: tuple[str, ...] = TREC_DL_METRICS,
    year: str = "dl19",
    show_progress: bool = True,
    dump_dir: str | Path | None = None,
) -> EvalReport:
    """Rerank a TREC DL first-stage run and evaluate it; writes a TREC run and a JSON report.

    Args:
        data_dir: Folder with ``topics.<year>-passage.txt``, ``qrels.<year>-passage.txt``
            and ``retrieve_results_<RUN>_<year>_top100.json[.gz]``.
        run_name: First-stage run, e.g. ``"BM25"``, ``"SPLADE_P_P_ENSEMBLE_DISTIL"``.
        rerank: Reranker name, or ``"none"`` (evaluates the run itself).
        candidates: Top first-stage hits reranked per query (at most 100 exist).
        max_queries: Evaluate a fixed seeded subset of this many judged queries.
        seed: Seed of the subset.
        out_dir: Folder of ``<name>.trec`` and ``<name>.json``.
        reranker_config: Model, ``max_doc_tokens``, device...; its ``method`` is replaced
            by ``rerank``. Default: ``RerankerConfig()``.
        metrics: Metric names (see :mod:`eval.metrics`).
        year: Track year prefix of the file names.
        show_progress: Progress bars.
        dump_dir: Also save an attention dump of the reranked queries (ICR with option
            ``keep_attention``), for head detection and ablations.

    Returns:
        The saved report; ``name`` is ``<dataset>-<run>-<rerank>[-c<candidates>][-q<n>-s<seed>]``;
        ``first_stage_metrics`` holds the run's own metrics when reranking.

    Raises:
        NotFoundError: missing files (the message lists available runs).
        UnknownNameError: unknown reranker or metric.
        ValidationError: bad ``candidates``/``max_queries``.
    """
    from attnrank.data import load_run_json, load_trec_qrels, load_trec_topics, trec_dl_paths
    from attnrank.registry import build_reranker
    from index.memory import InMemoryDocStore
    from retriever.run import RunRetriever

    check_rerank_name(rerank)
    data_dir = Path(data_dir)
    dataset = data_dir.resolve().name
    paths = trec_dl_paths(data_dir, run_name, year=year)
    topics = load_trec_topics(paths.topics)
    qrels = load_trec_qrels(paths.qrels)
    run, docs, run_queries = load_run_json(paths.run_json)
    # Official topic texts; the run file's own query text only where a topic is missing.
    queries = {**run_queries, **topics}
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
    options = SearchOptions(top_k=EVAL_TOP_K, retriever="run", rerank=rerank, candidates=candidates)
    reranking = rerank != NO_RERANK
    name = report_name(
        dataset, run_name, rerank,
        f"c{candidates}" if reranking else None,
        config_suffix(reranker_config, reranking),
        subset_suffix(len(selected), max_queries, seed),
    )
    inputs: dict[str, Any] = {
        name_: {"path": str(p), "sha256": file_sha256(p)}
        for name_, p in (("topics", paths.topics), ("qrels", paths.qrels), ("run_json", paths.run_json))
    }
    inputs["passages"] = len(docs)
    params = {
        "data_dir": str(data_dir), "run_name": run_name, "rerank": rerank, "candidates": candidates,
        "max_queries": max_queries, "seed": seed, "out_dir": str(out_dir), "year": year,
        "reranker_config": config_dict(base_config) if reranking else None,
        "metrics": list(metrics),
    }
    return run_evaluation(
        pipeline, selected, qrels, options, metrics,
        name=name, dataset=dataset, split="test", first_stage=f"run:{run_name}", out_dir=out_dir,
        inputs=inputs, params=params, missing=missing, show_progress=show_progress, dump_dir=dump_dir,
    )


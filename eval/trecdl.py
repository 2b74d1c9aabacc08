"""TREC DL passage evaluation: rerank a fixed first-stage run (top-100 with passage text).

The first stage is a published run (e.g. Anserini BM25) read from a rank_llm
``retrieve_results_<RUN>_dlNN_top100.json[.gz]`` file of any track year (2019: ``dl19``,
2020: ``dl20``, ...; see :func:`heedrank.data.trec_dl_paths` for the recognised names, or
give explicit paths), served by
:class:`heedrank.retriever.run.RunRetriever` over an :class:`heedrank.index.memory.InMemoryDocStore` of its
passages, through the same :class:`heedrank.pipeline.Pipeline` as the API.

Metrics: nDCG@10 (graded), R@100 and RR@10 with grade >= 2 as relevant (TREC DL
convention for passages), and Judged@10, since the candidates are a subset of MS MARCO
and unjudged passages count as non-relevant. When reranking, the report also holds the
first-stage run's own metrics (base vs reranked).

Example:
    >>> spec = EvalSpec("data/msmarco-trec-dl-2019-passage", run_name="BM25", rerank="icr", candidates=20)
    >>> report = evaluate_trec_dl(spec)                                # doctest: +SKIP
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from heedrank.config import RerankerConfig
from heedrank.files import file_sha256
from heedrank.pipeline import Pipeline
from heedrank.eval.harness import (
    EvalTarget,
    check_rerank_name,
    config_dict,
    run_evaluation,
    select_queries,
    spec_report_name,
)
from heedrank.eval.metrics import TREC_DL_METRICS
from heedrank.eval.report import EvalReport
from heedrank.eval.spec import EvalSpec

logger = logging.getLogger(__name__)


def evaluate_trec_dl(spec: EvalSpec) -> EvalReport:
    """Rerank a TREC DL first-stage run and evaluate it; writes a TREC run and a JSON report.

    Args:
        spec: The evaluation (:class:`~heedrank.eval.spec.EvalSpec`: ``data_dir``, its TREC
            DL fields ``run_name``, ``year``, ``topics``, ``qrels``, ``run_file``, and the
            shared ones; at most 100 candidates exist per query).

    Returns:
        The saved report; ``name`` is ``<dataset>-<year>-<run>-<rerank>[-c<candidates>][-f<alpha>][-<config>][-q<n>-s<seed>]``
        (``<dataset>`` is the folder's name, or the run file's folder without ``data_dir``;
        ``<year>`` is left out when unknown);
        ``first_stage_metrics`` holds the run's own metrics when reranking.

    Raises:
        NotFoundError: missing files (the message lists available runs).
        UnknownNameError: unknown reranker or metric.
        ValidationError: bad ``candidates``/``max_queries``; several years in ``data_dir``
            and no ``year``; malformed files; BEIR fields set.
    """
    from heedrank.data import load_run_json, load_trec_qrels, load_trec_topics, trec_dl_paths
    from heedrank.registry import build_reranker
    from heedrank.index.memory import InMemoryDocStore
    from heedrank.retriever.run import RunRetriever

    spec.check_for("trec-dl")
    check_rerank_name(spec.rerank)
    run_name = spec.run_name
    if run_name is None:
        run_name = _run_name_of(Path(spec.run_file)) if spec.run_file is not None else "BM25"
    spec = replace(spec, metrics=spec.metrics or TREC_DL_METRICS, run_name=run_name)
    data_dir = Path(spec.data_dir) if spec.data_dir is not None else None
    paths = trec_dl_paths(data_dir, run_name, year=spec.year, topics=spec.topics, qrels=spec.qrels,
                          run_file=spec.run_file)
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
    selected, missing = select_queries(queries, qrels, spec.max_queries, spec.seed)

    from heedrank import registry

    base_config = spec.reranker_config or RerankerConfig()
    pipeline = Pipeline(
        retrievers={"run": RunRetriever(run, name="run")},
        docstore=InMemoryDocStore(docs.values()),
        reranker_factory=lambda m: build_reranker(replace(base_config, method=m)),
        max_top_k=1000,
        max_candidates=1000,
        dense=registry.dense_signal(),  # the passages come as text: encoded by the packaged embedder
    )
    name = spec_report_name(spec, (dataset, paths.year, run_name), len(selected))
    inputs: dict[str, Any] = {
        name_: {"path": str(p), "sha256": file_sha256(p)}
        for name_, p in (("topics", paths.topics), ("qrels", paths.qrels), ("run_json", paths.run_json))
    }
    inputs["passages"] = len(docs)
    params = {
        "data_dir": str(data_dir) if data_dir is not None else None, "run_name": run_name, "rerank": spec.rerank,
        "candidates": spec.candidates, "max_queries": spec.max_queries, "seed": spec.seed,
        "out_dir": str(spec.out_dir), "year": paths.year, "topics": str(paths.topics), "qrels": str(paths.qrels),
        "run_file": str(paths.run_json),
        "reranker_config": config_dict(base_config) if spec.reranking else None,
        "metrics": list(spec.metrics or ()), "fusion": spec.fusion,
    }
    target = EvalTarget(name=name, dataset=dataset, split="test", first_stage=f"run:{run_name}", retriever="run",
                        inputs=inputs, params=params, missing=missing)
    return run_evaluation(pipeline, selected, qrels, spec, target)


def _run_name_of(path: Path) -> str:
    """``<RUN>`` of ``retrieve_results_<RUN>_<year>_top100.json[.gz]``, else the file's stem."""
    import re

    name = path.name.removesuffix(".gz").removesuffix(".json")
    m = re.fullmatch(r"retrieve_results_(.+)_dl\d\d_top100", name)
    return m.group(1) if m else name

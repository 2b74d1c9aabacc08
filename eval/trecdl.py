"""TREC DL passage evaluation: rerank a fixed first-stage run (top-100 with passage text).

The first stage is a published run (e.g. Anserini BM25) read from a rank_llm
``retrieve_results_<RUN>_dlNN_top100.json[.gz]`` file of any track year (2019: ``dl19``,
2020: ``dl20``, ...; see :func:`heedrank.data.trec_dl_paths` for the recognised names, or
give explicit paths), served by
:class:`heedrank.retriever.run.RunRetriever` over an :class:`heedrank.index.memory.InMemoryDocStore` of its
passages, through the same :class:`heedrank.pipeline.Pipeline` as the API. The other
candidate-list sets load the same way from their folders (:mod:`heedrank.eval.sets`): the MS
MARCO passage dev sample ``msmarco-passage-dev-600`` (top 20, seeded train/test folds) and
NovelEval (20 web passages a question).

Metrics: the set's (:class:`heedrank.eval.sets.SetKind`). TREC DL: nDCG@10 (graded), R@100
and RR@10 with grade >= 2 as relevant (TREC DL convention for passages), and Judged@10, since
the candidates are a subset of MS MARCO and unjudged passages count as non-relevant. MS MARCO
dev: nDCG@10, RR@10 (MRR@10) and R@10 with grade >= 1 (binary qrels). NovelEval: nDCG@10, @5,
@1 and RR@10 with grade >= 1. When reranking, the report also holds the first-stage run's own
metrics (base vs reranked).

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
from heedrank.eval.report import EvalReport
from heedrank.eval.spec import EvalSpec

logger = logging.getLogger(__name__)


def evaluate_trec_dl(spec: EvalSpec) -> EvalReport:
    """Rerank a candidate set's first-stage run and evaluate it; writes a TREC run and a JSON report.

    Args:
        spec: The evaluation (:class:`~heedrank.eval.spec.EvalSpec`: ``data_dir``, ``split``
            (a fold of a set with folds, :func:`heedrank.eval.sets.load_candidate_set`), its
            TREC DL fields ``run_name``, ``year``, ``topics``, ``qrels``, ``run_file``, and the
            shared ones; at most 100 candidates exist per query, 20 in dev-600 and NovelEval).

    Returns:
        The saved report; ``name`` is ``<dataset>-<tag>[-<fold>]-<run>-<rerank>[-c<candidates>][-f<alpha>][-<config>][-q<n>-s<seed>]``
        (``<dataset>`` is the folder's name, or the run file's folder without ``data_dir``;
        ``<tag>`` the year or dev tag, left out when unknown and for NovelEval; ``<fold>`` the
        split of a set with folds); ``split`` is the fold (``test`` for a set without folds);
        ``params.min_relevant`` the relevance level of the binary measures;
        ``first_stage_metrics`` holds the run's own metrics when reranking.

    Raises:
        NotFoundError: missing files (the message lists available runs).
        UnknownNameError: unknown reranker or metric.
        ValidationError: bad ``candidates``/``max_queries``/``split``; several years in
            ``data_dir`` and no ``year``; malformed files; BEIR fields set.
    """
    from heedrank.registry import build_reranker
    from heedrank.index.memory import InMemoryDocStore
    from heedrank.retriever.run import RunRetriever
    from heedrank.eval.sets import load_candidate_set

    spec.check_for("trec-dl")
    check_rerank_name(spec.rerank)
    data_dir = Path(spec.data_dir) if spec.data_dir is not None else None
    cs = load_candidate_set(data_dir, spec.run_name, split=spec.split, year=spec.year, topics=spec.topics,
                            qrels=spec.qrels, run_file=spec.run_file)
    run_name, qrels, run, docs = cs.run_name, cs.qrels, cs.run, cs.docs
    spec = replace(spec, metrics=spec.metrics or cs.kind.metrics, run_name=run_name)
    dataset = (data_dir if data_dir is not None else cs.files["run_json"].parent).resolve().name
    judged_without_run = sorted(q for q in qrels if qrels[q] and q in cs.queries and q not in run)
    if judged_without_run:
        logger.warning("%d judged queries have no hits in run %s and will score 0: %s",
                       len(judged_without_run), run_name, judged_without_run[:10])
    selected, missing = select_queries(cs.queries, qrels, spec.max_queries, spec.seed)

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
    tag = None if cs.kind.name == "noveleval" else cs.name
    name = spec_report_name(spec, (dataset, tag, cs.split if cs.kind.folds else None, run_name), len(selected))
    inputs: dict[str, Any] = {role: {"path": str(p), "sha256": file_sha256(p)} for role, p in cs.files.items()}
    inputs["passages"] = len(docs)
    params = {
        "data_dir": str(data_dir) if data_dir is not None else None, "run_name": run_name, "rerank": spec.rerank,
        "candidates": spec.candidates, "max_queries": spec.max_queries, "seed": spec.seed,
        "out_dir": str(spec.out_dir), "year": cs.name, "set": cs.kind.name, "split": cs.split,
        "min_relevant": cs.kind.min_relevant,
        **{role: str(p) for role, p in cs.files.items() if role in ("topics", "qrels")},
        "run_file": str(cs.files["run_json"]) if "run_json" in cs.files else None,
        "reranker_config": config_dict(base_config) if spec.reranking else None,
        "metrics": list(spec.metrics or ()), "fusion": spec.fusion,
    }
    target = EvalTarget(name=name, dataset=dataset, split=cs.split, first_stage=f"run:{run_name}", retriever="run",
                        inputs=inputs, params=params, missing=missing)
    return run_evaluation(pipeline, selected, qrels, spec, target)

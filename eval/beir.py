"""BEIR evaluation: nDCG@10, R@100, RR@10 of the search pipeline on a BEIR-layout dataset.

Runs the same :class:`heedrank.pipeline.Pipeline` as the API (built with
:meth:`~heedrank.pipeline.Pipeline.from_config`) over an index of the dataset's corpus,
which is built once and cached when no index is given.

BEIR's protocol is followed on corpora that contain the queries (ArguAna, Quora, ...):
BEIR's evaluator (``EvaluateRetrieval.evaluate(..., ignore_identical_ids=True)``) drops a
retrieved document whose id equals the query id. Here that document is dropped from the
first stage already (:class:`IgnoreIdenticalIds` retrieves one more hit and removes it),
so it takes no reranking candidate slot either; ``keep_identical_ids=True`` keeps it.

Example:
    >>> spec = EvalSpec("data/beir-nfcorpus", retriever="bm25", rerank="icr", candidates=20, max_queries=50)
    >>> report = evaluate_beir(spec)                                   # doctest: +SKIP
    >>> print(format_table([report]))                                  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from heedrank.config import PipelineConfig, RerankerConfig
from heedrank.errors import UnknownNameError, ValidationError
from heedrank.files import file_sha256
from heedrank.pipeline import Pipeline
from heedrank.protocols import FilterArg, Retriever
from heedrank.types import Query, Ranking
from heedrank.eval.harness import (
    EvalTarget,
    check_rerank_name,
    config_dict,
    run_evaluation,
    select_queries,
    spec_report_name,
)
from heedrank.eval.metrics import BEIR_METRICS
from heedrank.eval.report import EvalReport
from heedrank.eval.spec import EvalSpec

logger = logging.getLogger(__name__)


class IgnoreIdenticalIds:
    """A first-stage retriever that drops the hit whose doc id equals its query id, as
    BEIR's ``EvaluateRetrieval.evaluate(..., ignore_identical_ids=True)`` does. It asks
    ``inner`` for ``k + 1`` hits, so each query still gets ``k`` (the self-hit takes no
    candidate slot).

    Attributes:
        dropped: Self-hits dropped so far (over all calls).
    """

    def __init__(self, inner: Retriever) -> None:
        self.inner = inner
        self.name = inner.name
        self.dropped = 0

    def retrieve(self, queries: Sequence[Query], k: int, *, filter: FilterArg | None = None) -> list[Ranking]:
        """``inner``'s top-``k`` of each query without the query's own id."""
        out = []
        for q, ranking in zip(queries, self.inner.retrieve(queries, k + 1, filter=filter)):
            hits = tuple(h for h in ranking.hits if h.doc_id != q.query_id)
            self.dropped += len(ranking.hits) - len(hits)
            out.append(Ranking(ranking.query_id, hits[:k]))
        return out


def cached_index_dir(data_dir: str | Path, corpus_sha256: str) -> Path:
    """``<cache>/indexes/<dataset folder name>-<first 12 hex of the corpus sha256>``.

    ``<cache>`` is ``$HEEDRANK_CACHE_DIR`` or ``~/.cache/heedrank``.
    """
    from heedrank.data import default_cache_dir

    return default_cache_dir() / "indexes" / f"{Path(data_dir).resolve().name}-{corpus_sha256[:12]}"


def ensure_index(data_dir: str | Path, *, dense: bool = True, corpus_sha256: str | None = None) -> Path:
    """The cached index of a BEIR dataset's corpus, built on first use.

    :func:`heedrank.index.builder.build_index` writes into a temporary folder and renames it into
    place, so an interrupted build never leaves a half-written index to be reused.

    Args:
        data_dir: BEIR-layout folder (``corpus.jsonl[.gz]``).
        dense: Also compute dense vectors (needed by the ``dense``/``hybrid`` retrievers);
            a cached index without them is then rebuilt.
        corpus_sha256: The corpus file's sha256 when already known (else computed).

    Returns:
        The index directory (see :func:`cached_index_dir`).

    Raises:
        NotFoundError: no corpus file.
        ModelLoadError: the embedder cannot be loaded (with ``dense``).
    """
    from heedrank.data import find_beir_corpus
    from heedrank.index.builder import PARAMS_FILE, build_index, read_params

    corpus = find_beir_corpus(data_dir)
    target = cached_index_dir(data_dir, corpus_sha256 or file_sha256(corpus))
    rebuild = False
    if (target / PARAMS_FILE).is_file():
        if not dense or read_params(target).get("dense"):
            logger.info("reusing cached index %s", target)
            return target
        logger.info("cached index %s has no dense vectors; rebuilding it with them", target)
        rebuild = True
    else:
        logger.info("building index of %s into %s (once; cached)", corpus, target)
    try:
        build_index(corpus, target, dense=dense, show_progress=True, overwrite=rebuild)
    except ValidationError:
        if not (target / PARAMS_FILE).is_file():
            raise
        logger.info("another process built %s meanwhile; using it", target)
    return target


def evaluate_beir(spec: EvalSpec) -> EvalReport:
    """Evaluate the pipeline on a BEIR dataset and write a TREC run and a JSON report.

    Args:
        spec: The evaluation (:class:`~heedrank.eval.spec.EvalSpec`: ``data_dir``, its BEIR
            fields ``split``, ``retriever``, ``index_dir``, ``build_dense``,
            ``keep_identical_ids``, and the shared ones).

    Returns:
        The saved report; ``name`` is ``<dataset>-<split>-<retriever>-<rerank>[-c<candidates>][-f<alpha>][-<config>][-keepids][-q<n>-s<seed>]``.
        ``params.keep_identical_ids`` records the BEIR self-hit rule (see :class:`IgnoreIdenticalIds`).

    Raises:
        NotFoundError: missing dataset files or index.
        UnknownNameError: unknown retriever, reranker or metric.
        ValidationError: bad ``candidates``/``max_queries``; no ``data_dir``; TREC DL fields set.
    """
    from heedrank import registry
    from heedrank.data import find_beir_corpus, load_beir_qrels, load_beir_queries

    spec.check_for("beir")
    if spec.data_dir is None:
        raise ValidationError("a BEIR evaluation needs data_dir, the dataset folder (--data)")
    spec = replace(spec, metrics=spec.metrics or BEIR_METRICS)
    check_rerank_name(spec.rerank)
    retriever, split = spec.retriever, spec.split
    if retriever not in registry.retriever_names():
        raise UnknownNameError(f"unknown retriever {retriever!r}; choose one of {registry.retriever_names()}")
    data_dir = Path(spec.data_dir)
    dataset = data_dir.resolve().name
    queries = load_beir_queries(data_dir)
    qrels = load_beir_qrels(data_dir, split)
    selected, missing = select_queries(queries, qrels, spec.max_queries, spec.seed)

    inputs: dict[str, Any] = {"data_dir": str(data_dir)}
    for qrels_file in sorted((data_dir / "qrels").glob(f"{split}.tsv*"))[:1]:
        inputs["qrels"] = {"path": str(qrels_file), "sha256": file_sha256(qrels_file)}
    index_dir = spec.index_dir
    if index_dir is None:
        corpus = find_beir_corpus(data_dir)
        digest = file_sha256(corpus)
        inputs["corpus"] = {"path": str(corpus), "sha256": digest}
        dense = spec.build_dense or retriever != "bm25"
        index_dir = ensure_index(data_dir, dense=dense, corpus_sha256=digest)
    inputs["index_dir"] = str(index_dir)

    config = PipelineConfig(
        index_dir=str(index_dir),
        reranker=spec.reranker_config or RerankerConfig(),
        max_top_k=1000,
        max_candidates=1000,
        show_progress=spec.show_progress,
    )
    pipeline = Pipeline.from_config(config)
    dropper = None
    if not spec.keep_identical_ids and retriever in pipeline.retrievers:
        dropper = IgnoreIdenticalIds(pipeline.retrievers[retriever])
        pipeline.retrievers = {**pipeline.retrievers, retriever: dropper}
    name = spec_report_name(spec, (dataset, split, retriever), len(selected),
                            ("keepids" if spec.keep_identical_ids else None,))
    params = {
        "data_dir": str(data_dir), "split": split, "retriever": retriever, "rerank": spec.rerank,
        "candidates": spec.candidates, "max_queries": spec.max_queries, "seed": spec.seed,
        "index_dir": str(index_dir), "out_dir": str(spec.out_dir),
        "reranker_config": config_dict(config.reranker) if spec.reranking else None,
        "metrics": list(spec.metrics or ()), "fusion": spec.fusion,
        "keep_identical_ids": spec.keep_identical_ids,
    }
    target = EvalTarget(name=name, dataset=dataset, split=split, first_stage=retriever, retriever=retriever,
                        inputs=inputs, params=params, missing=missing)
    report = run_evaluation(pipeline, selected, qrels, spec, target)
    if dropper is not None and dropper.dropped:
        logger.info("dropped %d retrieved documents whose id equals their query's (BEIR's ignore_identical_ids; "
                    "--keep-identical-ids keeps them)", dropper.dropped)
    return report

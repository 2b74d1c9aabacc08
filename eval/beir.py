"""BEIR evaluation: nDCG@10, R@100, RR@10 of the search pipeline on a BEIR-layout dataset.

Runs the same :class:`attnrank.pipeline.Pipeline` as the API (built with
:meth:`~attnrank.pipeline.Pipeline.from_config`) over an index of the dataset's corpus,
which is built once and cached when no index is given.

Example:
    >>> report = evaluate_beir("data/beir-nfcorpus", retriever="bm25", rerank="icr",
    ...                        candidates=20, max_queries=50)          # doctest: +SKIP
    >>> print(format_table([report]))                                  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from attnrank.config import PipelineConfig, RerankerConfig
from attnrank.errors import UnknownNameError
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
from eval.metrics import BEIR_METRICS
from eval.report import EvalReport

logger = logging.getLogger(__name__)


def cached_index_dir(data_dir: str | Path, corpus_sha256: str) -> Path:
    """``<cache>/indexes/<dataset folder name>-<first 12 hex of the corpus sha256>``.

    ``<cache>`` is ``$ATTNRANK_CACHE_DIR`` or ``~/.cache/attnrank``.
    """
    from attnrank.data import default_cache_dir

    return default_cache_dir() / "indexes" / f"{Path(data_dir).resolve().name}-{corpus_sha256[:12]}"


def ensure_index(data_dir: str | Path, *, dense: bool = True, corpus_sha256: str | None = None) -> Path:
    """The cached index of a BEIR dataset's corpus, built on first use.

    :func:`index.builder.build_index` writes into a temporary folder and renames it into
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
    from attnrank.data import find_beir_corpus
    from attnrank.errors import ValidationError
    from index.builder import PARAMS_FILE, build_index, read_params

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


def evaluate_beir(
    data_dir: str | Path,
    *,
    split: str = "test",
    retriever: str = "bm25",
    rerank: str = NO_RERANK,
    candidates: int = 20,
    max_queries: int | None = None,
    seed: int = 0,
    index_dir: str | Path | None = None,
    out_dir: str | Path = "runs",
    reranker_config: RerankerConfig | None = None,
    metrics: tuple[str, ...] = BEIR_METRICS,
    build_dense: bool = True,
    show_progress: bool = True,
    dump_dir: str | Path | None = None,
) -> EvalReport:
    """Evaluate the pipeline on a BEIR dataset and write a TREC run and a JSON report.

    Args:
        data_dir: BEIR-layout folder (``corpus.jsonl[.gz]``, ``queries.jsonl[.gz]``,
            ``qrels/<split>.tsv``).
        split: Qrels split (``"test"``, ``"dev"``, ``"train"``).
        retriever: First-stage retriever (``"bm25"``, ``"dense"``, ``"hybrid"``).
        rerank: Reranker name, or ``"none"`` for first-stage order.
        candidates: First-stage hits reranked per query.
        max_queries: Evaluate a fixed seeded subset of this many judged queries.
        seed: Seed of the subset.
        index_dir: Index directory; ``None`` = build once into the cache
            (:func:`ensure_index`) and reuse it.
        out_dir: Folder of ``<name>.trec`` (top-100 run) and ``<name>.json`` (report).
        reranker_config: Model, ``max_doc_tokens``, device...; its ``method`` is replaced
            by ``rerank``. Default: ``RerankerConfig()``.
        metrics: Metric names (see :mod:`eval.metrics`).
        build_dense: When building the cached index, also compute dense vectors (always
            done for the ``dense`` and ``hybrid`` retrievers).
        show_progress: Progress bars.
        dump_dir: Also save an attention dump of the reranked queries (ICR with option
            ``keep_attention``), for head detection and ablations.

    Returns:
        The saved report; ``name`` is ``<dataset>-<split>-<retriever>-<rerank>[-c<candidates>][-q<n>-s<seed>]``.

    Raises:
        NotFoundError: missing dataset files or index.
        UnknownNameError: unknown retriever, reranker or metric.
        ValidationError: bad ``candidates``/``max_queries``.
    """
    from attnrank import registry
    from attnrank.data import find_beir_corpus, load_beir_qrels, load_beir_queries

    check_rerank_name(rerank)
    if retriever not in registry.retriever_names():
        raise UnknownNameError(f"unknown retriever {retriever!r}; choose one of {registry.retriever_names()}")
    data_dir = Path(data_dir)
    dataset = data_dir.resolve().name
    queries = load_beir_queries(data_dir)
    qrels = load_beir_qrels(data_dir, split)
    selected, missing = select_queries(queries, qrels, max_queries, seed)

    inputs: dict[str, Any] = {"data_dir": str(data_dir)}
    for qrels_file in sorted((data_dir / "qrels").glob(f"{split}.tsv*"))[:1]:
        inputs["qrels"] = {"path": str(qrels_file), "sha256": file_sha256(qrels_file)}
    if index_dir is None:
        corpus = find_beir_corpus(data_dir)
        digest = file_sha256(corpus)
        inputs["corpus"] = {"path": str(corpus), "sha256": digest}
        dense = build_dense or retriever != "bm25"
        index_dir = ensure_index(data_dir, dense=dense, corpus_sha256=digest)
    inputs["index_dir"] = str(index_dir)

    config = PipelineConfig(
        index_dir=str(index_dir),
        reranker=reranker_config or RerankerConfig(),
        max_top_k=1000,
        max_candidates=1000,
        show_progress=show_progress,
    )
    pipeline = Pipeline.from_config(config)
    options = SearchOptions(top_k=EVAL_TOP_K, retriever=retriever, rerank=rerank, candidates=candidates)
    reranking = rerank != NO_RERANK
    name = report_name(
        dataset, split, retriever, rerank,
        f"c{candidates}" if reranking else None,
        config_suffix(reranker_config, reranking),
        subset_suffix(len(selected), max_queries, seed),
    )
    params = {
        "data_dir": str(data_dir), "split": split, "retriever": retriever, "rerank": rerank,
        "candidates": candidates, "max_queries": max_queries, "seed": seed,
        "index_dir": str(index_dir), "out_dir": str(out_dir),
        "reranker_config": config_dict(config.reranker) if reranking else None,
        "metrics": list(metrics),
    }
    return run_evaluation(
        pipeline, selected, qrels, options, metrics,
        name=name, dataset=dataset, split=split, first_stage=retriever, out_dir=out_dir,
        inputs=inputs, params=params, missing=missing, show_progress=show_progress, dump_dir=dump_dir,
    )


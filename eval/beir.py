"""BEIR evaluation: nDCG@10, R@100, RR@10 of the search pipeline on a BEIR-layout dataset.

Runs the same :class:`attnrank.pipeline.Pipeline` as the API (built with
:meth:`~attnrank.pipeline.Pipeline.from_config`) over an index of the dataset's corpus,
which is built once and cached when no index is given.

BEIR's protocol is followed on corpora that contain the queries (ArguAna, Quora, ...):
BEIR's evaluator (``EvaluateRetrieval.evaluate(..., ignore_identical_ids=True)``) drops a
retrieved document whose id equals the query id. Here that document is dropped from the
first stage already (:class:`IgnoreIdenticalIds` retrieves one more hit and removes it),
so it takes no reranking candidate slot either; ``keep_identical_ids=True`` keeps it.

Example:
    >>> report = evaluate_beir("data/beir-nfcorpus", retriever="bm25", rerank="icr",
    ...                        candidates=20, max_queries=50)          # doctest: +SKIP
    >>> print(format_table([report]))                                  # doctest: +SKIP
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from attnrank.config import PipelineConfig, RerankerConfig
from attnrank.engine import Engine
from attnrank.errors import UnknownNameError
from attnrank.pipeline import NO_RERANK, Pipeline, SearchOptions
from attnrank.protocols import FilterArg, Retriever
from attnrank.types import Query, Ranking
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
from attnrank.eval.metrics import BEIR_METRICS
from attnrank.eval.report import EvalReport

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

    ``<cache>`` is ``$ATTNRANK_CACHE_DIR`` or ``~/.cache/attnrank``.
    """
    from attnrank.data import default_cache_dir

    return default_cache_dir() / "indexes" / f"{Path(data_dir).resolve().name}-{corpus_sha256[:12]}"


def ensure_index(data_dir: str | Path, *, dense: bool = True, corpus_sha256: str | None = None) -> Path:
    """The cached index of a BEIR dataset's corpus, built on first use.

    :func:`attnrank.index.builder.build_index` writes into a temporary folder and renames it into
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
    from attnrank.index.builder import PARAMS_FILE, build_index, read_params

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
    keep_identical_ids: bool = False,
    engine: Engine | None = None,
    fusion: float | None = None,
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
        metrics: Metric names (see :mod:`attnrank.eval.metrics`).
        build_dense: When building the cached index, also compute dense vectors (always
            done for the ``dense`` and ``hybrid`` retrievers).
        show_progress: Progress bars.
        dump_dir: Also save an attention dump of the reranked queries (ICR with option
            ``keep_attention``), for head detection and ablations.
        keep_identical_ids: Keep a retrieved document whose id equals the query id. Default
            ``False`` follows BEIR (``ignore_identical_ids=True``), dropping it before
            reranking (see :class:`IgnoreIdenticalIds`). Recorded as
            ``params.keep_identical_ids``.
        fusion: ``alpha`` in [0, 1]: rank by ``alpha * z(first stage) + (1 - alpha) *
            z(reranker)`` (:attr:`attnrank.pipeline.SearchOptions.fusion`, the served fused
            path); ``None`` = the reranker's order. Named ``-f<alpha>`` in the report.
        engine: Run the searches elsewhere, e.g. on Ray
            (:class:`attnrank.engine.ray.RayEngine`; the first stage still runs here);
            default: this process. The report is the same apart from timings and ``params.engine``.

    Returns:
        The saved report; ``name`` is ``<dataset>-<split>-<retriever>-<rerank>[-c<candidates>][-keepids][-q<n>-s<seed>]``.

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
    dropper = None
    if not keep_identical_ids and retriever in pipeline.retrievers:
        dropper = IgnoreIdenticalIds(pipeline.retrievers[retriever])
        pipeline.retrievers = {**pipeline.retrievers, retriever: dropper}
    options = SearchOptions(top_k=EVAL_TOP_K, retriever=retriever, rerank=rerank, candidates=candidates,
                            fusion=fusion)
    reranking = rerank != NO_RERANK
    name = report_name(
        dataset, split, retriever, rerank,
        f"c{candidates}" if reranking else None,
        f"f{fusion:g}" if reranking and fusion is not None else None,
        config_suffix(reranker_config, reranking),
        "keepids" if keep_identical_ids else None,
        subset_suffix(len(selected), max_queries, seed),
    )
    params = {
        "data_dir": str(data_dir), "split": split, "retriever": retriever, "rerank": rerank,
        "candidates": candidates, "max_queries": max_queries, "seed": seed,
        "index_dir": str(index_dir), "out_dir": str(out_dir),
        "reranker_config": config_dict(config.reranker) if reranking else None,
        "metrics": list(metrics), "fusion": fusion,
        "keep_identical_ids": keep_identical_ids,
    }
    report = run_evaluation(
        pipeline, selected, qrels, options, metrics,
        name=name, dataset=dataset, split=split, first_stage=retriever, out_dir=out_dir,
        inputs=inputs, params=params, missing=missing, show_progress=show_progress, dump_dir=dump_dir,
        engine=engine,
    )
    if dropper is not None and dropper.dropped:
        logger.info("dropped %d retrieved documents whose id equals their query's (BEIR's ignore_identical_ids; "
                    "--keep-identical-ids keeps them)", dropper.dropped)
    return report


"""Shared evaluation steps: query selection, running the pipeline, building the report.

Both :mod:`heedrank.eval.beir` and :mod:`heedrank.eval.trecdl` run queries through the same
:class:`heedrank.pipeline.Pipeline` that serves the API, then evaluate its output here.
"""

from __future__ import annotations

import hashlib
import logging
import random
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from heedrank.engine import LocalEngine
from heedrank.errors import UnknownNameError, ValidationError
from heedrank.jsonable import jsonable
from heedrank.pipeline import NO_RERANK, Pipeline, SearchOptions
from heedrank.types import Qrels, Query
from heedrank.eval.metrics import evaluate_run
from heedrank.eval.report import EvalReport, latency_summary, now_iso, save_report
from heedrank.eval.spec import EvalSpec

__all__ = ["EVAL_TOP_K", "EvalTarget", "check_rerank_name", "config_dict", "config_suffix", "report_name", "run_evaluation",
           "select_queries", "spec_report_name", "subset_suffix"]

logger = logging.getLogger(__name__)

EVAL_TOP_K = 100
"""Depth of the evaluated rankings and of the written run files."""


def select_queries(
    queries: Mapping[str, Query], qrels: Qrels, max_queries: int | None, seed: int
) -> tuple[list[Query], list[str]]:
    """The queries to evaluate: those with qrels, optionally a fixed seeded subset.

    The subset is ``random.Random(seed).sample(sorted(ids), max_queries)``, then sorted,
    so the same ``(max_queries, seed)`` always picks the same queries.

    Args:
        queries: Query texts by id (may hold queries of other splits).
        qrels: Judgements of the evaluated split; only queries with at least one
            judgement are evaluated.
        max_queries: Subset size; ``None`` (or at least the number of judged queries) = all.
        seed: Seed of the subset.

    Returns:
        ``(queries, missing)``: the selected queries sorted by id, and the judged query ids
        that have no query text (left out, logged).

    Raises:
        ValidationError: ``max_queries < 1``, or no judged query has a text.
    """
    if max_queries is not None and max_queries < 1:
        raise ValidationError(f"max_queries must be >= 1, got {max_queries}")
    judged = sorted(q for q, judgements in qrels.items() if judgements)
    missing = [q for q in judged if q not in queries]
    if missing:
        logger.warning("%d judged queries have no query text and are left out: %s", len(missing), missing[:10])
    ids = [q for q in judged if q in queries]
    if not ids:
        raise ValidationError("no judged query has a query text; check the queries and qrels files")
    if max_queries is not None and max_queries < len(ids):
        ids = sorted(random.Random(seed).sample(ids, max_queries))
        logger.info("evaluating a seeded subset of %d of %d judged queries (seed %d)", len(ids), len(judged), seed)
    return [queries[q] for q in ids], missing


def report_name(*parts: object) -> str:
    """Join name parts with ``-``, replacing characters unsafe in file names and run tags."""
    return "-".join(re.sub(r"[^A-Za-z0-9._=+-]+", "_", str(p)) for p in parts if p not in (None, ""))


def _for_method(config: Any, method: str) -> Any:
    """``config`` for ``method`` (the evaluated one): its budget is that method's when unset."""
    from dataclasses import replace

    from heedrank.config import RerankerConfig

    if config is None:
        config = RerankerConfig()
    if getattr(config, "max_doc_tokens", 0) is not None:
        return config

    return replace(config, max_doc_tokens=replace(config, method=method).doc_tokens)


def config_suffix(config: Any, reranking: bool) -> str | None:
    """``t<max_doc_tokens>`` plus ``key=value`` of the reranker options, so that runs of
    different reranker configurations get different report names (an option given as ``null``
    reads ``key=null``; a list or mapping, the first 8 hex digits of its sha256)."""
    if not reranking:
        return None
    if config is None:
        from heedrank.config import RerankerConfig

        config = RerankerConfig()
    parts = [f"t{config.doc_tokens}"]
    given = config.given_options
    for key in sorted(k for k in given if k != "keep_attention"):
        value = given[key]
        text = "null" if value is None else value if isinstance(value, (str, int, float, bool)) else (
            hashlib.sha256(repr(value).encode()).hexdigest()[:8])
        parts.append(f"{key}={text}")
    return "-".join(parts)


def subset_suffix(n_selected: int, max_queries: int | None, seed: int) -> str | None:
    """``"q<n>-s<seed>"`` when a subset was drawn, else ``None``."""
    return f"q{n_selected}-s{seed}" if max_queries is not None else None




def config_dict(config: Any) -> dict[str, Any]:
    """A reranker/pipeline config dataclass as a JSON-ready dict."""
    from dataclasses import asdict

    return jsonable(asdict(config))


def check_rerank_name(rerank: str) -> None:
    """Fail early on an unknown reranker name, before any data, index or model loads (the
    pipeline does not exist yet; once it does, :meth:`heedrank.pipeline.Pipeline.validate`
    checks every option).

    Raises:
        UnknownNameError: ``rerank`` is neither ``"none"`` nor a registered reranker or alias
            (``"default"``).
    """
    from heedrank import registry

    known = [*registry.reranker_aliases(), *registry.reranker_names()]
    if rerank != NO_RERANK and rerank not in known:
        raise UnknownNameError(f"unknown reranker {rerank!r}; choose one of {[NO_RERANK, *known]}")


@dataclass(frozen=True)
class EvalTarget:
    """What an evaluator resolved from its :class:`~heedrank.eval.spec.EvalSpec`, for
    :func:`run_evaluation`: which first stage to search and how the report is named and
    recorded.

    Attributes:
        name: Report name (:func:`spec_report_name`): ``<name>.trec`` and ``<name>.json``.
        dataset: Dataset label of the report (the folder's name).
        split: Qrels split of the report.
        first_stage: First-stage label of the report (``"bm25"``, ``"run:BM25"``).
        retriever: The pipeline retriever searched.
        inputs: Input files and their sha256 (the report's ``inputs``).
        params: The evaluator's parameters (the report's ``params``).
        missing: Judged query ids without a query text (left out, reported).
    """

    name: str
    dataset: str
    split: str
    first_stage: str
    retriever: str
    inputs: Mapping[str, Any] = field(default_factory=dict)
    params: Mapping[str, Any] = field(default_factory=dict)
    missing: Sequence[str] = ()


def spec_report_name(spec: EvalSpec, head: Sequence[object], n_selected: int, extra: Sequence[object] = ()) -> str:
    """``<head...>-<rerank>[-c<candidates>][-f<fusion>][-<reranker config>][-<extra...>][-q<n>-s<seed>]``
    (:func:`report_name`): the name parts every evaluator shares around its own ``head``
    (dataset and first stage) and ``extra``."""
    reranking = spec.reranking
    return report_name(
        *head, spec.rerank,
        f"c{spec.candidates}" if reranking else None,
        f"f{spec.fusion:g}" if reranking and spec.fusion is not None else None,
        config_suffix(_for_method(spec.reranker_config, spec.rerank), reranking),
        *extra,
        subset_suffix(n_selected, spec.max_queries, spec.seed),
    )


def run_evaluation(
    pipeline: Pipeline,
    queries: Sequence[Query],
    qrels: Qrels,
    spec: EvalSpec,
    target: EvalTarget,
) -> EvalReport:
    """Search ``queries`` with ``pipeline`` (``spec``'s reranking of ``target.retriever``'s
    top ``EVAL_TOP_K``), evaluate with ``spec.metrics``, write ``<out_dir>/<name>.trec``
    and ``<out_dir>/<name>.json``.

    With ``spec.dump_dir`` (ICR with option ``keep_attention``), each query's per-head
    attention is also saved as an attention dump (:mod:`heedrank.lab.head_study`) from the same pass.

    Queries are reranked one at a time (a progress bar counts queries); per-query
    latencies come from :attr:`heedrank.pipeline.SearchResult.timings`. The reranker's
    model is loaded before the first query and its load time reported apart. When reranking,
    the first-stage ranking (top ``EVAL_TOP_K``) is evaluated too.

    ``spec.engine`` runs the searches (:meth:`heedrank.engine.Engine.search`; default: the
    local engine). On another engine (Ray) the reranker loads there, not here; the report is
    the same apart from timings, with ``params.engine`` saying how it ran. ``dump_dir`` needs
    the local engine.

    Args:
        pipeline: The pipeline to search (its retriever ``target.retriever``).
        queries: The selected queries (:func:`select_queries`).
        qrels: Judgements of the evaluated split.
        spec: The evaluation, its dataset defaults resolved (``metrics`` set).
        target: What the evaluator resolved (:class:`EvalTarget`).

    Returns:
        The saved :class:`~eval.report.EvalReport`.

    Raises:
        ValidationError, UnknownNameError, ContextOverflowError: from the pipeline.
        ValidationError: ``dump_dir`` with an engine other than the local one.
    """
    name, dataset, split, first_stage = target.name, target.dataset, target.split, target.first_stage
    metrics = list(spec.metrics or ())
    dump_dir, show_progress, params = spec.dump_dir, spec.show_progress, target.params
    options = SearchOptions(top_k=EVAL_TOP_K, retriever=target.retriever, rerank=spec.rerank,
                            candidates=spec.candidates, fusion=spec.fusion)
    from heedrank.data import write_trec_run

    options = pipeline.validate(options)  # every check (and the filter parse) before a model loads
    reranking = options.rerank != NO_RERANK
    engine = spec.engine if spec.engine is not None else LocalEngine()
    local = isinstance(engine, LocalEngine)
    if dump_dir is not None and not local:
        raise ValidationError("an attention dump (--dump) needs the local engine; drop --engine ray")
    logger.info("evaluating %s on %d queries%s", name, len(queries), "" if local else f" (engine {type(engine).__name__})")
    searched = engine.search(pipeline, list(queries), options, show_progress=show_progress)
    results, load_seconds = searched.results, searched.load_seconds
    if not local:  # a local run's report stays as it was (no params.engine)
        params = {**params, "engine": dict(searched.engine)}
    qids = [r.query.query_id for r in results]
    run = {r.query.query_id: r.ranking.to_dict() for r in results}
    if dump_dir is not None and reranking:
        from heedrank.eval.report import save_dump_from_results

        save_dump_from_results(dump_dir, results, qrels, pipeline.reranker(options.rerank).describe(),
                               info={"dataset": dataset, "split": split, "first_stage": first_stage,
                                     "candidates": options.candidates, "queries": len(results)})
    ev = evaluate_run(run, qrels, metrics, query_ids=qids)

    base = None
    if reranking:
        base_run = {r.query.query_id: r.first_stage.top(options.top_k).to_dict() for r in results}
        base = evaluate_run(base_run, qrels, metrics, query_ids=qids)

    timings = {r.query.query_id: {k: float(v) for k, v in r.timings.items()} for r in results}
    truncation: dict[str, int] = {}
    prompt_tokens: dict[str, float] = {}
    reranker_info = None
    if reranking:
        rrs = [r.rerank for r in results if r.rerank is not None]
        truncation = {
            "docs_reranked": sum(len(rr.ranking) for rr in rrs),
            "docs_truncated": sum(len(rr.truncated) for rr in rrs),
            "queries_with_truncation": sum(1 for rr in rrs if rr.truncated),
        }
        total_tokens = sum(int(rr.prompt_tokens) for rr in rrs)
        prompt_tokens = {"total": total_tokens, "mean": total_tokens / len(rrs) if rrs else 0.0}
        described = searched.reranker
        reranker_info = jsonable(dict(described if described is not None else pipeline.reranker(options.rerank).describe()))
        if truncation["docs_truncated"]:
            logger.info("%d of %d reranked documents were truncated to the token budget",
                        truncation["docs_truncated"], truncation["docs_reranked"])

    out_dir = Path(spec.out_dir)
    run_path = out_dir / f"{name}.trec"
    write_trec_run(run, run_path, tag=name)
    logger.info("wrote run %s", run_path)

    report = EvalReport(
        name=name,
        dataset=dataset,
        split=split,
        first_stage=first_stage,
        rerank=options.rerank,
        candidates=options.candidates if reranking else None,
        top_k=options.top_k,
        query_ids=ev.query_ids,
        metrics=ev.aggregate,
        per_query=ev.per_query,
        first_stage_metrics=base.aggregate if base else None,
        first_stage_per_query=base.per_query if base else None,
        timings=timings,
        latency=latency_summary(timings),
        reranker=reranker_info,
        index=jsonable(dict(pipeline.describe_index)) if pipeline.describe_index else None,
        truncation=truncation,
        prompt_tokens=prompt_tokens,
        excluded_query_ids=sorted(set(target.missing) | set(ev.excluded)),
        inputs=jsonable(dict(target.inputs)),
        params=jsonable(dict(params)),
        argv=list(sys.argv),
        timestamp=now_iso(),
        run_file=str(run_path),
        reranker_load_seconds=load_seconds,
    )
    save_report(report, out_dir / f"{name}.json")
    return report

"""The evaluator's outputs: the report, one JSON-serialisable record per evaluation run, and the
attention dump (``eval --dump``).

A report holds what was evaluated (dataset, split, query ids, first stage, reranker,
candidates), the results (aggregate and per-query metrics, per-query latencies), and what
is needed to reproduce them (reranker and index identity, arguments, command line, time).
"""

from __future__ import annotations

import json
import logging
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from heedrank.errors import NotFoundError, ValidationError
from heedrank.jsonable import jsonable
from heedrank.types import Qrels

logger = logging.getLogger(__name__)

REPORT_FORMAT = 1
"""Version of the JSON layout written by :func:`save_report`."""

STAGES = ("retrieve", "hydrate", "rerank", "total")
"""Timed pipeline stages (seconds per query)."""


@dataclass
class EvalReport:
    """The result of one evaluation.

    Attributes:
        name: File stem of the run and report (encodes dataset, split, first stage,
            reranker, candidates and subset).
        dataset: Dataset name (the data folder name, e.g. ``"beir-nfcorpus"``).
        split: Qrels split (``"test"``, ``"dev"``, ...).
        first_stage: Retriever name (``"bm25"``) or first-stage run (``"run:BM25"``).
        rerank: Reranker name, or ``"none"``.
        candidates: First-stage hits sent to the reranker; ``None`` without reranking.
        top_k: Depth of the evaluated ranking (hits per query in the run file).
        query_ids: Evaluated queries (with qrels), sorted.
        metrics: Aggregate metrics ``{name: mean}`` (values in [0, 1]).
        per_query: ``{query_id: {metric: value}}``.
        first_stage_metrics: Aggregate metrics of the first-stage ranking (top ``top_k``),
            when reranking; ``None`` otherwise.
        first_stage_per_query: Per-query first-stage metrics, when reranking.
        timings: ``{query_id: {stage: seconds}}`` for the stages in :data:`STAGES`
            (``retrieve`` is the batch retrieval time divided by the number of queries).
        latency: ``{stage: {"mean", "median", "p95"}}`` in seconds, over queries.
        reranker: The reranker's ``describe()`` (model identity and file hash, prompt
            template version, ``max_doc_tokens``, ...); ``None`` without reranking.
        index: The index's ``describe()``; ``None`` when there is no index.
        truncation: ``{"docs_reranked", "docs_truncated", "queries_with_truncation"}``:
            documents whose content was cut to ``max_doc_tokens`` LM tokens.
        prompt_tokens: ``{"total", "mean"}`` LM tokens processed per query when reranking.
        excluded_query_ids: Queries left out because they have no qrels.
        inputs: Input files and their hashes (qrels, run JSON, corpus).
        params: The evaluation function's arguments.
        argv: The command line of the process.
        timestamp: ISO 8601 UTC time at which the report was made.
        run_file: Path of the TREC run file written with the report, if any.
        reranker_load_seconds: Time to build the reranker and load its model before the
            first query (not part of ``timings``); ``None`` without reranking.
        format: Report layout version (:data:`REPORT_FORMAT`).
    """

    name: str
    dataset: str
    split: str
    first_stage: str
    rerank: str
    candidates: int | None
    top_k: int
    query_ids: list[str]
    metrics: dict[str, float]
    per_query: dict[str, dict[str, float]]
    first_stage_metrics: dict[str, float] | None = None
    first_stage_per_query: dict[str, dict[str, float]] | None = None
    timings: dict[str, dict[str, float]] = field(default_factory=dict)
    latency: dict[str, dict[str, float]] = field(default_factory=dict)
    reranker: dict[str, Any] | None = None
    index: dict[str, Any] | None = None
    truncation: dict[str, int] = field(default_factory=dict)
    prompt_tokens: dict[str, float] = field(default_factory=dict)
    excluded_query_ids: list[str] = field(default_factory=list)
    inputs: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)
    timestamp: str = field(default_factory=lambda: now_iso())
    run_file: str | None = None
    reranker_load_seconds: float | None = None
    format: int = REPORT_FORMAT

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (values converted with :func:`jsonable`)."""
        return jsonable(asdict(self))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EvalReport:
        """Inverse of :meth:`to_dict`; unknown keys are ignored (logged).

        Raises:
            ValidationError: a required field is missing.
        """
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            logger.debug("ignoring unknown report fields %s", unknown)
        try:
            return cls(**{k: v for k, v in data.items() if k in known})
        except TypeError as exc:
            raise ValidationError(f"not an heedrank evaluation report: {exc}") from None

    @property
    def label(self) -> str:
        """Short human label: ``first_stage`` or ``first_stage>rerank@candidates``, with
        ``+fused(alpha)`` when the run interpolated with the first stage (``params.fusion``)."""
        if self.rerank == "none":
            return self.first_stage
        fusion = (self.params or {}).get("fusion")
        return f"{self.first_stage}>{self.rerank}@{self.candidates}" + ("" if fusion is None else f"+fused({fusion:g})")


def now_iso() -> str:
    """Current UTC time as ISO 8601 with seconds, e.g. ``2025-01-31T12:00:00+00:00``."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def summarize_latency(values: Iterable[float]) -> dict[str, float]:
    """``{"mean", "median", "p95"}`` of per-query seconds (NaN for no values).

    ``p95`` uses linear interpolation between order statistics (numpy's default).
    """
    xs = sorted(float(v) for v in values)
    if not xs:
        return {"mean": math.nan, "median": math.nan, "p95": math.nan}
    pos = 0.95 * (len(xs) - 1)
    lo, hi = math.floor(pos), math.ceil(pos)
    p95 = xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
    return {"mean": math.fsum(xs) / len(xs), "median": statistics.median(xs), "p95": p95}


def latency_summary(timings: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """Per-stage :func:`summarize_latency` over the per-query ``timings``."""
    return {s: summarize_latency(t[s] for t in timings.values() if s in t) for s in STAGES}


def save_report(report: EvalReport, path: str | Path) -> Path:
    """Write ``report`` as indented JSON (parent folders are created).

    Returns:
        The path written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(report.to_dict(), indent=2, sort_keys=False) + "\n", encoding="utf-8")
    tmp.replace(path)
    logger.info("wrote report %s", path)
    return path


def load_report(path: str | Path) -> EvalReport:
    """Read a report written by :func:`save_report`.

    Raises:
        NotFoundError: the file does not exist.
        ValidationError: the file is not a report.
    """
    path = Path(path)
    if not path.is_file():
        raise NotFoundError(f"report {str(path)!r} does not exist")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValidationError(f"report {str(path)!r} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValidationError(f"report {str(path)!r} is not a JSON object")
    return EvalReport.from_dict(data)


def _fmt_metric(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{100 * value:.1f}"


def _fmt_ms(value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    ms = 1000 * value
    return f"{ms:.1f}" if ms < 100 else f"{ms:.0f}"


def format_table(reports: Sequence[EvalReport]) -> str:
    """A plain-text table: one row per report (plus a base row for the first stage of
    reranking reports), metrics x100 with one decimal, latency in ms per query.

    Latency columns are the total pipeline time per query (retrieve + hydrate + rerank;
    mean and p95 over queries, model loading excluded); ``-`` for base rows.
    """
    metric_names: list[str] = []
    for r in reports:
        for name in list(r.metrics) + list(r.first_stage_metrics or {}):
            if name not in metric_names:
                metric_names.append(name)
    header = ["dataset", "split", "system", "queries", *metric_names, "ms/q", "p95 ms"]
    rows: list[list[str]] = []
    for r in reports:
        n = str(len(r.query_ids))
        if r.first_stage_metrics is not None:
            rows.append([r.dataset, r.split, f"{r.first_stage} (base)", n,
                         *(_fmt_metric(r.first_stage_metrics.get(m)) for m in metric_names), "-", "-"])
        lat = r.latency.get("total", {})
        rows.append([r.dataset, r.split, r.label, n, *(_fmt_metric(r.metrics.get(m)) for m in metric_names),
                     _fmt_ms(lat.get("mean")), _fmt_ms(lat.get("p95"))])
    widths = [max(len(h), *(len(row[i]) for row in rows)) if rows else len(h) for i, h in enumerate(header)]
    left = 3  # text columns are left-aligned, numbers right-aligned

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths)))

    out = [line(header), line(["-" * w for w in widths])]
    out += [line(row) for row in rows]
    return "\n".join(out)


# ---------------------------------------------------------------------------- attention dumps
# Attention dumps: per query, the calibrated per-head token attention of one ICR pass
# (float16, all layers), the prompt's token ids and document spans, the candidates with their
# first-stage scores and qrels grades (docs/design/algorithms.md section 2). Written by the evaluator
# (``eval --dump``) and by :func:`heedrank.lab.head_study.dump_attention`; read by head detection and
# weight fitting (:mod:`heedrank.lab.train.icr_heads`) and the ablation (:mod:`heedrank.lab.head_study`).

DUMP_FORMAT = 1
"""Version of the dump layout (``meta.json`` + one file per query)."""


def save_dump_item(out: Path, item: Mapping[str, Any]) -> None:
    """Write one query's dump item atomically."""
    import torch

    path = out / f"{_safe(item['query_id'])}.pt"
    tmp = path.with_suffix(".tmp")
    torch.save(dict(item), tmp)
    tmp.replace(path)


def save_dump_from_results(
    out_dir: str | Path, results: Sequence[Any], qrels: Qrels, reranker_info: Mapping[str, Any],
    info: Mapping[str, Any] | None = None,
) -> Path:
    """Attention dump from pipeline search results whose reranker kept its attention
    (ICR option ``keep_attention``); candidates are in first-stage order."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"format": DUMP_FORMAT, "reranker": reranker_info, "shuffle": False, "seed": None, **(info or {})}
    (out / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
    n = 0
    for r in results:
        if r.rerank is None or "attention" not in r.rerank.details:
            continue
        att = r.rerank.details["attention"]
        if len(att["layers"]) != len(att["calibrated"]) or att["layers"] != list(range(len(att["layers"]))):
            raise ValidationError("attention dumps need every layer from 0 (heads='all')")
        k = len(att["spans"])
        cands = r.first_stage.top(k)
        docs = {h.doc_id: h.document for h in r.ranking.hits}
        ids = cands.doc_ids
        save_dump_item(out, {
            "query_id": r.query.query_id, "query": r.query.text, "doc_ids": ids,
            "texts": [docs[d].content if docs.get(d) else "" for d in ids],
            "first_stage_scores": [h.score for h in cands.hits],
            "labels": [int(qrels.get(r.query.query_id, {}).get(d, 0)) for d in ids],
            "spans": att["spans"], "context_ids": att["context_ids"], "calibrated": att["calibrated"],
            "seconds": r.timings.get("rerank", 0.0),
        })
        n += 1
    logger.info("wrote attention dump of %d queries to %s", n, out)
    return out


def dump_file_name(qid: str) -> str:
    """File stem of a query's dump item: the query id with characters other than
    letters, digits, ``-_.`` replaced by ``_``."""
    return _safe(qid)


def _safe(qid: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in qid)


def load_dump(dump_dir: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(meta, items)`` of a dump, items sorted by query id. Raises NotFoundError."""
    import torch

    d = Path(dump_dir)
    if not (d / "meta.json").exists():
        raise NotFoundError(f"{d} is not an attention dump (no meta.json); create it with `heedrank lab heads dump`")
    meta = json.loads((d / "meta.json").read_text())
    items = [torch.load(p, weights_only=False) for p in sorted(d.glob("*.pt"))]
    return meta, sorted(items, key=lambda x: x["query_id"])


# ---------------------------------------------------------------------------- detection

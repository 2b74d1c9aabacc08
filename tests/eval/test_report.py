"""Report round trip, latency summary and table."""

from __future__ import annotations

import json
import math

import pytest

from heedrank.errors import NotFoundError, ValidationError
from heedrank.eval.report import EvalReport, format_table, latency_summary, load_report, save_report, summarize_latency


def sample_report(**over) -> EvalReport:
    timings = {"q1": {"retrieve": 0.01, "hydrate": 0.001, "rerank": 1.5, "total": 1.511},
               "q2": {"retrieve": 0.01, "hydrate": 0.002, "rerank": 2.5, "total": 2.512}}
    fields = dict(
        name="beir-nfcorpus-test-bm25-icr-c20", dataset="beir-nfcorpus", split="test", first_stage="bm25",
        rerank="icr", candidates=20, top_k=100, query_ids=["q1", "q2"],
        metrics={"nDCG@10": 0.3456, "R@100": 0.25, "RR@10": 0.5},
        per_query={"q1": {"nDCG@10": 0.4, "R@100": 0.3, "RR@10": 1.0},
                   "q2": {"nDCG@10": 0.2912, "R@100": 0.2, "RR@10": 0.0}},
        first_stage_metrics={"nDCG@10": 0.3, "R@100": 0.25, "RR@10": 0.45},
        first_stage_per_query={"q1": {"nDCG@10": 0.3, "R@100": 0.3, "RR@10": 0.5},
                               "q2": {"nDCG@10": 0.3, "R@100": 0.2, "RR@10": 0.4}},
        timings=timings, latency=latency_summary(timings),
        reranker={"method": "icr", "model": "smollm2-135m-instruct", "sha256": "ab" * 32,
                  "prompt_template": "icr-v1", "max_doc_tokens": 160},
        index={"path": "/tmp/idx", "retrievers": ["bm25"]},
        truncation={"docs_reranked": 40, "docs_truncated": 3, "queries_with_truncation": 2},
        prompt_tokens={"total": 9000, "mean": 4500.0},
        params={"max_queries": 2, "seed": 0}, argv=["heedrank", "eval", "beir"], run_file="runs/x.trec",
    )
    fields.update(over)
    return EvalReport(**fields)


def test_round_trip(tmp_path):
    report = sample_report()
    path = save_report(report, tmp_path / "sub" / "r.json")
    assert path.is_file()
    data = json.loads(path.read_text())
    assert data["metrics"]["nDCG@10"] == 0.3456 and data["format"] == 1
    assert load_report(path) == report


def test_non_finite_values_become_null(tmp_path):
    report = sample_report(metrics={"nDCG@10": float("nan")})
    path = save_report(report, tmp_path / "r.json")
    assert json.loads(path.read_text())["metrics"] == {"nDCG@10": None}  # strict JSON, no NaN token


def test_load_errors(tmp_path):
    with pytest.raises(NotFoundError):
        load_report(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(ValidationError):
        load_report(bad)
    bad.write_text(json.dumps({"name": "x"}))
    with pytest.raises(ValidationError, match="not an heedrank evaluation report"):
        load_report(bad)


def test_summarize_latency():
    s = summarize_latency([float(i) for i in range(1, 21)])
    assert s["mean"] == 10.5 and s["median"] == 10.5
    assert s["p95"] == pytest.approx(19.05)  # numpy.percentile(range(1, 21), 95)
    assert all(math.isnan(v) for v in summarize_latency([]).values())


def test_latency_summary_per_stage():
    lat = sample_report().latency
    assert set(lat) == {"retrieve", "hydrate", "rerank", "total"}
    assert lat["rerank"]["mean"] == pytest.approx(2.0)
    assert lat["rerank"]["median"] == pytest.approx(2.0)


def test_format_table():
    text = format_table([sample_report(), sample_report(rerank="none", candidates=None, first_stage_metrics=None,
                                                        first_stage_per_query=None, name="b")])
    lines = text.splitlines()
    assert lines[0].split()[:4] == ["dataset", "split", "system", "queries"]
    assert "nDCG@10" in lines[0] and "ms/q" in lines[0]
    assert len(lines) == 2 + 3  # header, rule, base + reranked rows, first-stage-only row
    base, reranked, plain = lines[2], lines[3], lines[4]
    assert "bm25 (base)" in base and "30.0" in base
    assert "bm25>icr@20" in reranked and "34.6" in reranked and "2011" in reranked  # total ms/q
    assert "bm25 " in plain and "2011" in plain
    assert base.split()[-2:] == ["-", "-"]

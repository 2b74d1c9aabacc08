"""TREC DL 2019 passage evaluation on the real first-stage runs (fake reranker)."""

from __future__ import annotations

import random

import pytest

from attnrank.config import RerankerConfig
from attnrank.data import load_trec_qrels, load_trec_run
from attnrank.errors import NotFoundError, UnknownNameError
from eval.compare import compare_reports
from eval.report import format_table, load_report
from eval.trecdl import evaluate_trec_dl

def test_bm25_run_matches_published_figure(dl19_dir, tmp_path):
    report = evaluate_trec_dl(dl19_dir, run_name="BM25", rerank="none", out_dir=tmp_path, show_progress=False)
    assert len(report.query_ids) == 43
    # Pyserini two-click reproduction, dl19-passage BM25 (k1=0.9, b=0.4): nDCG@10 = 0.5058
    assert report.metrics["nDCG@10"] == pytest.approx(0.5058, abs=5e-5)
    assert report.first_stage_metrics is None
    assert report.name == "msmarco-trec-dl-2019-passage-BM25-none"
    run = load_trec_run(tmp_path / f"{report.name}.trec")
    assert len(run) == 43 and all(len(hits) == 100 for hits in run.values())
    assert load_report(tmp_path / f"{report.name}.json") == report
    assert report.inputs["run_json"]["sha256"]


def test_rerank_subset_reports_base_and_reranked(dl19_dir, tmp_path, fake_reranker):
    base = evaluate_trec_dl(dl19_dir, run_name="BM25", rerank="none", out_dir=tmp_path, show_progress=False)
    report = evaluate_trec_dl(
        dl19_dir, run_name="BM25", rerank="fake", candidates=10, max_queries=5, seed=3, out_dir=tmp_path,
        reranker_config=RerankerConfig(max_doc_tokens=64), show_progress=False,
    )
    judged = sorted(load_trec_qrels(dl19_dir / "qrels.dl19-passage.txt"))
    assert report.query_ids == sorted(random.Random(3).sample(judged, 5))
    assert report.name == "msmarco-trec-dl-2019-passage-BM25-fake-c10-t64-q5-s3"
    assert (report.rerank, report.candidates, report.first_stage) == ("fake", 10, "run:BM25")
    # base metrics are the run's own, on the same queries
    for q in report.query_ids:
        assert report.first_stage_per_query[q] == base.per_query[q]
    # reranking the top 10 of 100 keeps the set of 100 docs: recall@100 is unchanged
    assert report.metrics["R(rel=2)@100"] == pytest.approx(report.first_stage_metrics["R(rel=2)@100"])
    assert report.reranker == {"method": "fake", "model": "none", "max_doc_tokens": 64}
    assert report.index is None
    assert report.reranker_load_seconds is not None and report.reranker_load_seconds >= 0
    assert base.reranker_load_seconds is None
    assert report.truncation["docs_reranked"] == 50
    assert 0 <= report.truncation["docs_truncated"] <= 50
    assert set(report.timings) == set(report.query_ids)
    assert report.latency["rerank"]["p95"] >= report.latency["rerank"]["median"] >= 0
    assert report.params["max_queries"] == 5 and report.params["reranker_config"]["max_doc_tokens"] == 64
    table = format_table([report])
    assert "run:BM25 (base)" in table and "run:BM25>fake@10" in table
    comp = compare_reports(tmp_path / f"{base.name}.json", tmp_path / f"{report.name}.json", trials=500)
    assert comp.query_ids == report.query_ids and comp.only_a == 38


def test_unknown_names_fail_early(dl19_dir, tmp_path):
    with pytest.raises(UnknownNameError, match="unknown reranker 'nope'"):
        evaluate_trec_dl(dl19_dir, rerank="nope", out_dir=tmp_path)
    with pytest.raises(NotFoundError, match="BM25_RM3"):
        evaluate_trec_dl(dl19_dir, run_name="NOPE", out_dir=tmp_path)

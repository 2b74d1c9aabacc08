"""TREC DL passage evaluation: the real 2019 and 2021 first-stage runs (fake reranker), and
tiny folders of every year's file naming."""

from __future__ import annotations

import gzip
import json
import math
import os
import random
from pathlib import Path

import pytest

from heedrank.config import RerankerConfig
from heedrank.data import load_trec_qrels, load_trec_run
from heedrank.errors import NotFoundError, UnknownNameError
from heedrank.eval.compare import compare_reports
from heedrank.eval.report import format_table, load_report
from heedrank.eval.spec import EvalSpec
from heedrank.eval.trecdl import evaluate_trec_dl

def test_bm25_run_matches_published_figure(dl19_dir, tmp_path):
    report = evaluate_trec_dl(EvalSpec(dl19_dir, run_name="BM25", rerank="none", out_dir=tmp_path, show_progress=False))
    assert len(report.query_ids) == 43
    # Pyserini two-click reproduction, dl19-passage BM25 (k1=0.9, b=0.4): nDCG@10 = 0.5058
    assert report.metrics["nDCG@10"] == pytest.approx(0.5058, abs=5e-5)
    assert report.first_stage_metrics is None
    assert report.name == "msmarco-trec-dl-2019-passage-dl19-BM25-none"
    run = load_trec_run(tmp_path / f"{report.name}.trec")
    assert len(run) == 43 and all(len(hits) == 100 for hits in run.values())
    assert load_report(tmp_path / f"{report.name}.json") == report
    assert report.inputs["run_json"]["sha256"]


def test_rerank_subset_reports_base_and_reranked(dl19_dir, tmp_path, fake_reranker):
    base = evaluate_trec_dl(EvalSpec(dl19_dir, run_name="BM25", rerank="none", out_dir=tmp_path, show_progress=False))
    report = evaluate_trec_dl(EvalSpec(
        dl19_dir, run_name="BM25", rerank="fake", candidates=10, max_queries=5, seed=3, out_dir=tmp_path,
        reranker_config=RerankerConfig(max_doc_tokens=64), show_progress=False,
    ))
    judged = sorted(load_trec_qrels(dl19_dir / "qrels.dl19-passage.txt"))
    assert report.query_ids == sorted(random.Random(3).sample(judged, 5))
    assert report.name == "msmarco-trec-dl-2019-passage-dl19-BM25-fake-c10-t64-q5-s3"
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
        evaluate_trec_dl(EvalSpec(dl19_dir, rerank="nope", out_dir=tmp_path))
    with pytest.raises(NotFoundError, match="BM25_RM3"):
        evaluate_trec_dl(EvalSpec(dl19_dir, run_name="NOPE", out_dir=tmp_path))


# ---------------------------------------------------------------------------- any year, any naming
# One query; the run ranks p1 (grade 0) above p2 (grade 2): nDCG@10 = (2 / log2(3)) / (2 / log2(2)).
NDCG_P2_SECOND = (2 / math.log2(3)) / 2
RUN_JSON = [{"query": "run text", "hits": [
    {"content": "first passage", "qid": "q1", "docid": "p1", "rank": 1, "score": 3.0},
    {"content": "second passage", "qid": "q1", "docid": "p2", "rank": 2, "score": 2.0},
]}]


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(text.encode()) if path.suffix == ".gz" else text.encode())
    return path


def _folder(root: Path, topics: str, qrels: str, run: str) -> Path:
    _write(root / topics, "q1\tofficial text\n")
    _write(root / qrels, "q1 0 p1 0\nq1 0 p2 2\n")
    _write(root / run, json.dumps(RUN_JSON))
    return root


@pytest.mark.parametrize(
    ("year", "topics", "qrels", "run"),
    [
        ("dl19", "topics.dl19-passage.txt", "qrels.dl19-passage.txt", "retrieve_results_BM25_dl19_top100.json.gz"),
        ("dl20", "topics.dl20.txt", "qrels.dl20-passage.txt", "retrieve_results_BM25_dl20_top100.json.gz"),
        ("dl21", "topics.dl21.txt", "qrels.dl21-passage.txt", "retrieve_results_BM25_dl21_top100.json"),
        ("dl22", "topics.dl22.txt.gz", "qrels.dl22.txt", "retrieve_results_BM25_dl22_top100.json"),
    ],
)
def test_every_year_and_naming_evaluates(tmp_path, year, topics, qrels, run):
    d = _folder(tmp_path / "trecdl", topics, qrels, run)
    report = evaluate_trec_dl(EvalSpec(d, rerank="none", out_dir=tmp_path / "runs", show_progress=False))
    assert report.name == f"trecdl-{year}-BM25-none"
    assert report.metrics["nDCG@10"] == pytest.approx(NDCG_P2_SECOND)
    assert report.params["year"] == year and report.params["topics"] == str(d / topics)
    assert (tmp_path / "runs" / f"trecdl-{year}-BM25-none.trec").is_file()


def test_explicit_paths_and_year(tmp_path):
    _folder(tmp_path / "files", "my-topics.tsv", "my-qrels.txt", "retrieve_results_SPLADE_dl20_top100.json")
    f = tmp_path / "files"
    report = evaluate_trec_dl(EvalSpec(None, topics=f / "my-topics.tsv", qrels=f / "my-qrels.txt",
                                       run_file=f / "retrieve_results_SPLADE_dl20_top100.json", out_dir=tmp_path / "runs",
                                       show_progress=False))
    # run name and year read from the run file's name; dataset = the run file's folder
    assert report.name == "files-dl20-SPLADE-none" and report.first_stage == "run:SPLADE"
    assert report.metrics["nDCG@10"] == pytest.approx(NDCG_P2_SECOND)
    other = evaluate_trec_dl(EvalSpec(None, topics=f / "my-topics.tsv", qrels=f / "my-qrels.txt", run_name="mine",
                                      run_file=f / "retrieve_results_SPLADE_dl20_top100.json", year="2023",
                                      out_dir=tmp_path / "runs", show_progress=False))
    assert other.name == "files-dl23-mine-none"


def test_cli_trec_dl_with_year_and_explicit_files(tmp_path):
    from typer.testing import CliRunner

    from heedrank.cli import app

    d = _folder(tmp_path / "two", "topics.dl20.txt", "qrels.dl20-passage.txt", "retrieve_results_BM25_dl20_top100.json")
    _folder(d, "topics.dl21.txt", "qrels.dl21-passage.txt", "retrieve_results_BM25_dl21_top100.json")
    runner = CliRunner()
    ambiguous = runner.invoke(app, ["eval", "trec-dl", "--data", str(d), "--out", str(tmp_path / "runs")])
    assert ambiguous.exit_code == 2 and "choose one with --year" in ambiguous.output
    ok = runner.invoke(app, ["eval", "trec-dl", "--data", str(d), "--year", "dl21", "--out", str(tmp_path / "runs")])
    assert ok.exit_code == 0, ok.output
    assert (tmp_path / "runs" / "two-dl21-BM25-none.json").is_file()
    assert "63.1" in ok.output  # nDCG@10 in percent
    missing = runner.invoke(app, ["eval", "trec-dl", "--topics", str(d / "topics.dl20.txt")])
    assert missing.exit_code == 2 and "give the TREC DL folder (--data)" in missing.output


# ---------------------------------------------------------------------------- the other candidate-list sets
def test_a_dev_sample_reports_rr_at_grade_1_on_its_test_fold(tmp_path):
    from set_folders import dev_folder

    d = dev_folder(tmp_path / "msmarco-passage-dev-8")
    report = evaluate_trec_dl(EvalSpec(d, rerank="none", out_dir=tmp_path / "runs", show_progress=False))
    assert report.name == "msmarco-passage-dev-8-dev8-test-BM25-none" and report.split == "test"
    assert list(report.metrics) == ["nDCG@10", "RR@10", "R@10"]
    assert report.metrics["RR@10"] == pytest.approx(0.5)  # the positive (grade 1) is second in every list
    assert (report.params["set"], report.params["min_relevant"], report.params["split"]) == ("msmarco-dev", 1, "test")
    assert len(report.query_ids) == 2 and report.excluded_query_ids == []  # the train fold's are not "missing"
    train = evaluate_trec_dl(EvalSpec(d, split="train", out_dir=tmp_path / "runs", show_progress=False))
    assert train.name == "msmarco-passage-dev-8-dev8-train-BM25-none" and len(train.query_ids) == 4
    assert not set(train.query_ids) & set(report.query_ids)
    table = format_table([report])
    assert "RR@10" in table and "50.0" in table


def test_noveleval_evaluates_by_its_folder(tmp_path):
    from set_folders import noveleval_folder

    d = noveleval_folder(tmp_path / "noveleval")
    report = evaluate_trec_dl(EvalSpec(d, run_name="web", out_dir=tmp_path / "runs", show_progress=False))
    assert report.name == "noveleval-web-none" and report.first_stage == "run:web"
    assert list(report.metrics) == ["nDCG@10", "nDCG@5", "nDCG@1", "RR@10"]
    # q0: grades 0, 2, 1 in web order, so RR@10 = 1/2; q1: the relevant passage first
    assert report.per_query["0"]["RR@10"] == 0.5 and report.per_query["1"]["RR@10"] == 1.0
    assert set(report.inputs) == {"queries", "corpus", "qrels", "passages"}
    assert report.params["min_relevant"] == 1 and report.params["run_file"] is None


def test_cli_split_of_a_dev_sample(tmp_path):
    from typer.testing import CliRunner

    from heedrank.cli import app
    from set_folders import dev_folder

    d = dev_folder(tmp_path / "dev")
    runner = CliRunner()
    ok = runner.invoke(app, ["eval", "trec-dl", "--data", str(d), "--split", "all", "--out", str(tmp_path / "runs")])
    assert ok.exit_code == 0, ok.output
    assert (tmp_path / "runs" / "dev-dev8-all-BM25-none.json").is_file() and "RR@10" in ok.output
    bad = runner.invoke(app, ["eval", "trec-dl", "--data", str(d), "--split", "dev", "--out", str(tmp_path / "runs")])
    assert bad.exit_code == 2 and "unknown split 'dev'" in bad.output


DL21 = Path(os.environ.get("HEEDRANK_SHARED_DATA", Path(__file__).resolve().parents[2].parent / "shared" / "data")
            ) / "msmarco-trec-dl-2021-passage"


@pytest.mark.skipif(not (DL21 / "topics.dl21.txt").is_file(), reason=f"real data not found at {DL21}")
def test_dl21_folder_evaluates(tmp_path):
    report = evaluate_trec_dl(EvalSpec(DL21, rerank="none", out_dir=tmp_path, show_progress=False))
    assert report.name == "msmarco-trec-dl-2021-passage-dl21-BM25-none"
    assert len(report.query_ids) == 53
    # Pyserini's BM25 (k1=0.9, b=0.4) on MS MARCO v2 passage, DL21: nDCG@10 = 0.4458
    assert report.metrics["nDCG@10"] == pytest.approx(0.4458, abs=5e-5)
    assert report.params["year"] == "dl21" and report.inputs["topics"]["path"].endswith("topics.dl21.txt")


def test_fusion_runs_the_served_fused_path(dl19_dir, tmp_path, fake_reranker):
    kw = dict(run_name="BM25", candidates=10, max_queries=5, seed=3, out_dir=tmp_path, show_progress=False,
              reranker_config=RerankerConfig(max_doc_tokens=64))
    base = evaluate_trec_dl(EvalSpec(dl19_dir, rerank="none", **{k: v for k, v in kw.items() if k != "reranker_config"}))
    pure = evaluate_trec_dl(EvalSpec(dl19_dir, rerank="fake", **kw))
    first = evaluate_trec_dl(EvalSpec(dl19_dir, rerank="fake", fusion=1.0, **kw))
    none = evaluate_trec_dl(EvalSpec(dl19_dir, rerank="fake", fusion=0.0, **kw))
    assert first.name.endswith("-fake-c10-f1-t64-q5-s3") and first.params["fusion"] == 1.0
    assert first.label == "run:BM25>fake@10+fused(1)" and pure.label == "run:BM25>fake@10"
    # alpha = 1 is the first stage's order, alpha = 0 the reranker's: per query, the same nDCG@10
    for q in first.query_ids:
        assert first.per_query[q]["nDCG@10"] == pytest.approx(base.per_query[q]["nDCG@10"], abs=1e-12)
        assert none.per_query[q]["nDCG@10"] == pytest.approx(pure.per_query[q]["nDCG@10"], abs=1e-12)
    assert any(pure.per_query[q]["nDCG@10"] != base.per_query[q]["nDCG@10"] for q in pure.query_ids)

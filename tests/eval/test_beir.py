"""BEIR evaluation on a tiny BEIR-layout dataset (BM25 index built into a temp cache)."""

from __future__ import annotations

import json

import pytest

from heedrank.data import load_trec_run
from heedrank.eval.beir import cached_index_dir, evaluate_beir
from heedrank.eval.report import load_report
from heedrank.eval.spec import EvalSpec
from heedrank.files import file_sha256

TOPICS = ["apple orchard harvest", "banana plantation export", "cherry blossom festival", "date palm oasis"]


@pytest.fixture
def beir_dir(tmp_path):
    """24 documents, 4 topics x 6 docs; doc <topic>-0 is the most on-topic one."""
    d = tmp_path / "toy-beir"
    (d / "qrels").mkdir(parents=True)
    with open(d / "corpus.jsonl", "w") as f:
        for t, topic in enumerate(TOPICS):
            words = topic.split()
            for i in range(6):
                text = " ".join(words[: 3 - min(i, 2)]) + f" filler text number {i} about things"
                f.write(json.dumps({"_id": f"t{t}-{i}", "title": words[0].title(), "text": text}) + "\n")
    with open(d / "queries.jsonl", "w") as f:
        for t, topic in enumerate(TOPICS):
            f.write(json.dumps({"_id": f"q{t}", "text": topic}) + "\n")
        f.write(json.dumps({"_id": "q-train", "text": "unjudged in test"}) + "\n")
    with open(d / "qrels" / "test.tsv", "w") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        for t in range(3):  # q3 has no qrels: not evaluated
            f.write(f"q{t}\tt{t}-0\t2\nq{t}\tt{t}-1\t1\n")
    return d


def test_builds_cached_index_once_and_evaluates(beir_dir, tmp_path, monkeypatch, fake_reranker):
    monkeypatch.setenv("HEEDRANK_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "runs"
    report = evaluate_beir(EvalSpec(beir_dir, rerank="none", out_dir=out, build_dense=False, show_progress=False))
    index_dir = cached_index_dir(beir_dir, file_sha256(beir_dir / "corpus.jsonl"))
    assert index_dir.parent == tmp_path / "cache" / "indexes"
    assert index_dir.name.startswith("toy-beir-") and len(index_dir.name) == len("toy-beir-") + 12
    assert (index_dir / "params.json").is_file()
    assert report.name == "toy-beir-test-bm25-none"
    assert report.query_ids == ["q0", "q1", "q2"]
    assert report.metrics["nDCG@10"] == pytest.approx(1.0)  # BM25 ranks t-0 then t-1 first
    assert report.metrics["R@100"] == 1.0 and report.metrics["RR@10"] == 1.0
    assert report.index["num_docs"] == 24
    assert report.inputs["corpus"]["sha256"] == file_sha256(beir_dir / "corpus.jsonl")
    assert (out / "toy-beir-test-bm25-none.trec").is_file()

    created = json.loads((index_dir / "params.json").read_text())["created"]
    reranked = evaluate_beir(EvalSpec(beir_dir, rerank="fake", candidates=3, max_queries=2, seed=1, out_dir=out,
                                      build_dense=False, show_progress=False))
    assert json.loads((index_dir / "params.json").read_text())["created"] == created  # reused
    assert reranked.name == "toy-beir-test-bm25-fake-c3-t160-q2-s1"
    assert len(reranked.query_ids) == 2
    assert reranked.first_stage_metrics["nDCG@10"] == pytest.approx(1.0)
    assert reranked.truncation["docs_reranked"] == 6
    assert load_report(out / f"{reranked.name}.json") == reranked


def test_explicit_index_dir(beir_dir, tmp_path):
    from heedrank.index.builder import build_index

    idx = tmp_path / "idx"
    build_index(beir_dir, idx, dense=False, show_progress=False)
    report = evaluate_beir(EvalSpec(beir_dir, index_dir=idx, out_dir=tmp_path / "runs", show_progress=False))
    assert report.index["path"] == str(idx)
    assert "corpus" not in report.inputs


@pytest.fixture
def self_hit_dir(tmp_path):
    """20 short documents; query "d05" is also document d05 (same text); its only relevant
    document is d07. BM25 ranks d05 (3 query terms), d01 (2), d07 (1), then the rest (0)."""
    d = tmp_path / "self-hit"
    (d / "qrels").mkdir(parents=True)
    texts = {f"d{i:02d}": f"cooking pasta recipe number {i}" for i in range(20)}
    texts.update({"d05": "zebra stripes savanna", "d01": "zebra stripes", "d07": "zebra"})
    with open(d / "corpus.jsonl", "w") as f:
        for doc_id, text in texts.items():
            f.write(json.dumps({"_id": doc_id, "title": "", "text": text}) + "\n")
    (d / "queries.jsonl").write_text(json.dumps({"_id": "d05", "text": "zebra stripes savanna"}) + "\n")
    (d / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nd05\td07\t1\n")
    return d


def test_identical_ids_are_dropped_as_beir_does(self_hit_dir, tmp_path, monkeypatch, fake_reranker):
    import math

    monkeypatch.setenv("HEEDRANK_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "runs"
    kw = dict(out_dir=out, build_dense=False, show_progress=False)
    # By hand: one relevant document (grade 1), ideal DCG = 1; at rank r, nDCG@10 = 1 / log2(r + 1).
    # BEIR protocol: d05 is dropped, so the first stage is d01, d07, ...: d07 at rank 2.
    beir = evaluate_beir(EvalSpec(self_hit_dir, rerank="none", **kw))
    assert beir.metrics["nDCG@10"] == pytest.approx(1 / math.log2(3))
    assert beir.params["keep_identical_ids"] is False and beir.name == "self-hit-test-bm25-none"
    run = load_trec_run(out / f"{beir.name}.trec")
    assert list(run["d05"]) == ["d01", "d07"]  # BM25 returns the matching documents only
    # kept: d05, d01, d07: d07 at rank 3
    kept = evaluate_beir(EvalSpec(self_hit_dir, rerank="none", keep_identical_ids=True, **kw))
    assert kept.metrics["nDCG@10"] == pytest.approx(1 / math.log2(4))
    assert kept.params["keep_identical_ids"] is True and kept.name == "self-hit-test-bm25-none-keepids"
    assert json.loads((out / f"{kept.name}.json").read_text())["params"]["keep_identical_ids"] is True
    assert list(load_trec_run(out / f"{kept.name}.trec")["d05"]) == ["d05", "d01", "d07"]
    # Before reranking too: with 2 candidates the self-hit takes no slot, so the fake reranker
    # (shorter first) sees d01 and d07 and puts d07 ("zebra") first: nDCG@10 = 1.
    reranked = evaluate_beir(EvalSpec(self_hit_dir, rerank="fake", candidates=2, **kw))
    assert reranked.metrics["nDCG@10"] == pytest.approx(1.0)
    assert reranked.first_stage_metrics["nDCG@10"] == pytest.approx(1 / math.log2(3))
    assert reranked.truncation["docs_reranked"] == 2
    # kept, the self-hit takes a slot: candidates d05, d01 -> d01, d05, then d07 at rank 3
    reranked_kept = evaluate_beir(EvalSpec(self_hit_dir, rerank="fake", candidates=2, keep_identical_ids=True, **kw))
    assert reranked_kept.metrics["nDCG@10"] == pytest.approx(1 / math.log2(4))


def test_cli_keep_identical_ids(self_hit_dir, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from heedrank.cli import app

    monkeypatch.setenv("HEEDRANK_CACHE_DIR", str(tmp_path / "cache"))
    r = CliRunner().invoke(app, ["eval", "beir", "--data", str(self_hit_dir), "--out", str(tmp_path / "runs"),
                                 "--keep-identical-ids"])
    assert r.exit_code == 0, r.output
    report = load_report(tmp_path / "runs" / "self-hit-test-bm25-none-keepids.json")
    assert report.params["keep_identical_ids"] is True
    assert report.metrics["nDCG@10"] == pytest.approx(0.5)  # 1 / log2(4): d07 third

"""BEIR evaluation on a tiny BEIR-layout dataset (BM25 index built into a temp cache)."""

from __future__ import annotations

import json

import pytest

from eval.beir import cached_index_dir, evaluate_beir
from eval.harness import file_sha256
from eval.report import load_report

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
    monkeypatch.setenv("ATTNRANK_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "runs"
    report = evaluate_beir(beir_dir, rerank="none", out_dir=out, build_dense=False, show_progress=False)
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
    reranked = evaluate_beir(beir_dir, rerank="fake", candidates=3, max_queries=2, seed=1, out_dir=out,
                             build_dense=False, show_progress=False)
    assert json.loads((index_dir / "params.json").read_text())["created"] == created  # reused
    assert reranked.name == "toy-beir-test-bm25-fake-c3-t160-q2-s1"
    assert len(reranked.query_ids) == 2
    assert reranked.first_stage_metrics["nDCG@10"] == pytest.approx(1.0)
    assert reranked.truncation["docs_reranked"] == 6
    assert load_report(out / f"{reranked.name}.json") == reranked


def test_explicit_index_dir(beir_dir, tmp_path):
    from index.builder import build_index

    idx = tmp_path / "idx"
    build_index(beir_dir, idx, dense=False, show_progress=False)
    report = evaluate_beir(beir_dir, index_dir=idx, out_dir=tmp_path / "runs", show_progress=False)
    assert report.index["path"] == str(idx)
    assert "corpus" not in report.inputs

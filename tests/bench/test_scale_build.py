"""``bench/scale_build.py`` at small N: a scale corpus of 3,700 documents (with its
``metadata.jsonl``) built with the hashing stand-in, then probed in its own process; the figures
it reports are the index's."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="module")
def benches():
    from bench_modules import load_bench

    return load_bench("scale_corpus"), load_bench("scale_build")


def test_build_then_probe_reports_the_index(benches, nfcorpus_dir, tmp_path, capsys) -> None:
    corpus_bench, build_bench = benches
    data = nfcorpus_dir.parent
    if not (data / "beir-scifact").is_dir():
        pytest.skip("SciFact not in the shared data")
    corpus = tmp_path / "3700"
    assert corpus_bench.main(["--n", "3700", "--out", str(corpus), "--data", str(data)]) == 0
    out = tmp_path / "ix"
    assert build_bench.main(["--corpus", str(corpus), "--out", str(out), "--encoder", "hashing", "--queries", "20"]) == 0
    figures = json.loads((tmp_path / "ix.scale.json").read_text())
    assert figures["num_docs"] == 3700 and figures["dense_index"] == "IndexIDMap2(IndexFlatIP)"
    assert set(figures["build_stages"]) == {"read", "docstore", "bm25", "encode", "faiss"}
    assert set(figures["disk_mb"]) == {"bm25", "docs.sqlite", "params.json", "vectors.faiss"}
    assert figures["dense_recall10_vs_exact"]["recall"] == 1.0  # flat: the search is exact
    for name in ("bm25", "dense", "hybrid"):
        assert figures[name]["p50_ms"] <= figures[name]["p99_ms"]
    assert figures["filtered 1%"]["recall10_vs_exact"] == 1.0 and figures["filtered 1%"]["short"] == 0  # 37 documents
    assert "filtered 0.01%" not in figures  # fewer than 10,000 documents: no bucket holds one in 10,000
    assert 15.0 < figures["bm25"]["ndcg10"] < 60.0  # 20 NFCorpus test queries over NFCorpus and 67 others
    assert "| build_stages |" in capsys.readouterr().out

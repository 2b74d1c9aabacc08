"""``heedrank index kv build`` / ``index info`` on a tiny BM25 index with the real LM (small
blocks, low layer): blocks for every document, a rerun computes nothing, the info reports
coverage, a store of another configuration is a clean error, and /search-style reranking
through the pipeline reads the stored blocks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

pytest.importorskip("torch")

from heedrank.cli import app  # noqa: E402

TEXTS = ["vitamin d and bone density in older adults", "statins lower ldl cholesterol",
         "green tea polyphenols", "vitamin d and bone density in older adults",  # same text as d0: one block
         "omega-3 fatty acids and heart disease", "sleep and blood pressure"]


@pytest.fixture()
def tiny_index(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("HEEDRANK_CACHE_DIR", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rows = [{"_id": f"d{i}", "title": "", "text": t} for i, t in enumerate(TEXTS)]
    (corpus / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "ix"
    built = CliRunner().invoke(app, ["index", "build", "--corpus", str(corpus), "--out", str(out), "--no-dense"])
    assert built.exit_code == 0, built.output
    return out


def test_kv_build_info_rerun_and_mismatch(tiny_index: Path) -> None:
    runner = CliRunner()
    args = ["index", "kv", "build", "--index", str(tiny_index), "--layer", "3", "--max-doc-tokens", "32",
            "--batch-size", "2"]
    first = runner.invoke(app, args)
    assert first.exit_code == 0, first.output
    report = json.loads(first.stdout[first.stdout.index("{"):])
    assert report["blocks"] == 5 and report["computed"] == 5 and report["skipped"] == 0  # 6 docs, 5 distinct texts
    assert report["header"]["layer"] == 3 and report["header"]["dtype"] == "int8"  # the default
    again = runner.invoke(app, args)
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout[again.stdout.index("{"):])["computed"] == 0
    info = runner.invoke(app, ["index", "info", str(tiny_index)])
    assert info.exit_code == 0, info.output
    kv = json.loads(info.stdout)["kv_store"]
    assert kv["blocks"] == 5 and kv["documents"] == 6 and kv["bytes_on_disk"] > 5 * kv["header"]["n_layers"]
    from heedrank.index.store import Index

    ix = Index.open(tiny_index)
    ix.delete_documents(["d1"])  # its text is its own: its block becomes stale
    ix.close()
    pruned = runner.invoke(app, args + ["--prune"])
    assert pruned.exit_code == 0, pruned.output
    after = json.loads(pruned.stdout[pruned.stdout.index("{"):])
    assert after["computed"] == 0 and after["blocks"] == 4 and after["bytes_on_disk"] < report["bytes_on_disk"]
    other = runner.invoke(app, args[:-2] + ["--layer", "4"])
    assert other.exit_code == 2
    assert "index_mismatch" in other.output and "layer" in other.output and "kv build" in other.output


def test_pipeline_reads_the_index_store(tiny_index: Path) -> None:
    from heedrank.config import PipelineConfig, RerankerConfig
    from heedrank.pipeline import Pipeline, SearchOptions

    runner = CliRunner()
    built = runner.invoke(app, ["index", "kv", "build", "--index", str(tiny_index), "--layer", "3",
                                "--max-doc-tokens", "32"])
    assert built.exit_code == 0, built.output
    options = {"scoring": "signal", "query_adapter": None, "layer": 3}
    cfg = PipelineConfig(index_dir=str(tiny_index),
                         reranker=RerankerConfig(method="blockrank-cached", max_doc_tokens=32, options=options))
    pipeline = Pipeline.from_config(cfg)
    try:
        result = pipeline.search("vitamin d bone", SearchOptions(retriever="bm25", rerank="blockrank-cached", candidates=4,
                                                                 top_k=4))
    finally:
        pipeline.close()
    assert result.rerank is not None
    cache = result.rerank.cache
    assert cache["misses"] == 0 and cache["hits"] >= 1


def test_new_documents_get_their_blocks_at_ingest(tiny_index: Path) -> None:
    from heedrank.config import PipelineConfig, RerankerConfig
    from heedrank.pipeline import Pipeline, SearchOptions
    from heedrank.types import Document

    options = {"scoring": "signal", "query_adapter": None, "layer": 3}
    cfg = PipelineConfig(index_dir=str(tiny_index),
                         reranker=RerankerConfig(method="blockrank-cached", max_doc_tokens=32, options=options))
    pipeline = Pipeline.from_config(cfg)
    search = SearchOptions(retriever="bm25", rerank="blockrank-cached", candidates=4, top_k=4)
    try:
        assert pipeline.encode_blocks([Document("x", "no reranker built yet")]) == 0
        pipeline.search("vitamin d bone", search)  # builds the reranker (and fills the store on first use)
        new = Document("new1", "zinc supplements and the common cold in children")
        pipeline.index.add_documents([new])
        assert pipeline.encode_blocks([new]) == 1
        assert pipeline.encode_blocks([new]) == 0  # already stored
        result = pipeline.search("zinc common cold children", search)
    finally:
        pipeline.close()
    assert result.ranking.hits[0].doc_id == "new1"
    assert result.rerank is not None and result.rerank.cache["misses"] == 0

"""``heedrank index build / stats / compact`` on a tiny corpus (BM25 only: no model load)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from heedrank.cli import app
from heedrank.types import Document
from heedrank.index.store import Index


def test_build_stats_compact(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HEEDRANK_CACHE_DIR", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rows = [{"_id": f"d{i}", "title": "", "text": f"vitamin number {i}"} for i in range(12)]
    (corpus / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    meta = tmp_path / "meta.jsonl"
    meta.write_text("".join(json.dumps({"doc_id": f"d{i}", "year": 2000 + i}) + "\n" for i in range(12)))
    out = tmp_path / "ix"
    runner = CliRunner()
    built = runner.invoke(app, ["index", "build", "--corpus", str(corpus), "--out", str(out), "--no-dense",
                                "--metadata", str(meta)])
    assert built.exit_code == 0, built.output
    ix = Index.open(out)
    assert ix.filter_vids({"must": [{"key": "year", "range": {"gte": 2010}}]}).tolist() == [10, 11]
    ix.add_documents([Document("new", "vitamin news", "", {"year": 2030})])
    ix.delete_documents(["d0"])
    ix.close()
    stats = runner.invoke(app, ["index", "stats", str(out)])
    assert stats.exit_code == 0, stats.output
    assert json.loads(stats.stdout)["bm25_delta"] == 1
    compacted = runner.invoke(app, ["index", "compact", str(out)])
    assert compacted.exit_code == 0, compacted.output
    assert json.loads(compacted.stdout)["num_docs"] == 12
    assert json.loads(runner.invoke(app, ["index", "stats", str(out)]).stdout)["bm25_delta"] == 0
    bad = runner.invoke(app, ["index", "build", "--corpus", str(corpus), "--out", str(tmp_path / "x"),
                              "--index-type", "annoy"])
    assert bad.exit_code == 2 and "unknown index type" in bad.output


def test_build_refuses_an_id_a_run_file_cannot_carry(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HEEDRANK_CACHE_DIR", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus.jsonl"
    rows = [{"_id": "d1", "text": "vitamin one"}, {"_id": "d2", "text": "vitamin two"}, {"_id": "a b", "text": "spaced"}]
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "ix"
    result = CliRunner().invoke(app, ["index", "build", "--corpus", str(corpus), "--out", str(out), "--no-dense"])
    assert result.exit_code == 2, result.output
    assert f"error (validation): {corpus}:3: document id 'a b' contains whitespace (U+0020 SPACE at character 1)" in (
        " ".join(result.output.split()))
    assert not out.exists() and list(tmp_path.glob(".ix.tmp-*")) == []  # no half-written index


def test_build_refuses_metadata_that_is_not_valid_unicode(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HEEDRANK_CACHE_DIR", str(tmp_path / "cache"))
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"_id": "d1", "text": "vitamin"}) + "\n")
    meta = tmp_path / "meta.jsonl"
    rows = [{"doc_id": "d1", "year": 2020}, {"doc_id": "d1", "tags": ["\ud800"]}]
    meta.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "ix"
    runner = CliRunner()
    result = runner.invoke(app, ["index", "build", "--corpus", str(corpus), "--out", str(out), "--no-dense",
                                 "--metadata", str(meta)])
    assert result.exit_code == 2, result.output
    assert f"{meta}:2: metadata field ['tags'][0] contains the unpaired surrogate U+D800" in " ".join(result.output.split())
    meta.write_bytes(b'{"doc_id": "d1", "note": "caf\xe9"}\n')
    result = runner.invoke(app, ["index", "build", "--corpus", str(corpus), "--out", str(out), "--no-dense",
                                 "--metadata", str(meta)])
    assert result.exit_code == 2 and f"{meta}:1: not valid UTF-8" in " ".join(result.output.split())
    assert not out.exists()

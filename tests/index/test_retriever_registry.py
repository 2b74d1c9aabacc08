"""An index offers the registered retrievers whose ``requires`` it provides, so a retriever
registered with ``heedrank.registry.register_retriever`` reaches ``Pipeline.from_config``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from heedrank import registry
from heedrank.config import PipelineConfig
from heedrank.index.builder import build_index
from heedrank.index.hashing import HashingEncoder
from heedrank.index.store import Index
from heedrank.pipeline import Pipeline
from heedrank.types import Document, Query, Ranking, ScoredDoc


class _Plugin:
    """A plugin retriever: the first ``k`` live documents, score 1."""

    def __init__(self, index: Any) -> None:
        self.index = index

    @classmethod
    def from_index(cls, index: Any, **options: Any) -> _Plugin:
        return cls(index)

    def retrieve(self, queries: Sequence[Query], k: int, *, filter: Any = None) -> list[Ranking]:
        ids = [d for d in self.index.doc_ids if d is not None][:k]
        return [Ranking.from_hits(q.query_id, (ScoredDoc(d, 1.0) for d in ids), k) for q in queries]


class FirstDocs(_Plugin):
    requires = ("bm25",)


class NeedsVectors(_Plugin):
    requires = ("dense",)


class Undeclared(_Plugin):
    """No ``requires``: never offered by an index (it can still be built by name)."""


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_RETRIEVERS", dict(registry._RETRIEVERS))  # undone after the test
    registry.register_retriever("first", FirstDocs)
    registry.register_retriever("needs-vectors", NeedsVectors)
    registry.register_retriever("undeclared", Undeclared)


def _corpus(tmp_path: Path) -> Path:
    d = tmp_path / "corpus"
    d.mkdir()
    rows = [{"_id": f"d{i}", "title": f"T{i}", "text": f"apples and pears number {i}"} for i in range(5)]
    (d / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return d


def test_the_builtins_declare_what_they_require() -> None:
    assert registry.retriever_requires("bm25") == ("bm25",)
    assert registry.retriever_requires("dense") == ("dense",)
    assert registry.retriever_requires("hybrid") == ("bm25", "dense")
    assert registry.retrievers_for({"bm25"}) == ["bm25"]
    assert registry.retrievers_for({"bm25", "dense"}) == ["bm25", "dense", "hybrid"]


def test_a_registered_retriever_reaches_the_pipeline(tmp_path: Path, plugins: None) -> None:
    out = tmp_path / "index"
    build_index(_corpus(tmp_path), out, dense=False, show_progress=False)
    pipe = Pipeline.from_config(PipelineConfig(index_dir=str(out)))
    try:
        assert sorted(pipe.retrievers) == ["bm25", "first"]  # no vectors: nothing that needs them
        assert isinstance(pipe.retrievers["first"], FirstDocs)
        (ranking,) = pipe.retrievers["first"].retrieve([Query("q", "apples")], 2)
        assert ranking.doc_ids == ["d0", "d1"]
    finally:
        pipe.close()


def test_an_index_with_vectors_offers_what_requires_them(plugins: None) -> None:
    docs = [Document(f"d{i}", f"apples {i}", f"T{i}") for i in range(4)]
    index = Index.from_documents(docs, encoder=HashingEncoder(dim=32))
    assert index.provides() == {"bm25", "dense"}
    assert index.available_retrievers() == ["bm25", "dense", "first", "hybrid", "needs-vectors"]
    assert index.describe()["retrievers"] == index.available_retrievers()
    assert "undeclared" in registry.retriever_names()
    assert isinstance(registry.build_retriever("undeclared", index), Undeclared)

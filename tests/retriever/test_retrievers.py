"""BM25, dense, hybrid and run retrievers over an in-memory index with a hashing encoder."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnrank import registry
from attnrank.errors import ValidationError
from attnrank.protocols import Retriever
from attnrank.types import Document, Query, Ranking, ScoredDoc
from index.hashing import HashingEncoder
from index.store import Index
from retriever.bm25 import BM25Retriever
from retriever.dense import DenseRetriever
from retriever.fusion import reciprocal_rank_fusion
from retriever.hybrid import HybridRetriever
from retriever.run import RunRetriever

DOCS = [
    Document("d1", "vitamin d supplements strengthen bone", "Vitamin D"),
    Document("d2", "statins lower cholesterol and may affect breast cancer", "Statins"),
    Document("d3", "breast cancer survival after diagnosis", "Cancer"),
    Document("d4", "running shoes and knee injuries", "Running"),
    Document("d5", "green tea and cholesterol", ""),
]


@pytest.fixture(scope="module")
def index() -> Index:
    return Index.from_documents(DOCS, encoder=HashingEncoder(64))


QUERIES = [Query("q1", "breast cancer statins"), Query("q2", "vitamin bone"), Query("q3", "zzz unknown")]


def test_registry_and_protocol(index: Index) -> None:
    assert index.available_retrievers() == ["bm25", "dense", "hybrid"]
    for name in index.available_retrievers():
        r = registry.build_retriever(name, index)
        assert isinstance(r, Retriever) and r.name == name
    assert isinstance(RunRetriever({}), Retriever)


def test_bm25_retriever(index: Index) -> None:
    r = BM25Retriever.from_index(index)
    out = r.retrieve(QUERIES, k=10)
    assert [x.query_id for x in out] == ["q1", "q2", "q3"]
    assert out[0].doc_ids == ["d2", "d3"]  # d2 has all three terms
    assert out[1].doc_ids == ["d1"]
    assert out[2].hits == ()  # no known token: no hits, never padding
    assert out[0].hits[0].score > out[0].hits[1].score > 0
    (top1,) = r.retrieve([QUERIES[0]], k=1)
    assert top1.doc_ids == ["d2"]


def test_bm25_ties_broken_by_doc_id() -> None:
    ix = Index.from_documents([Document("b", "same words"), Document("a", "same words"), Document("c", "other")])
    (r,) = BM25Retriever.from_index(ix).retrieve([Query("q", "same")], k=1)
    assert r.doc_ids == ["a"]


def test_dense_retriever(index: Index) -> None:
    r = DenseRetriever.from_index(index)
    (out,) = r.retrieve([Query("q", "vitamin d supplements strengthen bone Vitamin D")], k=100)
    assert len(out) == len(DOCS)  # k clamped to the corpus, every document scored
    assert out.doc_ids[0] == "d1" and out.hits[0].score == pytest.approx(1.0, abs=1e-5)
    assert all(-1.0 - 1e-6 <= h.score <= 1.0 + 1e-6 for h in out.hits)
    assert r.retrieve([], k=3) == []


def test_hybrid_is_rrf_of_bm25_and_dense(index: Index) -> None:
    h = HybridRetriever.from_index(index, depth=3)
    bm25 = BM25Retriever.from_index(index).retrieve(QUERIES, 3)
    dense = DenseRetriever.from_index(index).retrieve(QUERIES, 3)
    out = h.retrieve(QUERIES, k=2)
    for i in range(len(QUERIES)):
        assert out[i] == reciprocal_rank_fusion([bm25[i], dense[i]], 2)
    assert out[0].doc_ids[0] in {"d2", "d3"}
    with pytest.raises(ValidationError, match="unknown hybrid retriever options"):
        HybridRetriever.from_index(index, nope=1)


def test_filters_and_bad_k_are_rejected(index: Index) -> None:
    for name in ("bm25", "dense", "hybrid"):
        r = registry.build_retriever(name, index)
        with pytest.raises(ValidationError, match="metadata filters are not supported yet"):
            r.retrieve(QUERIES, 5, filter={"must": [{"key": "year", "match": {"value": 2020}}]})
        with pytest.raises(ValidationError):
            r.retrieve(QUERIES, 0)
        assert len(r.retrieve(QUERIES, 5, filter={})) == 3  # empty filter = no filter


def test_bm25_only_index_has_no_dense() -> None:
    ix = Index.from_documents(DOCS)
    assert ix.available_retrievers() == ["bm25"]
    with pytest.raises(ValidationError):
        DenseRetriever.from_index(ix)
    with pytest.raises(ValidationError):
        HybridRetriever.from_index(ix)


def test_run_retriever() -> None:
    run = {"q1": {"a": 1.0, "b": 3.0, "c": 2.0, "d": 2.0}}
    r = RunRetriever(run, name="BM25")
    assert r.name == "BM25" and r.query_ids == ["q1"]
    out = r.retrieve([Query("q1", "ignored"), Query("zz", "unknown")], k=3)
    assert out[0].doc_ids == ["b", "c", "d"]
    assert out[1] == Ranking("zz")
    run["q1"]["e"] = 9.0  # the caller's mapping is copied
    assert r.retrieve([Query("q1", "")], 1)[0].doc_ids == ["b"]
    with pytest.raises(ValidationError):
        r.retrieve([Query("q1", "")], 1, filter={"must": []})


@settings(max_examples=40, deadline=None)
@given(
    words=st.lists(st.sampled_from(["breast", "cancer", "vitamin", "bone", "tea", "knee", "zzz"]), max_size=4),
    k=st.integers(1, 8),
    name=st.sampled_from(["bm25", "dense", "hybrid"]),
)
def test_retriever_invariants(index: Index, words: list[str], k: int, name: str) -> None:
    r = registry.build_retriever(name, index)
    (out,) = r.retrieve([Query("q", " ".join(words))], k)
    assert out.query_id == "q"
    assert len(out) <= min(k, len(DOCS))
    assert len(set(out.doc_ids)) == len(out)
    keys = [(-h.score, h.doc_id) for h in out.hits]
    assert keys == sorted(keys)
    assert set(out.doc_ids) <= {d.doc_id for d in DOCS}
    if name == "dense":
        assert len(out) == min(k, len(DOCS))
    assert isinstance(out.hits[0], ScoredDoc) if len(out) else True

"""BM25, dense, hybrid and run retrievers over an in-memory index with a hashing encoder."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heedrank import registry
from heedrank.errors import ValidationError
from heedrank.protocols import Retriever
from heedrank.types import Document, Query, Ranking, ScoredDoc
from heedrank.index.hashing import HashingEncoder
from heedrank.index.store import Index
from heedrank.retriever.bm25 import BM25Retriever
from heedrank.retriever.dense import DenseRetriever
from heedrank.retriever.hybrid import HybridRetriever, reciprocal_rank_fusion
from heedrank.retriever.run import RunRetriever

DOCS = [
    Document("d1", "vitamin d supplements strengthen bone", "Vitamin D", {"topic": "bone", "year": 2019}),
    Document("d2", "statins lower cholesterol and may affect breast cancer", "Statins", {"topic": "cancer"}),
    Document("d3", "breast cancer survival after diagnosis", "Cancer", {"topic": ["cancer", "survival"]}),
    Document("d4", "running shoes and knee injuries", "Running", {"topic": "sport", "year": 2021}),
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


def test_filters_and_bad_k(index: Index) -> None:
    from heedrank.index.filters import FilterError

    cancer = {"must": [{"key": "topic", "match": {"value": "cancer"}}]}
    for name in ("bm25", "dense", "hybrid"):
        r = registry.build_retriever(name, index)
        out = r.retrieve(QUERIES, 5, filter=cancer)
        for ranking in out:
            assert set(ranking.doc_ids) <= {"d2", "d3"}, name  # only matching documents
        assert set(r.retrieve([Query("q", "green tea cholesterol")], 5, filter=cancer)[0].doc_ids) <= {"d2", "d3"}
        with pytest.raises(FilterError, match=r"filter.must\[0\].range: unknown operator 'near'"):
            r.retrieve(QUERIES, 5, filter={"must": [{"key": "year", "range": {"near": 2020}}]})
        with pytest.raises(ValidationError):
            r.retrieve(QUERIES, 0)
        assert len(r.retrieve(QUERIES, 5, filter={})) == 3  # empty filter = no filter
        nothing = {"must": [{"key": "no_such_key", "match": {"value": 1}}]}  # not an error: matches nothing
        assert all(len(x) == 0 for x in r.retrieve(QUERIES, 5, filter=nothing))
    (dense,) = registry.build_retriever("dense", index).retrieve([Query("q", "knee")], 5, filter=cancer)
    assert sorted(dense.doc_ids) == ["d2", "d3"]  # dense: min(k, matching) hits, whatever the query


def test_weighted_hybrid(index: Index) -> None:
    from heedrank.retriever.hybrid import weighted_score_fusion

    h = HybridRetriever.from_index(index, fusion="weighted", weights=[0.7, 0.3], depth=5)
    bm25 = BM25Retriever.from_index(index).retrieve(QUERIES, 5)
    dense = DenseRetriever.from_index(index).retrieve(QUERIES, 5)
    out = h.retrieve(QUERIES, k=3)
    for i in range(len(QUERIES)):
        assert out[i] == weighted_score_fusion([bm25[i], dense[i]], 3, [0.7, 0.3])
    with pytest.raises(ValidationError, match="unknown fusion"):
        HybridRetriever.from_index(index, fusion="max")
    with pytest.raises(ValidationError, match="one weight per retriever"):
        HybridRetriever.from_index(index, fusion="weighted", weights=[1.0])


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
    assert r.retrieve([Query("q1", "")], 1, filter={"must": []})[0].doc_ids == ["b"]  # empty = no filter
    with pytest.raises(ValidationError, match="cannot apply a metadata filter"):
        r.retrieve([Query("q1", "")], 1, filter={"must": [{"has_id": ["b"]}]})


FILTERS = [
    None,
    {"must": [{"key": "topic", "match": {"value": "cancer"}}]},
    {"must_not": [{"key": "topic", "match": {"any": ["cancer", "bone"]}}]},
    {"should": [{"key": "year", "range": {"gte": 2020}}, {"is_empty": {"key": "topic"}}]},
    {"must": [{"has_id": ["d1", "d5"]}]},
]


@settings(max_examples=60, deadline=None)
@given(
    words=st.lists(st.sampled_from(["breast", "cancer", "vitamin", "bone", "tea", "knee", "zzz"]), max_size=4),
    k=st.integers(1, 8),
    name=st.sampled_from(["bm25", "dense", "hybrid"]),
    flt=st.sampled_from(FILTERS),
)
def test_retriever_invariants(index: Index, words: list[str], k: int, name: str, flt) -> None:
    from heedrank.index.filters import matches, parse_filter

    r = registry.build_retriever(name, index)
    (out,) = r.retrieve([Query("q", " ".join(words))], k, filter=flt)
    f = parse_filter(flt)
    allowed = {d.doc_id for d in DOCS if matches(f, d.doc_id, d.metadata)}
    assert set(out.doc_ids) <= allowed  # the filter is always satisfied
    assert out.query_id == "q"
    assert len(out) <= min(k, len(DOCS))
    assert len(set(out.doc_ids)) == len(out)
    keys = [(-h.score, h.doc_id) for h in out.hits]
    assert keys == sorted(keys)
    assert set(out.doc_ids) <= {d.doc_id for d in DOCS}
    if name == "dense":
        assert len(out) == min(k, len(allowed))
    assert isinstance(out.hits[0], ScoredDoc) if len(out) else True

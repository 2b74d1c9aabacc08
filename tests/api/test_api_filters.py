"""POST /search with a metadata filter: only matching documents come back; a malformed
filter is a 422 in the {error, error_type} envelope naming the offending clause."""

from __future__ import annotations

import pytest

from api_fakes import DOCS
from heedrank import registry
from heedrank.config import RerankerConfig
from heedrank.types import Document

COLOURS = {"d01": "red", "d02": "green", "d05": "red", "d06": "green", "d07": "red", "d11": "red"}
FILTER_DOCS = [
    Document(d.doc_id, d.text, d.title, {"colour": COLOURS.get(d.doc_id, "none"), "n": int(d.doc_id[1:]),
                                         "tags": ["fruit"] if int(d.doc_id[1:]) % 2 else []})
    for d in DOCS
]


@pytest.fixture
def filter_client(settings, fake_reranker):
    from fastapi.testclient import TestClient

    from heedrank.api.app import create_app
    from heedrank.pipeline import Pipeline
    from heedrank.index.hashing import HashingEncoder
    from heedrank.index.store import Index

    index = Index.from_documents(FILTER_DOCS, encoder=HashingEncoder(64))
    pipeline = Pipeline(
        retrievers={name: registry.build_retriever(name, index) for name in index.available_retrievers()},
        docstore=index.docstore,
        reranker_factory=lambda m: registry.build_reranker(RerankerConfig(method=m)),
        max_top_k=20,
        max_candidates=8,
    )
    with TestClient(create_app(settings, pipeline=pipeline)) as c:
        runtime = getattr(c.app.state, "runtime", None)
        if runtime is not None:
            assert runtime.wait_ready(10)
        yield c


@pytest.mark.parametrize("retriever", ["bm25", "dense", "hybrid"])
def test_filter_restricts_results(filter_client, retriever):
    flt = {"must": [{"key": "colour", "match": {"value": "red"}}], "must_not": [{"key": "n", "range": {"gte": 7}}]}
    r = filter_client.post("/search", json={"query": "apples fruit red", "top_k": 10, "retriever": retriever,
                                            "filter": flt})
    assert r.status_code == 200, r.text
    ids = [h["doc_id"] for h in r.json()["results"]]
    assert ids and set(ids) <= {"d01", "d05"}
    if retriever == "dense":
        assert sorted(ids) == ["d01", "d05"]  # min(k, matching documents)


def test_filter_with_rerank_and_unknown_key(filter_client):
    body = {"query": "apples", "top_k": 5, "rerank": {"method": "fake", "candidates": 4},
            "filter": {"should": [{"key": "tags", "match": {"any": ["fruit"]}}, {"has_id": ["d02"]}]}}
    r = filter_client.post("/search", json=body)
    assert r.status_code == 200, r.text
    ids = [h["doc_id"] for h in r.json()["results"]]
    assert ids and all(i == "d02" or int(i[1:]) % 2 for i in ids)
    nothing = filter_client.post("/search", json={"query": "apples", "filter": {"must": [
        {"key": "no_such_field", "match": {"value": "x"}}]}})
    assert nothing.status_code == 200 and nothing.json()["results"] == []  # unknown key: no match, no error


@pytest.mark.parametrize(
    ("flt", "needle"),
    [
        ({"must": [{"key": "n", "range": {"between": [1, 3]}}]}, "filter.must[0].range: unknown operator 'between'"),
        ({"must": [{"key": "n", "match": {"value": 1.5}}]}, "filter.must[0].match.value"),
        ({"should": [{"key": "n", "range": {"gt": "3"}}]}, "filter.should[0].range.gt: range bounds must be numbers"),
        ({"must_not": [{"colour": "red"}]}, "filter.must_not[0]: unknown condition 'colour'"),
        ({"where": {"colour": "red"}}, "filter: unknown key 'where'"),
        ({"must": [{"key": "colour"}]}, "filter.must[0]: a field condition needs 'match' or 'range'"),
        ({"must": "colour=red"}, "filter.must: expected a list of conditions"),
    ],
)
def test_malformed_filter_is_422_naming_the_clause(filter_client, flt, needle):
    r = filter_client.post("/search", json={"query": "apples", "filter": flt})
    assert r.status_code == 422, r.text
    body = r.json()
    assert set(body) == {"error", "error_type"} and body["error_type"] == "validation"
    assert needle in body["error"]


def test_filter_must_be_an_object(filter_client):
    r = filter_client.post("/search", json={"query": "apples", "filter": ["colour", "red"]})
    assert r.status_code == 422 and r.json()["error_type"] == "validation"
    assert "filter" in r.json()["error"]

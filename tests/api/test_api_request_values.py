"""Values that real clients send: numbers past 64 bits in a filter over
a real SQLite document store (answered exactly or 422 naming the clause, never 500), strict
integers and booleans, a body that is not UTF-8, filters dumped from qdrant-client's models,
queries that are empty once analysed, and Unicode variants of a query through /search."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient

from heedrank.api.app import create_app

NFC, NFD = "caf\u00e9", "cafe\u0301"
ROWS = [
    {"_id": "big", "title": "", "text": "apples in the orchard", "metadata": {"n": 2**63 - 1, "f": 1e20}},
    {"_id": "small", "title": "", "text": "apples on the tree", "metadata": {"n": 5, "f": 1.5}},
    {"_id": "neg", "title": "", "text": "apples for cider", "metadata": {"n": -(2**63), "f": -1e20}},
    {"_id": "cafe", "title": "", "text": f"the {NFC} sells apples", "metadata": {"n": 0}},
]


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
    from heedrank.index.builder import build_index

    root = tmp_path_factory.mktemp("values")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    build_index(corpus, root / "index", dense=False, show_progress=False)
    return root / "index"


@pytest.fixture
def sql_client(settings, fake_reranker, index_dir):
    """A client over an on-disk index (SQLite document store: filters compile to SQL)."""
    with TestClient(create_app(settings.model_copy(update={"index": str(index_dir)}))) as c:
        assert c.app.state.runtime.wait_ready(10)
        yield c


def _ids(r) -> list[str]:
    assert r.status_code == 200, r.text
    return sorted(h["doc_id"] for h in r.json()["results"])


def _search(c, flt):
    return c.post("/search", json={"query": "apples", "top_k": 10, "filter": flt})


def _error(r, status: int, error_type: str) -> str:
    assert r.status_code == status, r.text
    assert set(r.json()) == {"error", "error_type"} and r.json()["error_type"] == error_type
    return r.json()["error"]


# -------------------------------------------------------------------- numbers past 64 bits
@pytest.mark.parametrize(
    ("rng", "expected"),
    [
        ({"gte": 2**63}, []),
        ({"lt": 2**63}, ["big", "cafe", "neg", "small"]),
        ({"gte": 2**63 - 1}, ["big"]),
        ({"gt": -(2**63) - 1}, ["big", "cafe", "neg", "small"]),
        ({"lte": -(2**63)}, ["neg"]),
        ({"gte": 10**400}, []),
        ({"lt": -(10**400)}, []),
    ],
)
def test_range_bounds_past_64_bits_are_answered_exactly(sql_client, rng, expected):
    assert _ids(_search(sql_client, {"must": [{"key": "n", "range": rng}]})) == expected


@pytest.mark.parametrize(
    ("rng", "expected"),
    [({"gte": 10**20}, ["big"]), ({"gt": 10**20}, []), ({"lte": -(10**20)}, ["neg"]), ({"lt": -(10**20)}, []),
     ({"gt": 10**20 - 1}, ["big"]), ({"lt": 10**20 + 1, "gt": 1.5}, ["big"])],
)
def test_integer_bounds_against_stored_floats_are_exact(sql_client, rng, expected):
    assert _ids(_search(sql_client, {"must": [{"key": "f", "range": rng}]})) == expected


@pytest.mark.parametrize(
    ("flt", "clause"),
    [
        ({"must": [{"key": "n", "match": {"value": 10**20}}]}, "filter.must[0].match.value"),
        ({"must": [{"key": "n", "match": {"any": [5, 2**63]}}]}, "filter.must[0].match.any[1]"),
        ({"must_not": [{"key": "n", "match": {"value": -(2**63) - 1}}]}, "filter.must_not[0].match.value"),
    ],
)
def test_match_values_past_64_bits_are_422_naming_the_clause(sql_client, flt, clause):
    message = _error(_search(sql_client, flt), 422, "validation")
    assert message.startswith(f"{clause}: ") and "64-bit" in message


def test_match_values_at_the_64_bit_edges(sql_client):
    assert _ids(_search(sql_client, {"must": [{"key": "n", "match": {"value": 2**63 - 1}}]})) == ["big"]
    assert _ids(_search(sql_client, {"must": [{"key": "n", "match": {"any": [-(2**63), 5]}}]})) == ["neg", "small"]


def test_a_qdrant_client_dump_with_nulls_and_min_should(sql_client):
    # qdrant_client.models.Filter(must=[FieldCondition(key="n", range=Range(gte=0))],
    #     min_should=MinShould(conditions=[FieldCondition(key="n", match=MatchValue(value=5)),
    #                                      FieldCondition(key="f", range=Range(lt=0))], min_count=1)).model_dump()
    none = {"geo_bounding_box": None, "geo_radius": None, "geo_polygon": None, "values_count": None,
            "is_empty": None, "is_null": None}
    dumped = {
        "should": None, "must_not": None,
        "must": [{"key": "n", "match": None, "range": {"lt": None, "gt": None, "gte": 0.0, "lte": None}, **none}],
        "min_should": {"conditions": [{"key": "n", "match": {"value": 5}, "range": None, **none},
                                      {"key": "f", "match": None, "range": {"lt": 0.0, "gt": None, "gte": None,
                                                                              "lte": None}, **none}],
                       "min_count": 1},
    }
    assert _ids(_search(sql_client, dumped)) == ["small"]
    dumped["min_should"]["min_count"] = 0
    assert _ids(_search(sql_client, dumped)) == ["big", "cafe", "small"]


# -------------------------------------------------------------------- strict integers and booleans
@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/search", {"query": "apples", "top_k": True}, "top_k"),
        ("/search", {"query": "apples", "top_k": "3"}, "top_k"),
        ("/search", {"query": "apples", "top_k": 3.0}, "top_k"),
        ("/search", {"query": "apples", "rerank": {"candidates": "4"}}, "rerank.candidates"),
        ("/search", {"query": "apples", "rerank": {"candidates": False}}, "rerank.candidates"),
        ("/search", {"query": "apples", "explain": "true"}, "explain"),
        ("/search", {"query": "apples", "explain": 1}, "explain"),
        ("/rerank", {"query": "a", "documents": ["x"], "top_n": True}, "top_n"),
        ("/rerank", {"query": "a", "documents": ["x"], "top_n": "1"}, "top_n"),
        ("/rerank", {"query": "a", "documents": ["x"], "deadline_ms": "100"}, "deadline_ms"),
        ("/rerank", {"query": "a", "documents": ["x"], "max_tokens_per_doc": True}, "max_tokens_per_doc"),
        ("/rerank", {"query": "a", "documents": ["x"], "return_documents": "yes"}, "return_documents"),
    ],
)
def test_integers_and_booleans_are_strict(client, path, body, field):
    assert _error(client.post(path, json=body), 422, "validation").startswith(f"{field}: ")


def test_strict_values_that_are_right_still_pass(client):
    r = client.post("/search", json={"query": "apples", "top_k": 3, "explain": False, "rerank": {"candidates": 4}})
    assert r.status_code == 200 and len(r.json()["results"]) == 3
    r = client.post("/rerank", json={"query": "a", "documents": ["x", "y"], "top_n": 1, "return_documents": True,
                                     "priority": 0})
    assert r.status_code == 200 and len(r.json()["results"]) == 1


# -------------------------------------------------------------------- body encoding
@pytest.mark.parametrize("path", ["/search", "/rerank", "/documents"])
def test_a_latin_1_body_is_400_saying_utf_8_json(client, path):
    body = '{"query": "caf\u00e9", "documents": ["cr\u00e8me"]}'.encode("latin-1")
    r = client.post(path, content=body, headers={"Content-Type": "application/json"})
    message = _error(r, 400, "bad_request")
    assert "must be JSON encoded as UTF-8" in message and "0xe9" in message


# -------------------------------------------------------------------- queries after analysis
@pytest.mark.parametrize("query", ["\u200b", "\u200b\u200b \u200b", "\u00ad", "\ufeff\u2060", " \u200b\n"])
def test_a_query_empty_after_analysis_is_422(client, query):
    assert "query must not be empty" in _error(client.post("/search", json={"query": query}), 422, "validation")
    assert "query must not be empty" in _error(client.post("/rerank", json={"query": query, "documents": ["x"]}),
                                               422, "validation")


@pytest.mark.parametrize("query", [NFC, NFD, "CAF\u00c9", "\uff43\uff41\uff46\u00e9", "ca\u200bf\u00e9", "ca\u00adfe\u0301"])
def test_unicode_variants_of_a_query_find_the_document(sql_client, query):
    r = sql_client.post("/search", json={"query": query, "top_k": 3})
    assert r.status_code == 200, r.text
    assert [h["doc_id"] for h in r.json()["results"]] == ["cafe"]

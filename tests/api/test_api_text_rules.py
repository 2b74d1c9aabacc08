"""One rule for every text-bearing field of /rerank and /search: a string that is not valid
Unicode (an unpaired surrogate, sent as a JSON ``\\ud800`` escape) is a 422 naming the field
and its index or path. (/documents, which writes to a store: test_api_documents.py.)"""

from __future__ import annotations

import json

import pytest

BAD = "broken \ud800 text"  # json.dumps writes the lone surrogate as the escape \ud800
PROBLEM = "contains the unpaired surrogate U+D800 at character 7"


def _post(client, url: str, body: dict):
    raw = json.dumps(body)  # ensure_ascii: the body is plain ASCII JSON with \ud800 escapes
    assert "\\ud800" in raw
    return client.post(url, content=raw, headers={"Content-Type": "application/json"})


def _validation_error(r) -> str:
    assert r.status_code == 422, r.text
    assert r.json()["error_type"] == "validation"
    return r.json()["error"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"query": BAD, "documents": ["x"]}, "query: "),
        ({"query": "q", "documents": ["ok", "ok", "ok", BAD]}, "documents[3].text: "),
        ({"query": "q", "documents": ["ok", {"text": BAD}]}, "documents[1].text: "),
        ({"query": "q", "documents": [{"text": "ok", "id": BAD}]}, "documents[0]: value at ['id']: "),
        ({"query": "q", "documents": [{"text": "ok", "meta": {"tags": ["a", BAD]}}]},
         "documents[0]: value at ['meta']['tags'][1]: "),
        ({"query": "q", "documents": ["x"], "model": BAD}, "model: "),
        ({"query": "q", "documents": ["x"], "rank_fields": [BAD]}, "rank_fields[0]: "),
    ],
)
def test_rerank_names_the_invalid_field(client, body, field):
    message = _validation_error(_post(client, "/rerank", body))
    assert message.startswith(field + PROBLEM), message


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"query": BAD}, "query: "),
        ({"query": "apples", "collection": BAD}, "collection: "),
        ({"query": "apples", "retriever": BAD}, "retriever: "),
        ({"query": "apples", "rerank": {"method": BAD}}, "rerank.method: "),
        ({"query": "apples", "filter": {"must": [{"key": "tags", "match": {"value": BAD}}]}},
         "filter: value at ['must'][0]['match']['value']: "),
    ],
)
def test_search_names_the_invalid_field(client, body, field):
    message = _validation_error(_post(client, "/search", body))
    assert message.startswith(field + PROBLEM), message


def test_search_filter_key_is_checked(client):
    message = _validation_error(_post(client, "/search", {"query": "apples", "filter": {"must": [{BAD: 1}]}}))
    assert message.startswith("filter: value at ['must'][0]: the key 'broken \\ud800 text' " + PROBLEM), message


def test_valid_surrogate_pairs_and_non_ascii_text_are_accepted(client):
    # "\ud83d\ude00" is a valid pair (one emoji) in JSON
    r = client.post("/rerank", content='{"query": "apples \\ud83d\\ude00", "documents": ["caf\\u00e9", "\\ud83d\\ude00 x"]}',
                    headers={"Content-Type": "application/json"})
    assert r.status_code == 200, r.text
    assert sorted(x["index"] for x in r.json()["results"]) == [0, 1]


def test_non_document_items_are_named(client):
    message = _validation_error(client.post("/rerank", json={"query": "q", "documents": ["ok", 3]}))
    assert message == "documents[1]: a document must be a string or an object with a `text` field"

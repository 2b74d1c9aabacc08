"""``POST /documents``, ``GET``/``DELETE /documents/{id}`` on real BM25 index directories
(two collections), with the app running (lifespan): durability across a restart, named
collections, limits and every error type."""

from __future__ import annotations

import json

import pytest

CORPUS = [
    {"_id": "a1", "title": "Apples", "text": "Apples are red or green fruit grown in orchards.", "year": 2020},
    {"_id": "a2", "title": "Pears", "text": "Pears are sweet fruit related to apples.", "year": 2021},
    {"_id": "a3", "title": "Plums", "text": "Plums are purple stone fruit.", "year": 2019},
]
OTHER = [{"_id": "o1", "title": "Rivers", "text": "The Danube flows into the Black Sea."}]


def _build(root, name, rows):
    from heedrank.index.builder import build_index

    corpus = root / f"{name}.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    build_index(corpus, root / name, dense=False, show_progress=False)
    return root / name


@pytest.fixture
def dirs(tmp_path):
    return _build(tmp_path, "fruit", CORPUS), _build(tmp_path, "rivers", OTHER)


def _settings(dirs, **kw):
    from heedrank.settings import Settings

    fruit, rivers = dirs
    return Settings(index=str(fruit), collections={"rivers": str(rivers)}, rerank_method="none", warmup=False, **kw)


def _client(settings):
    from fastapi.testclient import TestClient

    from heedrank.api.app import create_app

    return TestClient(create_app(settings))


def _search_ids(c, query, **kw):
    r = c.post("/search", json={"query": query, "top_k": 10, "retriever": "bm25", **kw})
    assert r.status_code == 200, r.text
    return [h["doc_id"] for h in r.json()["results"]]


def test_upsert_get_search_delete_and_restart(dirs):
    settings = _settings(dirs)
    with _client(settings) as c:
        r = c.post("/documents", json={"documents": [
            {"id": "k1", "title": "Kiwi", "text": "Kiwifruit has fuzzy brown skin.", "metadata": {"year": 2024}},
            {"id": "a2", "title": "Pears", "text": "Quinces are hard yellow pome fruit."},
        ]})
        assert r.status_code == 200, r.text
        assert r.json() == {"collection": "default", "added": ["k1"], "replaced": ["a2"], "num_docs": 4}
        got = c.get("/documents/k1").json()
        assert got == {"collection": "default", "id": "k1", "title": "Kiwi", "text": "Kiwifruit has fuzzy brown skin.",
                       "metadata": {"year": 2024}}
        assert _search_ids(c, "kiwifruit fuzzy")[0] == "k1"
        assert _search_ids(c, "kiwifruit", filter={"must": [{"key": "year", "range": {"gte": 2024}}]}) == ["k1"]
        assert _search_ids(c, "quinces")[0] == "a2"
        assert "a2" not in _search_ids(c, "sweet related")  # the old text is gone
        r = c.delete("/documents/a1")
        assert r.status_code == 200 and r.json() == {"collection": "default", "deleted": "a1", "num_docs": 3}
        assert c.get("/documents/a1").status_code == 404
        assert "a1" not in _search_ids(c, "apples orchards")
        r = c.delete("/documents/a1")
        assert r.status_code == 404 and r.json()["error_type"] == "not_found"
        # the other collection is untouched
        assert c.get("/documents/k1", params={"collection": "rivers"}).status_code == 404
    with _client(settings) as c:  # restart: everything acknowledged is still there
        assert c.get("/documents/k1").json()["text"] == "Kiwifruit has fuzzy brown skin."
        assert c.get("/documents/a1").status_code == 404
        assert _search_ids(c, "kiwifruit")[0] == "k1"
        assert c.get("/info").json()["collections"]["default"]["num_docs"] == 3


def test_named_collection_is_writable(dirs):
    with _client(_settings(dirs)) as c:
        r = c.post("/documents", json={"collection": "rivers", "documents": [
            {"id": "o2", "text": "The Rhine flows into the North Sea."}]})
        assert r.status_code == 200, r.text
        assert r.json()["collection"] == "rivers" and r.json()["num_docs"] == 2
        assert _search_ids(c, "rhine", collection="rivers") == ["o2"]
        assert "o2" not in _search_ids(c, "rhine")
        assert c.get("/documents/o2", params={"collection": "rivers"}).json()["text"].startswith("The Rhine")
        r = c.post("/documents", json={"collection": "lakes", "documents": [{"id": "x", "text": "y"}]})
        assert r.status_code == 404 and "rivers" in r.json()["error"]


def test_document_ids_with_slashes(dirs):
    with _client(_settings(dirs)) as c:
        assert c.post("/documents", json={"documents": [{"id": "pmc/123", "text": "Slashes in ids."}]}).status_code == 200
        assert c.get("/documents/pmc/123").json()["id"] == "pmc/123"
        assert c.delete("/documents/pmc/123").status_code == 200


@pytest.mark.parametrize(
    ("body", "status", "error_type"),
    [
        ({"documents": []}, 422, "validation"),
        ({"documents": [{"id": "", "text": "x"}]}, 422, "validation"),
        ({"documents": [{"id": "x"}]}, 422, "validation"),
        ({"documents": [{"id": "x", "text": "y", "color": "red"}]}, 422, "validation"),
        ({"documents": [{"id": "x", "text": "y"}, {"id": "x", "text": "z"}]}, 422, "validation"),
        ({"documents": [{"id": f"n{i}", "text": "t"} for i in range(4)]}, 413, "payload_too_large"),
        ({"documents": [{"id": "long", "text": "w" * 101}]}, 413, "payload_too_large"),
    ],
)
def test_upsert_errors_write_nothing(dirs, body, status, error_type):
    with _client(_settings(dirs, max_ingest_documents=3, max_document_chars=100)) as c:
        r = c.post("/documents", json=body)
        assert r.status_code == status, r.text
        assert r.json()["error_type"] == error_type and r.json()["error"]
        assert c.get("/info").json()["collections"]["default"]["num_docs"] == 3
        assert c.get("/documents/x").status_code == 404


def test_collection_without_index_is_read_only(fake_reranker):
    from api_fakes import make_pipeline
    from fastapi.testclient import TestClient

    from heedrank.api.app import create_app
    from heedrank.settings import Settings

    settings = Settings(index="unused", rerank_method="fake", warmup=False)
    with TestClient(create_app(settings, pipeline=make_pipeline())) as c:
        assert c.get("/documents/d01").json()["title"] == "Apples"  # reading works on any store
        r = c.post("/documents", json={"documents": [{"id": "n", "text": "t"}]})
        assert r.status_code == 409 and r.json()["error_type"] == "index_mismatch"
        assert c.delete("/documents/d01").status_code == 409


def test_documents_need_the_api_key(dirs):
    with _client(_settings(dirs, api_key="s3cret")) as c:
        body = {"documents": [{"id": "n", "text": "t"}]}
        r = c.post("/documents", json=body)
        assert r.status_code == 401 and r.json()["error_type"] == "unauthorized"
        assert c.get("/documents/a1").status_code == 401
        assert c.delete("/documents/a1").status_code == 401
        auth = {"Authorization": "Bearer s3cret"}
        assert c.post("/documents", json=body, headers=auth).status_code == 200
        assert c.get("/documents/n", headers=auth).status_code == 200


@pytest.mark.parametrize(
    ("doc", "message"),
    [({"id": "  ", "text": "t"}, "whitespace"), ({"id": "x", "text": " ", "title": ""}, "nothing to index")],
)
def test_blank_ids_and_empty_documents_are_rejected(dirs, doc, message):
    with _client(_settings(dirs)) as c:
        r = c.post("/documents", json={"documents": [doc]})
        assert r.status_code == 422 and message in r.json()["error"]
        assert c.post("/documents", json={"documents": [{"id": "t", "title": "Title only", "text": ""}]}).status_code == 200


def test_form_encoded_body_gets_a_content_type_hint(dirs):
    with _client(_settings(dirs)) as c:
        r = c.post("/documents", content=b'{"documents": []}', headers={"Content-Type": "application/x-www-form-urlencoded"})
        assert r.status_code == 422 and "Content-Type: application/json" in r.json()["error"]


BAD = "bad \ud800 text"  # json.dumps writes the lone surrogate as the JSON escape \ud800
SURROGATE = "contains the unpaired surrogate U+D800 at character 4"


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"id": "n2", "text": BAD}, "documents[1].text: " + SURROGATE),
        ({"id": "n2", "text": "t", "title": BAD}, "documents[1].title: " + SURROGATE),
        ({"id": "n2", "text": "t", "metadata": {"note": BAD}}, "documents[1].metadata: value at ['note']: " + SURROGATE),
        ({"id": "n2", "text": "t", "metadata": {"a": {"b": [1, BAD]}}},
         "documents[1].metadata: value at ['a']['b'][1]: " + SURROGATE),
        ({"id": "n2", "text": "t", "metadata": {BAD: 1}}, "documents[1].metadata: the key 'bad \\ud800 text' " + SURROGATE),
        ({"id": "n\ud800", "text": "t"},
         "documents[1].id: id 'n\\ud800' contains an unpaired surrogate (U+D800 at character 1)"),
        ({"id": "n 2", "text": "t"}, "documents[1].id: id 'n 2' contains whitespace (U+0020 SPACE at character 1)"),
        ({"id": "n2\t", "text": "t"}, "documents[1].id: id 'n2\\t' contains whitespace (U+0009 at character 2)"),
        ({"id": "n\x002", "text": "t"},
         "documents[1].id: id 'n\\x002' contains a control character (U+0000 at character 1)"),
    ],
)
def test_invalid_text_or_id_is_422_and_writes_nothing(dirs, doc, message):
    with _client(_settings(dirs)) as c:
        before = c.get("/info").json()["collections"]["default"]["num_docs"]
        raw = json.dumps({"documents": [{"id": "fresh", "text": "Quinces are a valid first document."}, doc]})
        r = c.post("/documents", content=raw, headers={"Content-Type": "application/json"})
        assert r.status_code == 422, r.text
        assert r.json()["error_type"] == "validation"
        assert r.json()["error"].startswith(message), r.json()["error"]
        # all or nothing: neither document of the batch exists, the count is unchanged
        assert c.get("/documents/fresh").status_code == 404
        assert c.get("/documents/n2").status_code == 404
        assert c.get("/info").json()["collections"]["default"]["num_docs"] == before == len(CORPUS)
        assert "fresh" not in _search_ids(c, "quinces valid first document")


def test_gzip_and_deflate_upserts(dirs):
    import gzip
    import zlib

    with _client(_settings(dirs, max_body_bytes=4096)) as c:
        body = json.dumps({"documents": [{"id": "gz1", "title": "Quince", "text": "Quinces are hard pome fruit."}]})
        r = c.post("/documents", content=gzip.compress(body.encode()),
                   headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
        assert r.status_code == 200, r.text
        assert r.json()["added"] == ["gz1"] and r.json()["num_docs"] == len(CORPUS) + 1
        assert c.get("/documents/gz1").json()["text"] == "Quinces are hard pome fruit."
        body2 = json.dumps({"documents": [{"id": "df1", "text": "Medlars are brown fruit."}]})
        r = c.post("/documents", content=zlib.compress(body2.encode()),
                   headers={"Content-Type": "application/json", "Content-Encoding": "deflate"})
        assert r.status_code == 200, r.text
        assert "df1" in _search_ids(c, "medlars")
        # a bomb: 3 kB compressed, 3 MB inflated -> 413 from the decompressed size; nothing written
        bomb = gzip.compress(json.dumps({"documents": [{"id": "big", "text": "x" * 3_000_000}]}).encode(), 9)
        assert len(bomb) < 4096
        r = c.post("/documents", content=bomb, headers={"Content-Type": "application/json", "Content-Encoding": "gzip"})
        assert r.status_code == 413, r.text
        assert r.json() == {"error": "decompressed request body is over the limit of 4096 bytes; send less in one "
                                     "request", "error_type": "payload_too_large"}
        assert c.get("/documents/big").status_code == 404
        assert c.get("/info").json()["collections"]["default"]["num_docs"] == len(CORPUS) + 2

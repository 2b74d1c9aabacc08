"""POST /search over an injected in-memory pipeline with a fake reranker."""

from __future__ import annotations

import pytest

from api_fakes import DOCS


def _check_ranking(body: dict, k: int) -> list[str]:
    results = body["results"]
    ids = [h["doc_id"] for h in results]
    scores = [h["raw_score"] for h in results]
    assert len(results) == k
    assert len(set(ids)) == len(ids), "doc ids must be distinct"
    assert scores == sorted(scores, reverse=True), "results must be sorted by descending score"
    assert [h["rank"] for h in results] == list(range(1, k + 1))
    assert set(ids) <= {d.doc_id for d in DOCS}
    return ids


@pytest.mark.parametrize("k", [1, 3, 10])
def test_first_stage_only(client, k):
    r = client.post("/search", json={"query": "red apples", "top_k": k, "rerank": False})
    assert r.status_code == 200, r.text
    body = r.json()
    ids = _check_ranking(body, k)
    assert ids[0] == "d01"  # "red" and "apples" both occur only in d01 and d02; tie broken by doc id
    assert body["rerank"] is None
    assert set(body["timings"]) == {"retrieve", "hydrate", "rerank", "total", "queue"}
    assert body["timings"]["rerank"] == 0.0
    docs = {d.doc_id: d for d in DOCS}
    for hit in body["results"]:
        assert hit["title"] == docs[hit["doc_id"]].title
        assert hit["text"] == docs[hit["doc_id"]].text


def test_default_top_k_is_10(client):
    r = client.post("/search", json={"query": "fruit"})
    assert r.status_code == 200
    _check_ranking(r.json(), 10)


def test_top_k_larger_than_corpus_returns_all(client):
    r = client.post("/search", json={"query": "fruit", "top_k": 20})
    assert r.status_code == 200
    _check_ranking(r.json(), len(DOCS))


def test_rerank_reorders_the_candidates(client, pipeline):
    base = client.post("/search", json={"query": "apples orchards", "top_k": 6, "rerank": False}).json()
    r = client.post("/search", json={"query": "apples orchards", "top_k": 6, "rerank": {"method": "fake", "candidates": 4}})
    assert r.status_code == 200, r.text
    body = r.json()
    ids = _check_ranking(body, 6)
    base_ids = [h["doc_id"] for h in base["results"]]
    # the reranked top 4 are the first-stage top 4, shortest content first (fake reranker)
    assert set(ids[:4]) == set(base_ids[:4])
    lengths = {d.doc_id: len(d.content) for d in DOCS}
    assert [lengths[i] for i in ids[:4]] == sorted(lengths[i] for i in ids[:4])
    assert ids[4:] == base_ids[4:6]  # below the candidates: first-stage order
    info = body["rerank"]
    assert info["method"] == "fake"
    assert info["candidates"] == 4
    assert info["truncated"] == len([i for i in ids[:4] if lengths[i] > 60])  # a count, no longer the ids
    # the budget the reranker read: its config's (the fake's base config leaves it to the method: None)
    assert info["doc_tokens"] == pipeline.reranker("fake").config.max_doc_tokens
    assert info["prompt_tokens"] > 0
    assert body["timings"]["total"] >= body["timings"]["rerank"] >= 0.0


def test_rerank_info_names_the_token_budget_the_reranker_read(settings, fake_reranker):
    from fastapi.testclient import TestClient

    from api_fakes import make_pipeline
    from heedrank.api.app import create_app
    from heedrank.config import RerankerConfig
    from heedrank.pipeline import reranker_factory

    pipeline = make_pipeline(factory=reranker_factory(RerankerConfig(max_doc_tokens=12)))
    with TestClient(create_app(settings, pipeline=pipeline)) as c:
        assert c.app.state.runtime.wait_ready(10)
        body = c.post("/search", json={"query": "apples orchards", "top_k": 6}).json()
    info = body["rerank"]
    assert info["doc_tokens"] == 12
    lengths = {d.doc_id: len(d.content) for d in DOCS}
    assert info["truncated"] == sum(lengths[h["doc_id"]] > 60 for h in body["results"][:info["candidates"]])


def test_rerank_defaults_from_settings(client, settings):
    r = client.post("/search", json={"query": "apples", "rerank": {}})
    assert r.status_code == 200, r.text
    info = r.json()["rerank"]
    assert info["method"] == settings.rerank_method == "fake"
    assert info["candidates"] == settings.default_candidates


def test_rerank_none_is_first_stage(client):
    a = client.post("/search", json={"query": "apples", "rerank": {"method": "none"}}).json()
    b = client.post("/search", json={"query": "apples", "rerank": False}).json()
    c = client.post("/search", json={"query": "apples", "rerank": None}).json()
    assert a["rerank"] is None and b["rerank"] is None and c["rerank"] is None
    assert [h["doc_id"] for h in a["results"]] == [h["doc_id"] for h in b["results"]] == [
        h["doc_id"] for h in c["results"]]


@pytest.mark.parametrize("rerank", ["omitted", True, {}])
def test_rerank_omitted_true_or_empty_reranks_with_the_service_defaults(client, settings, rerank):
    payload = {"query": "apples orchards", "top_k": 6}
    if rerank != "omitted":
        payload["rerank"] = rerank
    r = client.post("/search", json=payload)
    assert r.status_code == 200, r.text
    body = r.json()
    info = body["rerank"]
    assert info is not None and info["method"] == settings.rerank_method == "fake"
    assert info["candidates"] == min(settings.default_candidates, len(DOCS))
    assert isinstance(info["truncated"], int)
    first = client.post("/search", json={"query": "apples orchards", "top_k": 6, "rerank": False}).json()
    assert first["rerank"] is None
    assert [h["doc_id"] for h in body["results"]] != [h["doc_id"] for h in first["results"]]


def test_pipeline_runs_off_the_event_loop(client, pipeline):
    client.post("/search", json={"query": "apples", "rerank": {"method": "fake"}})
    calls = pipeline.retrievers["bm25"].calls
    assert calls and not any(c["on_event_loop"] for c in calls)


def test_results_carry_metadata(client):
    body = client.post("/search", json={"query": "red apples orchards", "top_k": 12}).json()
    meta = {h["doc_id"]: h["metadata"] for h in body["results"]}
    assert meta["d01"] == {"year": 2020, "tags": ["fruit"]}
    assert meta["d02"] == {}
    assert all(h["evidence"] is None for h in body["results"])


def test_explain_returns_evidence_of_reranked_hits(client):
    r = client.post("/search", json={"query": "apples orchards", "top_k": 6, "explain": True,
                                     "rerank": {"method": "explain", "candidates": 4}})
    assert r.status_code == 200, r.text
    hits = r.json()["results"]
    docs = {d.doc_id: d for d in DOCS}
    for h in hits[:4]:
        (span,) = h["evidence"]
        text = docs[h["doc_id"]].text
        assert span["field"] == "text" and text[span["start"]:span["end"]] == span["text"] == text.split()[0]
    assert all(h["evidence"] is None for h in hits[4:])  # below the candidates: not reranked


@pytest.mark.parametrize(
    ("payload", "needle"),
    [
        ({"query": "apples", "explain": True, "rerank": False}, "explain needs reranking"),
        ({"query": "apples", "explain": True, "rerank": None}, "explain needs reranking"),
        ({"query": "apples", "explain": True}, "explain is not supported by the 'fake'"),  # omitted: reranks
        ({"query": "apples", "explain": True, "rerank": {"method": "fake"}}, "explain is not supported by the 'fake'"),
        ({"query": "apples", "rerank": {"method": "fake", "heads": "qr"}}, "options of the icr and blockrank rerankers"),
        ({"query": "apples", "rerank": {"method": "fake", "reattn": True}}, "options of the icr and blockrank rerankers"),
        ({"query": "apples", "rerank": {"method": "icr", "heads": "/etc/passwd"}}, "rerank.heads"),
        ({"query": "apples", "rerank": {"method": "icr", "heads": [[1, 2, 3]]}}, "rerank.heads"),
        ({"query": "apples", "rerank": {"method": "icr", "reattn": {"gamma": -1}}}, "gamma"),
        ({"query": "apples", "rerank": {"method": "icr", "reattn": {"beta": 1}}}, "beta"),
    ],
)
def test_rerank_option_errors(client, payload, needle):
    r = client.post("/search", json=payload)
    assert r.status_code == 422, r.text
    assert r.json()["error_type"] == "validation" and needle in r.json()["error"]


def test_heads_and_reattn_reach_the_reranker_options(client, pipeline, monkeypatch):
    from heedrank import registry

    monkeypatch.setitem(registry._RERANKERS, "icr", registry._RERANKERS["fake"])  # a fake standing for icr
    for _ in range(2):
        r = client.post("/search", json={"query": "apples", "rerank": {
            "method": "icr", "heads": [[3, 1], [0, 2]], "reattn": {"idf": False}}})
        assert r.status_code == 200, r.text
    r = client.post("/search", json={"query": "apples", "rerank": {"method": "icr", "heads": "qr"}})
    assert r.status_code == 200, r.text
    built = {name: rr for name, rr in pipeline.loaded_rerankers().items() if name.startswith("icr")}
    assert len(built) == 2  # one per distinct options, reused
    options = sorted((rr.config.given_options for rr in built.values()), key=str)
    assert {"heads": "qr"} in options
    assert {"heads": [[0, 2], [3, 1]], "reattn": {"idf": False, "entropy": True, "gamma": 0.5}} in options


@pytest.mark.parametrize("payload", [{"method": "default"}, {}])
def test_rerank_info_names_the_resolved_method_not_the_alias(client, settings, monkeypatch, payload):
    """``rerank.method`` is the method that ranked, as ``POST /rerank``'s ``meta.method``: an alias
    (``"default"``, asked or the service's setting) is reported as the registered method it names."""
    from heedrank import registry

    monkeypatch.setattr(registry, "_ALIASES", {"default": "fake"})
    monkeypatch.setattr(settings, "rerank_method", "default")
    r = client.post("/search", json={"query": "apples orchards", "top_k": 6, "rerank": payload})
    assert r.status_code == 200, r.text
    assert r.json()["rerank"]["method"] == "fake"

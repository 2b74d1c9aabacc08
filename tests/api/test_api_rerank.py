"""POST /rerank: the Cohere v2 request and response, with the fake reranker (shorter documents
score higher: 1 / len(text))."""

from __future__ import annotations

import threading
import uuid

import pytest
from fastapi.testclient import TestClient

from heedrank.api.app import create_app
from api_fakes import FakeReranker, SlowReranker

DOCS = ["a long document about apples and orchards", "short", "a medium document", "tiny!"]
BY_LENGTH = sorted(range(len(DOCS)), key=lambda i: (len(DOCS[i]), i))  # the fake's order


def _error(r, status: int, error_type: str) -> str:
    assert r.status_code == status, r.text
    assert set(r.json()) == {"error", "error_type"} and r.json()["error_type"] == error_type
    return r.json()["error"]


def test_cohere_v2_shape(client):
    r = client.post("/rerank", json={"model": "fake", "query": "apples", "documents": DOCS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"id", "results", "meta"}
    uuid.UUID(body["id"])
    assert [x["index"] for x in body["results"]] == BY_LENGTH
    assert all(set(x) == {"index", "relevance_score"} for x in body["results"])  # no document unless asked
    scores = [x["relevance_score"] for x in body["results"]]
    assert scores == sorted(scores, reverse=True)
    assert scores[0] == pytest.approx(1 / len(DOCS[BY_LENGTH[0]]))
    meta = body["meta"]
    assert meta["api_version"] == {"version": "2"}
    assert meta["billed_units"] == {"search_units": 1}
    assert meta["tokens"]["input_tokens"] > 0
    assert meta["method"] == "fake" and meta["model"] == "smollm2-135m-instruct/fake"
    assert meta["reranked"] is True and meta["deadline_exceeded"] is False
    assert meta["warnings"] == []
    assert set(meta["timings"]) == {"queue", "rerank", "total"}


def test_top_n_return_documents_and_object_documents(client):
    docs = [{"text": t, "id": f"doc-{i}"} if i % 2 else t for i, t in enumerate(DOCS)]
    r = client.post("/rerank", json={"query": "apples", "documents": docs, "top_n": 2, "return_documents": True})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["index"] for x in results] == BY_LENGTH[:2]
    assert [x["document"] for x in results] == [{"text": DOCS[i]} for i in BY_LENGTH[:2]]


def test_top_n_beyond_documents_returns_all_with_a_warning(client):
    body = client.post("/rerank", json={"query": "apples", "documents": DOCS, "top_n": 10}).json()
    assert len(body["results"]) == len(DOCS)
    assert "top_n 10" in body["meta"]["warnings"][0]


@pytest.mark.parametrize("model", ["fake", "smollm2-135m-instruct", "smollm2-135m-instruct/fake"])
def test_model_names_accepted(client, model):
    assert client.post("/rerank", json={"model": model, "query": "a", "documents": ["x"]}).status_code == 200


@pytest.mark.parametrize(
    ("payload", "needle"),
    [
        ({"model": "rerank-v3.5", "query": "a", "documents": ["x"]}, "not served here"),
        ({"query": "a", "documents": []}, "documents"),
        ({"query": " ", "documents": ["x"]}, "query must not be empty"),
        ({"documents": ["x"]}, "query"),
        ({"query": "a", "documents": [{"title": "no text"}]}, "documents"),
        ({"query": "a", "documents": ["x"], "top_n": 0}, "top_n"),
        ({"query": "a", "documents": ["x"], "max_tokens_per_doc": 0}, "max_tokens_per_doc"),
        ({"query": "a", "documents": ["x"], "deadline_ms": 0}, "deadline_ms"),
        ({"query": "a", "documents": ["x"], "rank_fields": ["title"]}, "rank_fields"),
        ({"query": "a", "documents": ["x"], "colour": "red"}, "colour"),
    ],
)
def test_422(client, payload, needle):
    assert needle in _error(client.post("/rerank", json=payload), 422, "validation")


def test_max_tokens_per_doc_builds_a_reranker_with_that_budget(client, settings, pipeline):
    r = client.post("/rerank", json={"query": "a", "documents": ["x", "y"], "max_tokens_per_doc": 7})
    assert r.status_code == 200, r.text
    built = [rr for name, rr in pipeline.loaded_rerankers().items() if "max_doc_tokens=7" in name]
    assert len(built) == 1 and built[0].config.max_doc_tokens == 7
    r = client.post("/rerank", json={"query": "a", "documents": ["x"], "max_tokens_per_doc": 100_000})
    assert f"clamped to this service's {settings.max_doc_tokens}" in r.json()["meta"]["warnings"][0]


def test_truncated_lists_indices(client):
    docs = ["x" * 80, "short", "y" * 90]  # the fake reports content over 60 characters as truncated
    assert client.post("/rerank", json={"query": "a", "documents": docs}).json()["meta"]["truncated"] == [0, 2]


def test_no_reranker_is_503(settings, pipeline):
    settings = settings.model_copy(update={"rerank_method": "none"})
    with TestClient(create_app(settings, pipeline=pipeline)) as client:
        r = client.post("/rerank", json={"query": "a", "documents": ["x"]})
        assert "no reranker" in _error(r, 503, "model_unavailable")


# -------------------------------------------------------------------- deadline_ms
@pytest.fixture
def slow_client(settings, pipeline):
    settings = settings.model_copy(update={"rerank_method": "slow", "workers": 1, "queue_size": 4})
    with TestClient(create_app(settings, pipeline=pipeline)) as c:
        assert c.app.state.runtime.wait_ready(10)
        yield c


def _fallback(body: dict, n: int) -> None:
    assert body["meta"]["reranked"] is False and body["meta"]["deadline_exceeded"] is True
    assert "deadline_ms" in body["meta"]["warnings"][-1]
    assert [x["index"] for x in body["results"]] == list(range(n))
    assert [x["relevance_score"] for x in body["results"]] == pytest.approx([1 / (1 + i) for i in range(n)])


def test_deadline_passes_answers_in_given_order(slow_client):
    SlowReranker.delay = 0.5
    r = slow_client.post("/rerank", json={"query": "apples", "documents": DOCS, "deadline_ms": 50})
    assert r.status_code == 200, r.text
    _fallback(r.json(), len(DOCS))
    assert 'heedrank_deadline_fallbacks_total{reason="timeout"} 1.0' in slow_client.get("/metrics").text


def test_deadline_estimate_skips_reranking_at_once(slow_client):
    SlowReranker.delay = 0.2
    first = slow_client.post("/rerank", json={"query": "apples", "documents": DOCS}).json()  # teaches the estimate
    assert first["meta"]["reranked"] is True
    started = SlowReranker.started
    r = slow_client.post("/rerank", json={"query": "apples", "documents": DOCS, "deadline_ms": 20, "top_n": 2})
    _fallback(r.json(), 2)
    assert SlowReranker.started == started  # never queued
    assert 'heedrank_deadline_fallbacks_total{reason="estimate"} 1.0' in slow_client.get("/metrics").text


def test_generous_deadline_reranks(slow_client):
    body = slow_client.post("/rerank", json={"query": "apples", "documents": DOCS, "deadline_ms": 20_000}).json()
    assert body["meta"]["reranked"] is True
    assert [x["index"] for x in body["results"]] == BY_LENGTH


def test_full_queue_with_deadline_answers_in_given_order(settings, pipeline):
    SlowReranker.gate = threading.Event()
    settings = settings.model_copy(update={"rerank_method": "slow", "workers": 1, "queue_size": 0})
    with TestClient(create_app(settings, pipeline=pipeline)) as client:
        assert client.app.state.runtime.wait_ready(10)
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(1) as ex:
            busy = ex.submit(client.post, "/rerank", json={"query": "a", "documents": ["x"]})
            pool = client.app.state.runtime.pools["rerank"]
            import time

            while pool.busy < 1:
                time.sleep(0.01)
            r = client.post("/rerank", json={"query": "a", "documents": DOCS, "deadline_ms": 5000})
            _fallback(r.json(), len(DOCS))
            _error(client.post("/rerank", json={"query": "a", "documents": DOCS}), 429, "overloaded")
            SlowReranker.gate.set()
            assert busy.result(timeout=30).status_code == 200
    assert FakeReranker.loads >= 1


def test_long_document_is_cut_to_the_token_budget_and_ranked(client, settings):
    # Cohere's behaviour: a document over max_tokens_per_doc is ranked on its beginning, not refused
    long = ("apples grow in orchards " * 6000)[:125_000]
    assert len(long) == 125_000 and len(long) > settings.max_document_chars
    r = client.post("/rerank", json={"query": "apples", "documents": ["short text", long], "return_documents": True})
    assert r.status_code == 200, r.text
    body = r.json()
    bound = 8 * settings.max_doc_tokens  # CHARS_PER_TOKEN per token of the service's budget (160 -> 1280)
    assert bound == 1280
    scores = {x["index"]: x["relevance_score"] for x in body["results"]}
    assert scores[1] == pytest.approx(1 / bound)  # the fake scores 1/len(text): it read exactly `bound` characters
    assert scores[0] == pytest.approx(1 / len("short text"))
    assert body["meta"]["truncated"] == [1]
    assert body["meta"]["warnings"] == [
        "documents 1 are longer than 1280 characters; each was ranked on its first 160 LM tokens (max_tokens_per_doc)"
    ]
    assert {x["index"]: x["document"]["text"] for x in body["results"]}[1] == long  # returned as given


def test_long_documents_follow_max_tokens_per_doc(client):
    docs = ["x" * 100, "y" * 50, "z" * 81]
    r = client.post("/rerank", json={"query": "q", "documents": docs, "max_tokens_per_doc": 10})
    assert r.status_code == 200, r.text
    meta = r.json()["meta"]
    # bound 8 * 10 = 80 characters: documents 0 and 2 are cut to 80 and then tie on 1/80 (by index)
    assert [(x["index"], x["relevance_score"]) for x in r.json()["results"]] == [
        (1, pytest.approx(1 / 50)), (0, pytest.approx(1 / 80)), (2, pytest.approx(1 / 80))]
    assert meta["truncated"] == [0, 2]
    assert meta["warnings"] == [
        "documents 0, 2 are longer than 80 characters; each was ranked on its first 10 LM tokens (max_tokens_per_doc)"
    ]


def test_body_over_the_byte_limit_is_still_413(settings, pipeline):
    settings = settings.model_copy(update={"max_body_bytes": 100_000})
    with TestClient(create_app(settings, pipeline=pipeline)) as c:
        r = c.post("/rerank", json={"query": "q", "documents": ["w" * 125_000]})
        assert "over the limit of 100000 bytes" in _error(r, 413, "payload_too_large")


def test_fusion_with_the_given_order_is_an_extension_field(client, monkeypatch):
    """``fusion`` fuses the reranker with the given order (score 1 / rank): the method's
    recorded weight by default (none for the fake), a number, or ``"none"``."""
    import math

    from heedrank.fusion import fuse, reciprocal_ranks

    pure = client.post("/rerank", json={"query": "apples", "documents": DOCS}).json()
    assert pure["meta"].get("fusion") is None and [x["index"] for x in pure["results"]] == BY_LENGTH
    fused = client.post("/rerank", json={"query": "apples", "documents": DOCS, "fusion": 0.9}).json()
    want = fuse(reciprocal_ranks(len(DOCS)), [1.0 / len(t) for t in DOCS], 0.9)
    order = sorted(range(len(DOCS)), key=lambda i: (-want[i], f"{i}"))
    assert fused["meta"]["fusion"] == 0.9 and [x["index"] for x in fused["results"]] == order
    assert [x["relevance_score"] for x in fused["results"]] == pytest.approx(
        [1 / (1 + math.exp(-want[i])) for i in order])
    assert fused["meta"]["raw_scores"] == pytest.approx([1.0 / len(DOCS[i]) for i in order])
    # a method that records a weight fuses by default; "none" turns it off
    monkeypatch.setattr(FakeReranker, "default_fusion", 0.9, raising=False)  # the one place a weight is read
    default = client.post("/rerank", json={"query": "apples", "documents": DOCS}).json()
    assert default["meta"]["fusion"] == 0.9 and [x["index"] for x in default["results"]] == order
    off = client.post("/rerank", json={"query": "apples", "documents": DOCS, "fusion": "none"}).json()
    assert off["meta"].get("fusion") is None and [x["index"] for x in off["results"]] == BY_LENGTH
    assert _error(client.post("/rerank", json={"query": "apples", "documents": DOCS, "fusion": 1.5}),
                  422, "validation").startswith("fusion must be")


def test_cutoff_returns_the_documents_above_the_calibrated_probability(client, monkeypatch):
    """``cutoff`` (heedrank extension): only documents whose calibrated probability is at least
    the threshold ("auto": the map's), each result with its ``probability``; a reranker without
    a calibration, or a fusion weight it was not fitted at, is a 422."""
    import math

    from heedrank.calibration import Calibration, PlattMap
    from heedrank.fusion import fuse, reciprocal_ranks

    body = {"query": "apples", "documents": DOCS}
    assert "probability" not in client.post("/rerank", json=body).json()["results"][0]  # the fake has no calibration
    assert "no calibrated scores" in _error(client.post("/rerank", json={**body, "cutoff": "auto"}), 422, "validation")
    assert _error(client.post("/rerank", json={**body, "cutoff": 3}), 422, "validation").startswith("cutoff must be")
    plat = PlattMap((2.0, 0.0, 0.0, 0.0), 0.0, 0.5)
    monkeypatch.setattr(FakeReranker, "calibration", Calibration(0.9, {"rank": plat}), raising=False)
    full = client.post("/rerank", json={**body, "fusion": 0.9}).json()
    want = fuse(reciprocal_ranks(len(DOCS)), [1.0 / len(t) for t in DOCS], 0.9)
    order = sorted(range(len(DOCS)), key=lambda i: (-want[i], f"{i}"))
    probs = [1 / (1 + math.exp(-2.0 * want[i])) for i in order]
    assert [x["probability"] for x in full["results"]] == pytest.approx(probs) and "cutoff" not in full["meta"]
    cut = client.post("/rerank", json={**body, "fusion": 0.9, "cutoff": "auto"}).json()
    assert cut["meta"]["cutoff"] == 0.5
    assert [x["index"] for x in cut["results"]] == [i for i, p in zip(order, probs) if p >= 0.5]
    assert 0 < len(cut["results"]) < len(DOCS)
    assert not any("extrapolate" in w for w in cut["meta"].get("warnings") or [])
    # fewer documents than the map was fitted at: the answer says its probabilities extrapolate
    monkeypatch.setattr(FakeReranker, "calibration", Calibration(0.9, {"rank": PlattMap(
        plat.coef, plat.intercept, plat.threshold, (len(DOCS) + 1, 50))}), raising=False)
    few = client.post("/rerank", json={**body, "fusion": 0.9, "cutoff": "auto"}).json()
    assert [x["index"] for x in few["results"]] == [x["index"] for x in cut["results"]]
    assert any(f"with {len(DOCS)} its probabilities extrapolate" in w for w in few["meta"]["warnings"])
    assert "got fusion none" in _error(client.post("/rerank", json={**body, "fusion": "none", "cutoff": 0.2}),
                                       422, "validation")


def test_search_and_rerank_serve_one_list_with_the_same_probabilities(client, monkeypatch):
    """One serving policy (:class:`heedrank.serving.ServePolicy`): the same candidates sent
    through /search (from its first stage) and through /rerank (as a list, in the first stage's
    order) get the same calibrated probability each, by the same map and the same function."""
    from api_fakes import DOCS as INDEXED
    from api_fakes import OverlapRetriever

    from heedrank.calibration import Calibration, PlattMap
    from heedrank.types import Query

    plat = PlattMap((1.5, -0.3, 0.2, 0.1), -0.4, 0.5)
    monkeypatch.setattr(FakeReranker, "calibration", Calibration(0.9, {"none": plat}), raising=False)
    query = "apples fruit"
    search = client.post("/search", json={"query": query, "top_k": 8, "retriever": "bm25",
                                          "rerank": {"method": "fake", "candidates": 8, "fusion": "none"}})
    assert search.status_code == 200, search.text
    probs_search = {h["doc_id"]: h["probability"] for h in search.json()["results"]}
    assert len(probs_search) == 8 and all(0.0 < p < 1.0 for p in probs_search.values())
    order = list(OverlapRetriever(INDEXED).retrieve([Query("q", query)], 8)[0].doc_ids)
    assert set(order) == set(probs_search)
    texts = {d.doc_id: d.content for d in INDEXED}
    rerank = client.post("/rerank", json={"query": query, "documents": [texts[d] for d in order], "fusion": "none"})
    assert rerank.status_code == 200, rerank.text
    probs_rerank = {order[r["index"]]: r["probability"] for r in rerank.json()["results"]}
    assert probs_rerank == pytest.approx(probs_search, abs=1e-12)
    assert len(set(round(p, 9) for p in probs_rerank.values())) > 1  # the map separates the documents

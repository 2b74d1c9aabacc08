"""The running service (lifespan): background model loading, auth, size limits, the bounded
inference queue (429), /info, /metrics and collections."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from fastapi.testclient import TestClient

from heedrank.api.app import create_app
from api_fakes import DOCS, BlockingLoadReranker, OverlapRetriever, SlowReranker, make_pipeline
from heedrank.types import Document


def _error(r, status: int, error_type: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert {"error", "error_type"} <= set(body)
    assert body["error_type"] == error_type
    assert isinstance(body["error"], str) and body["error"]
    return body["error"]


def _wait(predicate, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "condition not reached in time"
        time.sleep(0.01)


# -------------------------------------------------------------------- loading / health
def test_loading_then_ok(settings, pipeline):
    BlockingLoadReranker.gate = threading.Event()
    settings = settings.model_copy(update={"rerank_method": "blockload"})
    with TestClient(create_app(settings, pipeline=pipeline)) as client:
        r = client.get("/health")
        assert r.status_code == 503 and r.json()["status"] == "loading"
        assert r.json()["error_type"] == "unhealthy" and r.headers["retry-after"]
        assert "loading" in _error(client.post("/search", json={"query": "apples"}), 503, "unhealthy")
        _error(client.post("/rerank", json={"query": "apples", "documents": ["a"]}), 503, "unhealthy")
        assert client.get("/info").json()["status"] == "loading"  # info and metrics answer while loading
        assert "heedrank_ready 0.0" in client.get("/metrics").text
        BlockingLoadReranker.gate.set()
        assert client.app.state.runtime.wait_ready(10)
        assert client.get("/health").json() == {"status": "ok"}
        assert client.post("/search", json={"query": "apples"}).status_code == 200
        assert "heedrank_ready 1.0" in client.get("/metrics").text


def test_failed_load_is_unhealthy(settings, pipeline):
    from heedrank.errors import ModelLoadError

    BlockingLoadReranker.fail = ModelLoadError("weights missing")
    settings = settings.model_copy(update={"rerank_method": "blockload"})
    with TestClient(create_app(settings, pipeline=pipeline)) as client:
        assert client.app.state.runtime.wait_ready(10)
        r = client.get("/health")
        assert r.status_code == 503 and r.json()["status"] == "failed" and "weights missing" in r.json()["error"]
        assert "weights missing" in _error(client.post("/search", json={"query": "apples"}), 503, "unhealthy")


# -------------------------------------------------------------------- auth
@pytest.fixture
def auth_client(settings, pipeline):
    from pydantic import SecretStr

    settings = settings.model_copy(update={"api_key": SecretStr("s3cret")})
    with TestClient(create_app(settings, pipeline=pipeline)) as c:
        assert c.app.state.runtime.wait_ready(10)
        yield c


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [("POST", "/search", {"query": "apples"}), ("POST", "/rerank", {"query": "a", "documents": ["x"]}),
     ("GET", "/info", None), ("GET", "/metrics", None), ("GET", "/openapi.json", None), ("GET", "/nope", None)],
)
def test_auth_required_everywhere_but_health(auth_client, method, path, body):
    assert "missing API key" in _error(auth_client.request(method, path, json=body), 401, "unauthorized")
    r = auth_client.request(method, path, json=body, headers={"Authorization": "Bearer wrong"})
    assert "invalid API key" in _error(r, 401, "unauthorized")
    assert r.headers["www-authenticate"] == "Bearer"
    r = auth_client.request(method, path, json=body, headers={"Authorization": "Basic s3cret"})
    _error(r, 401, "unauthorized")
    ok = auth_client.request(method, path, json=body, headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == (404 if path == "/nope" else 200), ok.text


def test_health_needs_no_key(auth_client):
    assert auth_client.get("/health").json() == {"status": "ok"}


def test_auth_off_needs_no_header(client):
    assert client.post("/search", json={"query": "apples"}).status_code == 200
    assert client.get("/info").json()["auth"] is False


# -------------------------------------------------------------------- limits (413)
def test_413_body_bytes(settings, pipeline):
    settings = settings.model_copy(update={"max_body_bytes": 2048})
    with TestClient(create_app(settings, pipeline=pipeline)) as client:
        big = {"query": "apples", "documents": ["word " * 100] * 10}
        assert "2048 bytes" in _error(client.post("/rerank", json=big), 413, "payload_too_large")

        def chunks():  # no Content-Length: the streamed body is counted
            yield b'{"query": "apples", "documents": ['
            for _ in range(20):
                yield b'"' + b"x" * 200 + b'",'
            yield b'"y"]}'

        r = client.post("/rerank", content=chunks(), headers={"content-type": "application/json"})
        _error(r, 413, "payload_too_large")
        assert client.post("/search", json={"query": "apples"}).status_code == 200


def test_413_documents(client, settings):
    n = settings.max_documents + 1
    msg = _error(client.post("/rerank", json={"query": "a", "documents": ["x"] * n}), 413, "payload_too_large")
    assert str(settings.max_documents) in msg
    # a document over max_document_chars is cut and ranked, not refused (test_api_rerank.py)
    docs = ["ok", "y" * (settings.max_document_chars + 1)]
    assert client.post("/rerank", json={"query": "a", "documents": docs}).status_code == 200


# -------------------------------------------------------------------- queue (429)
def test_full_queue_answers_429_quickly_and_admitted_requests_complete(settings, pipeline):
    SlowReranker.gate = threading.Event()
    settings = settings.model_copy(update={"rerank_method": "slow", "workers": 1, "queue_size": 2})
    with TestClient(create_app(settings, pipeline=pipeline)) as client:
        assert client.app.state.runtime.wait_ready(10)
        pool = client.app.state.runtime.pools["rerank"]
        body = {"query": "apples", "rerank": {"method": "slow"}}
        with ThreadPoolExecutor(3) as ex:
            admitted = [ex.submit(client.post, "/search", json=body) for _ in range(3)]
            _wait(lambda: pool.busy == 1 and pool.depth == 2)  # 1 running + 2 waiting = capacity
            t0 = time.perf_counter()
            r = client.post("/search", json=body)
            assert time.perf_counter() - t0 < 2.0
            assert "queue is full" in _error(r, 429, "overloaded")
            assert int(r.headers["retry-after"]) >= 1
            _error(client.post("/rerank", json={"query": "a", "documents": ["x"]}), 429, "overloaded")
            # first-stage-only searches ("rerank": false) use their own pool and still answer
            assert client.post("/search", json={"query": "apples", "rerank": False}).status_code == 200
            # a search without "rerank" reranks (the service's method): it waits in the full rerank pool
            _error(client.post("/search", json={"query": "apples"}), 429, "overloaded")
            SlowReranker.gate.set()
            assert [f.result(timeout=30).status_code for f in admitted] == [200, 200, 200]
        metrics = client.get("/metrics").text
        assert 'heedrank_requests_total{method="POST",route="/search",status="429"} 2.0' in metrics
        assert 'heedrank_rejected_total{pool="rerank",reason="overloaded"} 3.0' in metrics


def test_many_concurrent_clients_get_200_or_429_never_5xx(settings, pipeline):
    SlowReranker.delay = 0.02
    settings = settings.model_copy(update={"rerank_method": "slow", "workers": 1, "queue_size": 3})
    with TestClient(create_app(settings, pipeline=pipeline)) as client:
        assert client.app.state.runtime.wait_ready(10)
        body = {"query": "apples", "rerank": {"method": "slow"}}
        with ThreadPoolExecutor(16) as ex:
            codes = list(ex.map(lambda _: client.post("/search", json=body).status_code, range(48)))
    assert set(codes) <= {200, 429}
    assert 200 in codes


# -------------------------------------------------------------------- /info, /metrics
def test_info(client, settings):
    body = client.get("/info").json()
    assert body["status"] == "ok"
    assert body["reranker"]["method"] == "fake"
    assert body["reranker"]["model"] == {"method": "fake", "model": "none"}  # the loaded reranker's describe()
    assert "fake" in body["reranker"]["model_ids"] and "smollm2-135m-instruct/fake" in body["reranker"]["model_ids"]
    assert body["default_collection"] == "default"
    assert body["collections"]["default"]["num_docs"] == len(DOCS)
    assert body["collections"]["default"]["retrievers"] == ["bm25"]
    assert body["limits"]["max_top_k"] == settings.max_top_k
    assert body["limits"]["queue_size"] == settings.queue_size


def test_metrics(client):
    client.post("/search", json={"query": "apples", "rerank": False})  # the first stage alone: the search pool
    client.post("/search", json={"query": "apples", "rerank": {"method": "fake"}})
    client.post("/search", json={"query": ""})
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    assert 'heedrank_requests_total{method="POST",route="/search",status="200"} 2.0' in text
    assert 'heedrank_requests_total{method="POST",route="/search",status="422"} 1.0' in text
    assert 'heedrank_request_duration_seconds_count{route="/search"} 3.0' in text
    for stage in ("retrieve", "hydrate", "rerank"):
        assert f'heedrank_stage_duration_seconds_count{{stage="{stage}"}}' in text
    assert 'heedrank_queue_depth{pool="rerank"} 0.0' in text
    assert 'heedrank_job_seconds_count{pool="search"} 1.0' in text


# -------------------------------------------------------------------- collections
def test_collections(settings, fake_reranker):
    other_docs = [Document("x1", "Zebras are striped.", "Zebras"), Document("x2", "Apples again.", "Apples")]
    default = make_pipeline()
    other = make_pipeline(OverlapRetriever(other_docs))
    from heedrank.index.memory import InMemoryDocStore

    other.docstore = InMemoryDocStore(other_docs)
    with TestClient(create_app(settings, pipeline=default, collections={"zoo": other})) as client:
        assert client.app.state.runtime.wait_ready(10)
        r = client.post("/search", json={"query": "zebras", "collection": "zoo", "top_k": 2, "rerank": False})
        assert r.status_code == 200, r.text
        assert [h["doc_id"] for h in r.json()["results"]] == ["x1", "x2"]
        r = client.post("/search", json={"query": "zebras", "collection": "zoo", "top_k": 2})  # reranked by default
        assert r.status_code == 200, r.text
        assert [h["doc_id"] for h in r.json()["results"]] == ["x2", "x1"]  # the fake: shorter first
        assert r.json()["rerank"]["method"] == "fake" and r.json()["rerank"]["candidates"] == 2
        r = client.post("/search", json={"query": "zebras", "top_k": 2})
        assert {h["doc_id"] for h in r.json()["results"]} <= {d.doc_id for d in DOCS}
        msg = _error(client.post("/search", json={"query": "a", "collection": "nope"}), 404, "not_found")
        assert "zoo" in msg and "default" in msg
        info = client.get("/info").json()
        assert info["collections"]["zoo"]["num_docs"] == 2


def test_collection_named_like_the_default_is_refused(settings):
    settings = settings.model_copy(update={"collections": {"default": "elsewhere"}})
    with pytest.raises(ValueError, match="default collection"):
        create_app(settings)


def test_warmup_seeds_the_wait_estimate(settings, pipeline):
    settings = settings.model_copy(update={"warmup": True})
    with TestClient(create_app(settings, pipeline=pipeline)) as client:
        runtime = client.app.state.runtime
        assert runtime.wait_ready(10)
        assert runtime.pools["rerank"].seconds_per_unit is not None
        assert runtime.pools["search"].seconds_per_unit is None


def test_a_waiting_job_of_a_client_that_went_away_is_dropped():
    import asyncio

    from heedrank.api.inference import InferencePool

    async def main():
        pool = InferencePool("t", workers=1, queue_size=4).start()
        pool.disconnect_poll = 0.01
        gate, ran = threading.Event(), []
        try:
            blocker = pool.submit(gate.wait, 10)

            async def gone():
                return True

            with pytest.raises(asyncio.CancelledError):
                await pool.run(ran.append, "x", is_disconnected=gone)
            gate.set()
            await blocker
            await pool.run(ran.append, "y")
            assert ran == ["y"]
        finally:
            pool.close()

    asyncio.run(main())

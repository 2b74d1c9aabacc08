"""One error body, {error, error_type}, for every failure."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
from fastapi.testclient import TestClient

from heedrank.api.app import create_app
from heedrank.errors import ModelLoadError, NotFoundError

from api_fakes import DOCS, OverlapRetriever, make_pipeline


def _error(r, status: int, error_type: str) -> str:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error", "error_type"}
    assert body["error_type"] == error_type
    assert isinstance(body["error"], str) and body["error"]
    return body["error"]


@pytest.mark.parametrize(
    ("payload", "needle"),
    [
        ({"query": ""}, "query"),
        ({"query": "   \n\t"}, "query must not be empty"),
        ({}, "query"),
        ({"query": "apples", "top_k": 0}, "top_k"),
        ({"query": "apples", "top_k": -3}, "top_k"),
        ({"query": "apples", "top_k": 21}, "top_k must be between 1 and 20"),
        ({"query": "apples", "top_k": "ten"}, "top_k"),
        ({"query": "apples", "retriever": "nope"}, "unknown retriever 'nope'"),
        ({"query": "apples", "rerank": {"method": "nope"}}, "unknown rerank method 'nope'"),
        ({"query": "apples", "rerank": {"method": "fake", "candidates": 0}}, "rerank.candidates"),
        ({"query": "apples", "rerank": {"method": "fake", "candidates": 9}}, "candidates must be between 1 and 8"),
        ({"query": "apples", "colour": "red"}, "colour"),
        ({"query": "x" * 5000}, "query"),
    ],
)
def test_422_validation(client, payload, needle):
    message = _error(client.post("/search", json=payload), 422, "validation")
    assert needle in message


def test_unknown_names_list_the_valid_ones(client):
    msg = _error(client.post("/search", json={"query": "a", "retriever": "nope"}), 422, "validation")
    assert "bm25" in msg
    msg = _error(client.post("/search", json={"query": "a", "rerank": {"method": "nope"}}), 422, "validation")
    assert "fake" in msg and "none" in msg


def test_422_invalid_json(client):
    r = client.post("/search", content=b"{not json", headers={"content-type": "application/json"})
    assert "not valid JSON" in _error(r, 422, "validation")


def test_422_missing_body(client):
    _error(client.post("/search"), 422, "validation")


def test_404_unknown_route(client):
    assert "/nope" in _error(client.get("/nope"), 404, "not_found")


def test_405_wrong_method(client):
    _error(client.get("/search"), 405, "method_not_allowed")


@contextmanager
def _client(settings, pipeline):
    """A client of an app whose background load has finished (a loaded machine can take longer
    than the first request: that request would get 503 unhealthy)."""
    with TestClient(create_app(settings, pipeline=pipeline), raise_server_exceptions=False) as client:
        assert client.app.state.runtime.wait_ready(10)
        yield client


def test_heedrank_error_keeps_its_status(settings, fake_reranker):
    pipe = make_pipeline(OverlapRetriever(DOCS, fail=NotFoundError("collection 'x' does not exist")))
    with _client(settings, pipe) as client:
        assert "collection" in _error(client.post("/search", json={"query": "apples"}), 404, "not_found")


def test_model_load_error_is_503(settings, fake_reranker):
    def factory(method):
        raise ModelLoadError("model files missing; pass --model")

    settings = settings.model_copy(update={"preload": False})
    with _client(settings, make_pipeline(factory=factory)) as client:
        r = client.post("/search", json={"query": "apples", "rerank": {"method": "fake"}})
        assert "model files missing" in _error(r, 503, "model_unavailable")


def test_unexpected_error_is_500_internal(settings, fake_reranker, caplog):
    pipe = make_pipeline(OverlapRetriever(DOCS, fail=RuntimeError("boom")))
    with _client(settings, pipe) as client:
        with caplog.at_level("ERROR", logger="heedrank.api.app"):
            msg = _error(client.post("/search", json={"query": "apples"}), 500, "internal")
    assert "RuntimeError" in msg and "boom" not in msg  # no internals leak to the client
    assert any("unhandled error" in rec.message for rec in caplog.records)

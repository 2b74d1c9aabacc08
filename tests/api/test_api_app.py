"""App factory and lifespan: health, preload, state, start-up failure."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from heedrank.api.app import create_app
from heedrank.settings import Settings

from api_fakes import FakeReranker


def test_health(client):
    r = client.get("/health")
    assert r.status_code == 200
    assert r.json() == {"status": "ok"}


def test_lifespan_preloads_reranker_and_sets_state(settings, pipeline):
    app = create_app(settings, pipeline=pipeline)
    assert FakeReranker.loads == 0
    with TestClient(app):
        assert app.state.runtime.wait_ready(10)  # the model loads in the background
        assert app.state.pipeline is pipeline
        assert app.state.settings is settings
        assert set(pipeline.loaded_rerankers()) == {"fake"}
        assert pipeline.loaded_rerankers()["fake"].model_loaded  # load() was called
        assert FakeReranker.loads == 1
    assert app.state.pipeline is None


def test_no_preload_loads_on_first_request(settings, pipeline):
    settings = settings.model_copy(update={"preload": False})
    with TestClient(create_app(settings, pipeline=pipeline)) as client:
        assert pipeline.loaded_rerankers() == {}
        r = client.post("/search", json={"query": "apples", "rerank": {"method": "fake"}})
        assert r.status_code == 200
        assert set(pipeline.loaded_rerankers()) == {"fake"}
        client.post("/search", json={"query": "pears", "rerank": {"method": "fake"}})
        assert FakeReranker.loads == 1  # loaded once, then cached


def test_startup_fails_on_missing_index(tmp_path):
    from heedrank.errors import NotFoundError

    app = create_app(Settings(index=str(tmp_path / "no-such-index"), preload=False))
    with pytest.raises(NotFoundError):
        with TestClient(app):
            pass


def test_openapi_lists_routes(client):
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/search", "/rerank", "/health", "/info", "/metrics"} <= set(paths)

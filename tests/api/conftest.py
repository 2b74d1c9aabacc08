"""Fixtures of the API tests: an injected in-memory pipeline with a registered fake reranker."""

from __future__ import annotations

import pytest

from api_fakes import (
    BatchedReranker,
    BlockingLoadReranker,
    ExplainingReranker,
    FakeReranker,
    SlowReranker,
    make_pipeline,
)
from heedrank import registry
from heedrank.pipeline import Pipeline
from heedrank.settings import Settings


@pytest.fixture
def fake_reranker(monkeypatch):
    """Registers :class:`FakeReranker` as ``"fake"`` for one test."""
    monkeypatch.setitem(registry._RERANKERS, "fake", FakeReranker)
    monkeypatch.setitem(registry._RERANKERS, "slow", SlowReranker)
    monkeypatch.setitem(registry._RERANKERS, "blockload", BlockingLoadReranker)
    monkeypatch.setitem(registry._RERANKERS, "explain", ExplainingReranker)
    monkeypatch.setitem(registry._RERANKERS, "batched", BatchedReranker)
    BatchedReranker.calls, BatchedReranker.batches = 0, 0
    BatchedReranker.batch_size, BatchedReranker.batch_seconds = 10, 0.4
    FakeReranker.loads = 0
    SlowReranker.gate, SlowReranker.delay, SlowReranker.started = None, 0.0, 0
    BlockingLoadReranker.gate, BlockingLoadReranker.fail = None, None
    return FakeReranker


@pytest.fixture
def settings() -> Settings:
    return Settings(
        index="unused", rerank_method="fake", preload=True, max_top_k=20, max_candidates=8, default_candidates=4,
        warmup=False,
    )


@pytest.fixture
def pipeline(fake_reranker) -> Pipeline:
    return make_pipeline()


@pytest.fixture
def client(settings, pipeline):
    from fastapi.testclient import TestClient

    from heedrank.api.app import create_app

    with TestClient(create_app(settings, pipeline=pipeline)) as c:
        assert c.app.state.runtime.wait_ready(10)  # the fake reranker "loads" in the background
        yield c

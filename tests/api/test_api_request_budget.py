"""The per-request budget (``HEEDRANK_REQUEST_BUDGET_S``): a reranking request that runs past it
is stopped at its next batch and answered in the first stage's order, saying so, so the next
request does not wait for it (fakes: :class:`api_fakes.BatchedReranker`, no LM)."""

from __future__ import annotations

import threading
import time

from api_fakes import BatchedReranker

from heedrank.api.app import create_app
from heedrank.settings import Settings


def _client(settings: Settings, pipeline, **update):
    from fastapi.testclient import TestClient

    return TestClient(create_app(settings.model_copy(update={"rerank_method": "batched", "workers": 1, **update}),
                                 pipeline=pipeline))


def test_a_search_past_the_budget_answers_in_first_stage_order_and_frees_the_worker(settings, pipeline):
    BatchedReranker.batch_size, BatchedReranker.batch_seconds = 1, 0.3  # 8 candidates: 2.4 s unbudgeted
    with _client(settings, pipeline, request_budget_s=0.5) as c:
        assert c.app.state.runtime.wait_ready(10)
        plain = c.post("/search", json={"query": "apples orchards", "top_k": 8, "rerank": False}).json()
        t0 = time.perf_counter()
        r = c.post("/search", json={"query": "apples orchards", "top_k": 8, "rerank": {"candidates": 8}})
        took = time.perf_counter() - t0
        assert r.status_code == 200, r.text
        body = r.json()
        assert took < 1.5, f"the budgeted search took {took:.2f} s"
        assert [h["doc_id"] for h in body["results"]] == [h["doc_id"] for h in plain["results"]]
        rr = body["rerank"]
        assert rr["method"] == "batched" and rr["reranked"] == 0 and rr["candidates"] == 8
        assert "per-request budget is 0.5 s" in rr["warnings"][0] and "first-stage place" in rr["warnings"][0]
        assert 'heedrank_deadline_fallbacks_total{reason="budget"} 1.0' in c.get("/metrics").text
        stopped_at = BatchedReranker.batches
        assert stopped_at < 8  # stopped at its next batch, not run to the end
        BatchedReranker.batch_seconds = 0.01  # an ordinary search right after: the worker is free
        t0 = time.perf_counter()
        ok = c.post("/search", json={"query": "apples", "top_k": 4, "rerank": {"candidates": 4}})
        assert ok.status_code == 200 and ok.json()["rerank"]["reranked"] == 4
        assert time.perf_counter() - t0 < 1.0


def test_an_ordinary_search_during_a_long_one_waits_at_most_the_budget(settings, pipeline):
    BatchedReranker.batch_size, BatchedReranker.batch_seconds = 1, 0.4  # 8 candidates: 3.2 s unbudgeted
    with _client(settings, pipeline, request_budget_s=0.8) as c:
        assert c.app.state.runtime.wait_ready(10)
        long = {}

        def slow() -> None:
            long["r"] = c.post("/search", json={"query": "apples", "top_k": 8, "rerank": {"candidates": 8}})

        thread = threading.Thread(target=slow)
        thread.start()
        time.sleep(0.2)
        t0 = time.perf_counter()
        r = c.post("/search", json={"query": "pears", "top_k": 4, "rerank": False})  # first stage: its own pool
        assert r.status_code == 200 and time.perf_counter() - t0 < 0.5
        thread.join(10)
        assert long["r"].status_code == 200 and long["r"].json()["rerank"]["reranked"] == 0


def test_rerank_past_the_budget_says_which_limit_stopped_it(settings, pipeline):
    BatchedReranker.batch_size, BatchedReranker.batch_seconds = 1, 0.3
    docs = [f"document {i} about apples" for i in range(8)]
    with _client(settings, pipeline, request_budget_s=0.5) as c:
        assert c.app.state.runtime.wait_ready(10)
        body = c.post("/rerank", json={"query": "apples", "documents": docs}).json()
        meta = body["meta"]
        assert meta["reranked"] is False and meta["deadline_exceeded"] is True
        assert [x["index"] for x in body["results"]] == list(range(8))
        assert "per-request budget of 0.5 s (HEEDRANK_REQUEST_BUDGET_S)" in meta["warnings"][-1]
        assert 'heedrank_deadline_fallbacks_total{reason="budget"} 1.0' in c.get("/metrics").text
        # a smaller deadline_ms is the request's own limit, named as such
        body = c.post("/rerank", json={"query": "apples", "documents": docs, "deadline_ms": 300}).json()
        assert "deadline_ms 300 would be exceeded" in body["meta"]["warnings"][-1]


def test_no_budget_lets_a_long_reranking_finish(settings, pipeline):
    BatchedReranker.batch_size, BatchedReranker.batch_seconds = 4, 0.3
    with _client(settings, pipeline, request_budget_s=None) as c:
        assert c.app.state.runtime.wait_ready(10)
        rr = c.post("/search", json={"query": "apples", "top_k": 8, "rerank": {"candidates": 8}}).json()["rerank"]
        assert rr["reranked"] == 8 and not rr["warnings"]


def test_the_budget_setting_reads_null_as_none(monkeypatch):
    monkeypatch.setenv("HEEDRANK_REQUEST_BUDGET_S", "null")
    assert Settings().request_budget_s is None
    monkeypatch.setenv("HEEDRANK_REQUEST_BUDGET_S", "2.5")
    assert Settings().request_budget_s == 2.5
    monkeypatch.setenv("HEEDRANK_MAX_QUERY_TOKENS", "64")
    assert Settings(rerank_method="icr").pipeline_config().reranker.options.max_query_tokens == 64


def test_a_search_the_budget_cannot_hold_is_refused_up_front_and_the_limit_heals(settings, pipeline):
    """A method stopped by the budget at 8 candidates costs at least budget / 8 per candidate: the
    same request again gets a 422 at once that names the most candidates that fit
    (:class:`heedrank.api.costs.MethodCosts`), instead of reranking nothing after the whole budget;
    fewer candidates are served, and as they complete fast the limit rises again."""
    BatchedReranker.batch_size, BatchedReranker.batch_seconds = 1, 0.3
    ask = {"query": "apples orchards", "top_k": 8, "rerank": {"candidates": 8}}
    with _client(settings, pipeline, request_budget_s=0.5) as c:
        assert c.app.state.runtime.wait_ready(10)
        costs = c.app.state.runtime.costs
        assert c.post("/search", json=ask).json()["rerank"]["reranked"] == 0  # stopped by the budget
        assert costs.seconds_per_candidate("batched") == 0.5 / 8 and costs.max_candidates("batched", 0.5) == 7
        t0 = time.perf_counter()
        r = c.post("/search", json=ask)
        assert r.status_code == 422 and time.perf_counter() - t0 < 0.3, r.text
        assert r.json()["error_type"] == "validation"
        assert "reranks about 7 candidates within this service's per-request budget of 0.5 s" in r.json()["error"]
        BatchedReranker.batch_seconds = 0.001  # the method is fast now: smaller requests teach it
        for _ in range(12):
            ok = c.post("/search", json={"query": "apples", "top_k": 4, "rerank": {"candidates": 4}})
            assert ok.status_code == 200 and ok.json()["rerank"]["reranked"] == 4
        assert costs.max_candidates("batched", 0.5) >= 8
        assert c.post("/search", json=ask).json()["rerank"]["reranked"] == 8

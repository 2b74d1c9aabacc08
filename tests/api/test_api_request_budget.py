"""The per-request budget (``HEEDRANK_REQUEST_BUDGET_S``), one end per request from its arrival,
its wait for a worker included (:mod:`heedrank.api.deadline`): a reranking request that runs past
it is stopped at its next batch and answered in the first stage's order, saying so, so the next
request does not wait for it; one still queued, or that cannot end in time, is answered by the same
path, and every answer leaves within the budget + ``GRACE_S`` (fakes:
:class:`api_fakes.BatchedReranker`, :class:`api_fakes.SlowReranker`, no LM)."""

from __future__ import annotations

import threading
import time

from api_fakes import BatchedReranker, SlowReranker

from heedrank.api.app import create_app
from heedrank.api.deadline import ANSWER_WITHIN_S as GRACE_S
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
    """A method stopped by the budget at 8 candidates after it ran s seconds costs at least s / 8
    per candidate (its wait for a worker not counted): the same request again gets a 422 at once
    that names the most candidates that fit (:class:`heedrank.api.costs.MethodCosts`), instead of
    reranking nothing after the whole budget; fewer candidates are served, and as they complete
    fast the limit rises again."""
    BatchedReranker.batch_size, BatchedReranker.batch_seconds = 1, 0.3  # 8 candidates: 2.4 s unbudgeted
    ask = {"query": "apples orchards", "top_k": 8, "rerank": {"candidates": 8}}
    with _client(settings, pipeline, request_budget_s=1.0) as c:
        assert c.app.state.runtime.wait_ready(10)
        costs = c.app.state.runtime.costs
        assert c.post("/search", json=ask).json()["rerank"]["reranked"] == 0  # stopped by the budget
        # it ran the budget less the few ms from its arrival to a worker (over 0.9 s: under 8 fit 0.9 of 1 s)
        assert 0.9 / 8 < costs.seconds_per_candidate("batched") <= 1.0 / 8
        assert costs.max_candidates("batched", 1.0) == 7
        t0 = time.perf_counter()
        r = c.post("/search", json=ask)
        assert r.status_code == 422 and time.perf_counter() - t0 < 0.3, r.text
        assert r.json()["error_type"] == "validation"
        assert "reranks about 7 candidates within this service's per-request budget of 1 s" in r.json()["error"]
        # the fields it names: /info's entry of the method, and the request's own
        assert "GET /info: reranker.limits.batched.max_candidates_in_budget.warm" in r.json()["error"]
        assert "ask for at most 7 (rerank.candidates)" in r.json()["error"]
        BatchedReranker.batch_seconds = 0.001  # the method is fast now: smaller requests teach it
        for _ in range(12):
            ok = c.post("/search", json={"query": "apples", "top_k": 4, "rerank": {"candidates": 4}})
            assert ok.status_code == 200 and ok.json()["rerank"]["reranked"] == 4
        assert costs.max_candidates("batched", 1.0) >= 8
        assert c.post("/search", json=ask).json()["rerank"]["reranked"] == 8


DOCS8 = [f"document {i} about apples" for i in range(8)]


def _wait_until(condition, seconds: float = 10.0) -> None:
    end = time.perf_counter() + seconds
    while not condition():
        assert time.perf_counter() < end, "the condition never held"
        time.sleep(0.01)


def _ask(route: str, name: str) -> dict:
    if route == "/search":
        return {"query": f"apples {name}", "top_k": 4, "rerank": {"candidates": 4}}
    return {"query": f"apples {name}", "documents": DOCS8[:4]}


def _budget_warning(route: str, body: dict) -> str:
    if route == "/search":
        assert body["rerank"]["reranked"] == 0
        return body["rerank"]["warnings"][-1]
    assert body["meta"]["reranked"] is False and body["meta"]["deadline_exceeded"] is True
    return body["meta"]["warnings"][-1]


def test_requests_queued_behind_busy_workers_answer_within_the_budget_unrun(settings, pipeline, monkeypatch):
    """Two workers held by rerankings that cannot stop (slow fakes waiting on a gate, two passes at
    once as cached BlockRank runs), then three more requests: each of the five, /search and
    /rerank alike, is answered by the budget's path within the budget + GRACE_S of being sent, not
    after a wait for a worker plus the budget; the queued ones never start, and once the workers
    are free the next request is reranked."""
    budget = 1.5
    monkeypatch.setattr(SlowReranker, "concurrent_calls", 2, raising=False)
    SlowReranker.gate = threading.Event()
    try:
        with _client(settings, pipeline, rerank_method="slow", workers=2, request_budget_s=budget) as c:
            assert c.app.state.runtime.wait_ready(10)
            pool = c.app.state.runtime.pools["rerank"]
            answers: dict[str, tuple[str, object, float]] = {}

            def send(name: str, route: str) -> None:
                t0 = time.perf_counter()
                r = c.post(route, json=_ask(route, name))
                answers[name] = (route, r, time.perf_counter() - t0)

            busy = [threading.Thread(target=send, args=(f"busy{i}", route))
                    for i, route in enumerate(["/search", "/rerank"])]
            for t in busy:
                t.start()
            _wait_until(lambda: SlowReranker.started == 2 and pool.busy == 2)
            queued = [threading.Thread(target=send, args=(f"queued{i}", route))
                      for i, route in enumerate(["/rerank", "/search", "/rerank"])]
            for t in queued:
                t.start()
            for t in busy + queued:
                t.join(10)
            assert sorted(answers) == ["busy0", "busy1", "queued0", "queued1", "queued2"]
            for name, (route, r, took) in answers.items():
                assert r.status_code == 200, (name, r.text)
                assert took < budget + GRACE_S, f"{name} ({route}) answered after {took:.2f} s"
                warning = _budget_warning(route, r.json())
                assert "per-request budget" in warning and "1.5 s" in warning, warning
            SlowReranker.gate.set()  # the held workers finish; the queued jobs were dropped unrun
            _wait_until(lambda: pool.busy == 0 and pool.depth == 0)
            assert SlowReranker.started == 2
            # one document: the held jobs, which ran 1.5 s for 4, taught the pool's estimate and the
            # method's cost (a /search of 4 candidates, or a /rerank of 4 documents, would now get a 422)
            after = c.post("/rerank", json={"query": "apples after", "documents": DOCS8[:1]}).json()
            assert after["meta"]["reranked"] is True and SlowReranker.started == 3
            assert 'heedrank_deadline_fallbacks_total{reason="budget"} 5.0' in c.get("/metrics").text
    finally:
        SlowReranker.gate.set()


def test_a_rerank_past_the_budget_is_stopped_in_time_and_frees_the_worker(settings, pipeline):
    """A larger deadline_ms leaves the budget as the limit: the reranking is stopped there (its
    cancel token, at its next batch) and answered within the budget + GRACE_S; the worker then
    takes the next request, which is reranked."""
    BatchedReranker.batch_size, BatchedReranker.batch_seconds = 1, 0.3  # 8 documents: 2.4 s unbudgeted
    with _client(settings, pipeline, request_budget_s=1.0) as c:
        assert c.app.state.runtime.wait_ready(10)
        t0 = time.perf_counter()
        r = c.post("/rerank", json={"query": "apples", "documents": DOCS8, "deadline_ms": 5000})
        took = time.perf_counter() - t0
        assert r.status_code == 200, r.text
        assert took < 1.0 + GRACE_S, f"answered after {took:.2f} s"
        warning = _budget_warning("/rerank", r.json())
        assert "per-request budget of 1 s (HEEDRANK_REQUEST_BUDGET_S) ran out" in warning
        assert "from the request's arrival" in warning
        BatchedReranker.batch_seconds = 0.01  # the next request is quick
        t0 = time.perf_counter()
        # the stop taught >= 1 s / 8 per document (no more than 7 fit 0.9 s): 4 documents are served
        ok = c.post("/rerank", json={"query": "apples", "documents": DOCS8[:4]})
        assert ok.status_code == 200 and ok.json()["meta"]["reranked"] is True
        assert time.perf_counter() - t0 < 1.0
        assert BatchedReranker.calls == 2 and BatchedReranker.batches < 8 + 4  # the first stopped before its 8th


def test_a_request_that_cannot_end_within_the_budget_is_answered_at_once(settings, pipeline):
    """Once the pool knows its seconds per document, a request estimated to end past the budget
    is not queued at all: /rerank and /search answer at once by the budget's path, saying it
    would not end in time, and the reranker never runs."""
    with _client(settings, pipeline, request_budget_s=1.0) as c:
        assert c.app.state.runtime.wait_ready(10)
        c.app.state.runtime.pools["rerank"].seed(0.5)  # 8 documents: an estimated 4 s
        t0 = time.perf_counter()
        r = c.post("/rerank", json={"query": "apples", "documents": DOCS8})
        assert r.status_code == 200 and time.perf_counter() - t0 < 0.5, r.text
        assert "per-request budget of 1 s (HEEDRANK_REQUEST_BUDGET_S) would run out" in _budget_warning("/rerank", r.json())
        t0 = time.perf_counter()
        r = c.post("/search", json={"query": "apples", "top_k": 8, "rerank": {"candidates": 8}})
        assert r.status_code == 200 and time.perf_counter() - t0 < 0.5, r.text
        warning = _budget_warning("/search", r.json())
        assert warning.startswith("reranking skipped") and "per-request budget is 1 s" in warning
        assert BatchedReranker.calls == 0
        assert 'heedrank_deadline_fallbacks_total{reason="budget"} 2.0' in c.get("/metrics").text


def test_a_slow_fallback_is_cut_at_the_grace_and_the_next_request_reserves_time_for_it(settings, pipeline,
                                                                                       monkeypatch):
    """The fallback (scoring without the LM, in the search pool) is bounded too: one that cannot
    end by the budget + GRACE_S is left, and the answer keeps the given (first-stage) order; its
    cost is learned, so the next request stops its reranking that much earlier."""
    BatchedReranker.batch_size, BatchedReranker.batch_seconds = 1, 0.3
    release = threading.Event()

    def stuck(*args, **kwargs):
        release.wait(10)

    monkeypatch.setattr(pipeline, "serve_without_lm", stuck)
    try:
        with _client(settings, pipeline, request_budget_s=1.0) as c:
            assert c.app.state.runtime.wait_ready(10)
            # the first stop teaches the method's cost (at least 1 s / 8 per candidate, and so at most 7 fit): the
            # second request, sent with deadline_ms (the budget still the earlier limit), is not refused for it
            for route, ask in (("/search", {"query": "apples", "top_k": 8, "rerank": {"candidates": 8}}),
                               ("/rerank", {"query": "apples", "documents": DOCS8, "deadline_ms": 5000})):
                t0 = time.perf_counter()
                r = c.post(route, json=ask)
                took = time.perf_counter() - t0
                assert r.status_code == 200, r.text
                assert took < 1.0 + GRACE_S + 0.4, f"{route} answered after {took:.2f} s"
                warning = _budget_warning(route, r.json())
                assert "documents are in the given order" in warning or "first-stage place" in warning
            reserve = c.app.state.runtime.fallback_costs.reserve("rerank", 8)
            assert reserve >= 0.25  # it had at least the grace left of the stop (less its first stage)
            release.set()  # the abandoned fallbacks end before the service closes
    finally:
        release.set()

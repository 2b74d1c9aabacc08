"""What fits the per-request budget, known before the first request (:mod:`heedrank.api.costs`):
the start-up warm-up times the served method warm and cold, ``GET /info`` states each method's
figures before any request, a request past them is refused at once with a 422 that names them
(``/search`` against the warm figure, ``/rerank`` against the cold one), except for a method served
by the default's scorer, which answers in part; another method is timed the first time a search
builds it (fakes that sleep fixed seconds per candidate, :mod:`cost_fakes`; no LM).

The fakes' sleeps are lower bounds of what is measured (a busy machine only adds to them), so
the assertions are on one side of each figure, with wide margins."""

from __future__ import annotations

import time

import pytest
from cost_fakes import CostlyReranker, CostlyScoredReranker, PlainCostlyReranker
from fastapi.testclient import TestClient

from heedrank import registry
from heedrank.api import costs as costs_module
from heedrank.api.app import create_app
from heedrank.api.costs import MethodCosts, measure
from heedrank.api.deadline import GRACE_S

DOCS8 = [f"document {i} about apples and orchards" for i in range(8)]


@pytest.fixture
def costly(monkeypatch, fake_reranker):
    """Registers the cost fakes, their sleeps reset; timed passes of 4 documents (start-up stays short)."""
    for cls in (CostlyReranker, CostlyScoredReranker, PlainCostlyReranker):
        monkeypatch.setitem(registry._RERANKERS, cls.name, cls)
        cls.calls = 0
    monkeypatch.setattr(CostlyReranker, "warm_s", 0.06)
    monkeypatch.setattr(CostlyReranker, "cold_s", 0.12)
    monkeypatch.setattr(PlainCostlyReranker, "cold_s", 0.1)
    monkeypatch.setattr(costs_module, "COST_DOCUMENTS", 4)


def _client(settings, pipeline, **update) -> TestClient:
    return TestClient(create_app(settings.model_copy(update={"warmup": True, "workers": 1, **update}),
                                 pipeline=pipeline))


def test_measure_times_a_cold_pass_then_a_warm_one_of_the_same_documents(costly):
    """A method reading stored blocks: the cold pass encodes every document, the warm one reads
    them all (oracle: the fake's sleeps); one that stores none: one figure for both."""
    from heedrank.config import RerankerConfig

    cached = CostlyReranker(RerankerConfig(method="costly"))
    warm, cold = measure(cached.rerank, stored_blocks=True, documents=3)
    assert warm is not None and cold is not None
    assert 0.06 <= warm < cold and 0.12 <= cold < 0.5  # each at least its sleep; a busy machine adds to both
    assert CostlyReranker.calls == 3  # the first-call pass, cold, warm
    plain = PlainCostlyReranker(RerankerConfig(method="costly-plain"))
    warm, cold = measure(plain.rerank, stored_blocks=False, documents=3)
    assert cold is not None and warm == cold and 0.1 <= cold < 0.5
    assert PlainCostlyReranker.calls == 2


def test_a_fresh_service_states_its_limits_and_refuses_past_them_on_the_first_request(costly, settings, pipeline):
    """Before any request, ``GET /info`` gives the served method's seconds per candidate and what
    fits the budget, warm and cold (timed at start-up); the very first ``/search`` and ``/rerank``
    past them are refused at once, naming the field and the figure, the reranker never called;
    smaller requests, and a ``/rerank`` whose client asked for an answer by ``deadline_ms``, are served."""
    with _client(settings, pipeline, rerank_method="costly", request_budget_s=0.4) as c:
        assert c.app.state.runtime.wait_ready(20)
        limits = c.get("/info").json()["reranker"]["limits"]["costly"]
        spc = limits["seconds_per_candidate"]
        assert 0.06 <= spc["warm"] < spc["cold"] and 0.12 <= spc["cold"] < 1.0
        fits, documents = limits["max_candidates_in_budget"], limits["max_documents_in_budget"]
        assert 1 <= fits["warm"] <= 6 and 1 <= fits["cold"] <= 3  # 0.9 * 0.4 s at >= 0.06 s, >= 0.12 s each
        assert documents["cold"] == fits["cold"]
        assert c.get("/info").json()["limits"]["max_candidates"] == 8  # the hard cap, said apart
        calls = CostlyReranker.calls

        t0 = time.perf_counter()
        r = c.post("/search", json={"query": "apples", "top_k": 8, "rerank": {"candidates": 8}})
        assert r.status_code == 422 and time.perf_counter() - t0 < 0.3, r.text
        error = r.json()["error"]
        assert f"reranks about {fits['warm']} candidates within this service's per-request budget of 0.4 s" in error
        assert f"measured here: {spc['warm']:.2f} s per candidate" in error
        assert "GET /info: reranker.limits.costly.max_candidates_in_budget.warm" in error

        t0 = time.perf_counter()
        r = c.post("/rerank", json={"query": "apples", "documents": DOCS8})
        assert r.status_code == 422 and time.perf_counter() - t0 < 0.3, r.text
        error = r.json()["error"]
        assert f"reads about {documents['cold']} new documents" in error
        assert "GET /info: reranker.limits.costly.max_documents_in_budget.cold" in error
        assert f"send at most {documents['cold']} documents" in error
        assert CostlyReranker.calls == calls  # refused before any reranking

        r = c.post("/search", json={"query": "apples", "top_k": 1, "rerank": {"candidates": 1}})
        assert r.status_code == 200, r.text
        r = c.post("/rerank", json={"query": "apples", "documents": DOCS8, "deadline_ms": 300})
        assert r.status_code == 200 and r.json()["meta"]["deadline_exceeded"] is True, r.text


def test_a_method_served_by_the_default_scorer_is_not_refused(costly, settings, pipeline):
    """The default's scorer answers a request past the budget in part (the LM reads what fits,
    the rest is scored from its other signals): its ``/rerank`` and ``/search`` past the figures
    are served within the budget, not refused; the same method with a fusion weight is no longer
    served by that scorer, and is refused."""
    budget = 0.4
    with _client(settings, pipeline, rerank_method="costly-scored", request_budget_s=budget) as c:
        assert c.app.state.runtime.wait_ready(20)
        limits = c.get("/info").json()["reranker"]["limits"]["costly-scored"]
        assert limits["max_documents_in_budget"]["cold"] <= 3 and limits["max_candidates_in_budget"]["warm"] <= 6
        t0 = time.perf_counter()
        r = c.post("/rerank", json={"query": "apples", "documents": DOCS8})
        assert r.status_code == 200, r.text
        assert time.perf_counter() - t0 < budget + GRACE_S + 1.0
        r = c.post("/search", json={"query": "apples", "top_k": 8, "rerank": {"candidates": 8}})
        assert r.status_code == 200, r.text
        r = c.post("/search", json={"query": "apples", "top_k": 8, "rerank": {"candidates": 8, "fusion": 0.5}})
        assert r.status_code == 422 and "max_candidates_in_budget.warm" in r.json()["error"], r.text


def _pipeline12():
    """The fake corpus's pipeline, all 12 documents rerankable."""
    from api_fakes import DOCS, OverlapRetriever

    from heedrank.config import RerankerConfig
    from heedrank.index.memory import InMemoryDocStore
    from heedrank.pipeline import Pipeline, reranker_factory

    return Pipeline(retrievers={"bm25": OverlapRetriever(DOCS)}, docstore=InMemoryDocStore(DOCS),
                    reranker_factory=reranker_factory(RerankerConfig()), max_top_k=20, max_candidates=12)


def test_another_method_is_timed_the_first_time_a_search_builds_it(costly, settings):
    """A method the service did not load at start has no figures (null) until a search asks for
    it; that first search times it (a short pass, within its own budget) and is refused at once
    when it cannot fit, instead of reranking nothing after the whole budget; ``/info`` then has
    its figures, and the next such request is refused without a pass."""
    pipeline = _pipeline12()
    CostlyReranker.warm_s, CostlyReranker.cold_s = 0.001, 0.002  # the served method: quick
    costs_module.COST_DOCUMENTS = 2  # (restored by the fixture's monkeypatch)
    budget = 1.0  # 12 candidates of costly-plain: >= 1.2 s; its timed pass: 3 x 0.1 s
    with _client(settings, pipeline, rerank_method="costly", request_budget_s=budget, max_candidates=12) as c:
        assert c.app.state.runtime.wait_ready(20)
        before = c.get("/info").json()["reranker"]["limits"]
        assert before["costly"]["seconds_per_candidate"]["warm"] is not None  # the served one: timed at start-up
        assert before["costly-plain"]["seconds_per_candidate"] == {"warm": None, "cold": None}
        assert before["costly-plain"]["max_candidates_in_budget"] == {"warm": None, "cold": None}
        ask = {"query": "apples orchards", "top_k": 12, "rerank": {"method": "costly-plain", "candidates": 12}}
        t0 = time.perf_counter()
        r = c.post("/search", json=ask)
        took = time.perf_counter() - t0
        assert r.status_code == 422, r.text
        assert took < budget, f"refused after {took:.2f} s"
        assert PlainCostlyReranker.calls == 2  # the timed pass (first call, then 2 documents): no reranking
        after = c.get("/info").json()["reranker"]["limits"]["costly-plain"]
        spc, fits = after["seconds_per_candidate"], after["max_candidates_in_budget"]
        assert spc["warm"] == spc["cold"] >= 0.1 and fits["warm"] == fits["cold"] <= 9
        assert f"reranks about {fits['warm']} candidates" in r.json()["error"]
        t0 = time.perf_counter()
        assert c.post("/search", json=ask).status_code == 422 and time.perf_counter() - t0 < 0.3
        assert PlainCostlyReranker.calls == 2
        r = c.post("/search", json={**ask, "top_k": 2, "rerank": {"method": "costly-plain", "candidates": 2}})
        assert r.status_code == 200 and r.json()["rerank"]["reranked"] == 2, r.text


def test_a_method_too_slow_to_time_within_the_budget_teaches_a_lower_bound(costly, settings):
    """When the first search's timed pass itself cannot end within the budget, the search is
    answered by the budget's path (its time spent, nothing reranked; not refused after the
    budget), and the seconds the pass ran over its documents (at most 1 + COST_DOCUMENTS) are a
    lower bound: the next such request is refused at once."""
    CostlyReranker.warm_s, CostlyReranker.cold_s = 0.001, 0.002  # the served method: quick
    PlainCostlyReranker.cold_s = 0.2  # its timed pass: 5 x 0.2 s, past the 0.5 s budget
    ask = {"query": "apples orchards", "top_k": 12, "rerank": {"method": "costly-plain", "candidates": 12}}
    with _client(settings, _pipeline12(), rerank_method="costly", request_budget_s=0.5, max_candidates=12) as c:
        assert c.app.state.runtime.wait_ready(20)
        t0 = time.perf_counter()
        r = c.post("/search", json=ask)
        assert r.status_code == 200 and r.json()["rerank"]["reranked"] == 0, r.text
        assert time.perf_counter() - t0 < 0.5 + GRACE_S + 0.5
        spc = c.app.state.runtime.costs.seconds_per_candidate("costly-plain")
        assert spc is not None and spc >= 0.2 / 5  # at least the budget's share it ran, over at most 5 documents
        t0 = time.perf_counter()
        r = c.post("/search", json=ask)
        assert r.status_code == 422 and time.perf_counter() - t0 < 0.3, r.text


def test_no_warmup_no_figures_before_a_request(costly, settings, pipeline):
    """With ``warmup`` off nothing is timed: the figures are null, and a request is not refused
    for lack of them (the budget's path answers it)."""
    with TestClient(create_app(settings.model_copy(update={"rerank_method": "costly", "request_budget_s": 0.4,
                                                            "warmup": False}), pipeline=pipeline)) as c:
        assert c.app.state.runtime.wait_ready(20)
        limits = c.get("/info").json()["reranker"]["limits"]["costly"]
        assert limits["seconds_per_candidate"] == {"warm": None, "cold": None}
        assert CostlyReranker.calls == 0
        r = c.post("/search", json={"query": "apples", "top_k": 8, "rerank": {"candidates": 8}})
        assert r.status_code == 200, r.text


def test_costs_ignore_a_mix_and_a_seed_never_replaces_a_figure():
    costs = MethodCosts()
    assert not costs.known("m") and costs.max_candidates("m", 10.0) is None
    costs.observe("m", 1.0, 10, cold=0)
    costs.seed("m", 5.0, 0.4)
    assert costs.seconds_per_candidate("m") == 0.1 and costs.seconds_per_candidate("m", "cold") == 0.4
    assert costs.max_candidates("m", 10.0) == 90 and costs.max_candidates("m", 10.0, "cold") == 22
    assert costs.max_candidates("m", None) is None
    assert not costs.claim_probe("m")  # measured already
    assert costs.claim_probe("n") and not costs.claim_probe("n")  # one timing at a time
    costs.release_probe("n")
    assert costs.claim_probe("n")

"""heedrank.api.deadline: one end per request, from the middleware's arrival stamp; the fallback's
reserve and grace."""

from __future__ import annotations

import asyncio
import time

import pytest

from heedrank.api.deadline import (
    ARRIVED,
    GRACE_S,
    RESERVE_SHARE,
    FallbackCosts,
    RequestDeadline,
    arrival,
    request_deadline,
)


@pytest.mark.parametrize(("budget", "client", "end", "by_budget"), [
    (2.0, None, 12.0, True),
    (2.0, 1.0, 11.0, False),  # a smaller deadline_ms is the request's own limit
    (2.0, 5.0, 12.0, True),  # a larger one: the budget still bounds it
    (2.0, 2.0, 12.0, False),  # a tie names the client's
    (None, 0.5, 10.5, False),
    (None, None, None, False),
])
def test_the_end_is_the_arrival_plus_the_earlier_limit(budget, client, end, by_budget):
    deadline = request_deadline({ARRIVED: 10.0}, budget, client)
    assert deadline == RequestDeadline(10.0, end, by_budget)


def test_work_ends_before_the_end_by_the_reserve_at_most_a_share_and_the_fallback_after_it():
    d = RequestDeadline(arrived=100.0, end=120.0, by_budget=True)
    assert d.window == 20.0
    assert d.work_end(1.5) == 118.5
    assert d.work_end(-1.0) == 120.0
    assert d.work_end(50.0) == 120.0 - RESERVE_SHARE * 20.0  # a slow fallback never takes the whole window
    assert d.fallback_end() == 120.0 + GRACE_S
    unlimited = RequestDeadline(100.0, None, False)
    assert unlimited.work_end(1.0) is None and unlimited.fallback_end() is None and unlimited.window is None


def test_without_a_stamp_the_arrival_is_now():
    t0 = time.perf_counter()
    assert t0 <= arrival({}) <= time.perf_counter()


def test_fallback_costs_learn_seconds_per_document_per_route():
    costs = FallbackCosts(alpha=0.5)
    assert costs.reserve("rerank", 100) == 0.0  # not measured: nothing reserved (the grace remains)
    costs.observe("rerank", 2.0, 100)
    assert costs.reserve("rerank", 50) == pytest.approx(1.0) and costs.reserve("search", 50) == 0.0
    costs.observe("rerank", 4.0, 100)
    assert costs.reserve("rerank", 100) == pytest.approx(3.0)
    costs.observe("rerank", 0.0, 100)  # nothing measured
    assert costs.reserve("rerank", 100) == pytest.approx(3.0)


def test_the_metrics_middleware_stamps_the_arrival_before_the_app_runs():
    from heedrank.api.middleware import MetricsMiddleware

    seen = {}

    async def app(scope, receive, send):
        seen.update(scope)

    t0 = time.perf_counter()
    asyncio.run(MetricsMiddleware(app)({"type": "http", "method": "POST", "path": "/rerank"}, None, None))
    assert t0 <= seen[ARRIVED] <= time.perf_counter()

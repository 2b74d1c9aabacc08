"""A reranking under a deadline reads what fits (:class:`heedrank.passcost.PassCosts`,
:meth:`heedrank.pipeline.RerankerCache.rerank`): cold blocks only as many as the time left allows,
the strategy's prior first, and the rest scored from their other signals, not the call stopped."""

from __future__ import annotations

import time

import numpy as np
import pytest

from heedrank.cancel import CancelToken, cancel_scope, time_left
from heedrank.passcost import PassCosts
from heedrank.pipeline import RerankerCache, _within_budget
from heedrank.protocols import RerankResult
from heedrank.scorer import Scorer
from heedrank.seam import RerankerServing
from heedrank.serving import ServePolicy
from heedrank.types import Document, Query, Ranking, ScoredDoc


def test_costs_learn_and_say_how_many_cold_blocks_fit() -> None:
    costs = PassCosts(per_candidate=0.02, per_block=0.3, alpha=0.5, share=1.0)
    assert costs.cold_within(3.2, warm=10) == 9  # (3.2 - 0.2) / 0.32
    assert costs.cold_within(0.1, warm=10) == 0  # not even the warm pass
    costs.observe(candidates=20, cold=0, seconds=0.2)  # a warm pass: 0.01 s per candidate
    assert costs.per_candidate == pytest.approx(0.01)
    costs.observe(candidates=20, cold=10, seconds=2.2)  # (2.2 - 0.2) / 10 per block
    assert costs.per_block == pytest.approx(0.2)
    assert costs.cold_within(2.1, warm=10) == 9  # (2.1 - 0.1) / 0.21
    costs.observe(candidates=20, cold=10, seconds=4.2)  # later calls move the mean: 0.2 + 0.5 (0.4 - 0.2)
    assert costs.per_block == pytest.approx(0.3)
    costs.observe(candidates=0, cold=0, seconds=1.0)  # nothing learned from an empty call
    assert costs.per_candidate == pytest.approx(0.01)


def test_the_cold_blocks_kept_are_the_prior_s_first() -> None:
    docs = [Document(f"d{i}", f"text {i}") for i in range(5)]
    cold = [True, False, True, True, True]
    kept, skipped = _within_budget(docs, cold, 2, priority=["d4", "d1", "d3", "d0", "d2"])
    assert [d.doc_id for d in kept] == ["d1", "d3", "d4"]  # given order kept; d4 and d3 were first
    assert [d.doc_id for d in skipped] == ["d0", "d2"]
    assert [d.doc_id for d in _within_budget(docs, cold, 2)[0]] == ["d0", "d1", "d2"]  # no prior: given order


def test_time_left_is_the_token_s_deadline() -> None:
    assert time_left() is None
    with cancel_scope(CancelToken(deadline=time.perf_counter() + 5.0)):
        left = time_left()
        assert left is not None and 4.0 < left <= 5.0
    with cancel_scope(CancelToken()):
        assert time_left() is None


class _SlowCold:
    """A cached reranker whose cold blocks take ``per_block`` seconds each ('cold' in the text)."""

    name = "slow-cold"

    def __init__(self, per_block: float) -> None:
        self.per_block = per_block
        self.read: list[str] = []

    def serving(self) -> RerankerServing:
        card = {"scorer": {"threshold": 0.5, "models": [
            {"uses": ["attention", "dense"], "weights": [1.0, 4.0], "bias": -2.0},
            {"uses": ["dense"], "weights": [5.0], "bias": -2.5}]}}
        return RerankerServing(Scorer.from_card(card), 0.5, cold_candidates=self.cold_candidates)

    def cold_candidates(self, candidates, block_store=None):  # type: ignore[no-untyped-def]
        return ["cold" in d.content for d in candidates]

    def rerank(self, query, candidates, *, block_store=None):  # type: ignore[no-untyped-def]
        cold = sum("cold" in d.content for d in candidates)
        time.sleep(self.per_block * cold)
        self.read = [d.doc_id for d in candidates]
        return RerankResult(Ranking.from_scores(query.query_id, {d.doc_id: 1.0 for d in candidates}),
                            cache={"hits": len(candidates) - cold, "misses": cold})

    def rerank_batch(self, queries, candidates):  # type: ignore[no-untyped-def]
        return [self.rerank(q, c) for q, c in zip(queries, candidates)]

    def describe(self) -> dict:
        return {"method": self.name}


def test_a_deadline_reads_what_fits_and_the_prior_s_best_first() -> None:
    reranker = _SlowCold(per_block=0.05)
    cache = RerankerCache(lambda method, options=None, max_doc_tokens=None: reranker)
    docs = [Document(f"d{i}", f"cold text {i}") for i in range(20)]
    priority = [f"d{i}" for i in reversed(range(20))]
    # no deadline: every block is read (a warm call first: the pass's own cost is learned as about 0)
    cache.rerank(Query("q", "t"), [Document("w", "warm")], "slow-cold")
    done = cache.rerank(Query("q", "t"), docs, "slow-cold")
    assert done.skipped == () and len(reranker.read) == 20
    # 0.6 s left, about 0.05 s a block learned from that call (all 20 would take 1 s): some read, the
    # prior's first, the rest skipped, and the call ends by the deadline (0.1 s of slack for a loaded machine)
    t0 = time.perf_counter()
    with cancel_scope(CancelToken(deadline=time.perf_counter() + 0.6)):
        done = cache.rerank(Query("q", "t"), docs, "slow-cold", priority=priority)
    assert time.perf_counter() - t0 < 0.7
    read = reranker.read
    assert 2 <= len(read) < 20 and set(read) == set(priority[:len(read)])
    assert set(done.skipped) == {d.doc_id for d in docs} - set(read)
    # a caller that cannot serve a list read in part (a cut-off without the scorer): every block
    with cancel_scope(CancelToken(deadline=time.perf_counter() + 0.3)):
        done = cache.rerank(Query("q", "t"), docs, "slow-cold", fit_deadline=False)
    assert done.skipped == () and len(reranker.read) == 20


def test_the_scorer_s_prior_orders_by_the_signals_at_hand() -> None:
    policy = ServePolicy.of(_SlowCold(0.0), fusion="default")
    cands = Ranking("q", tuple(ScoredDoc(d, 1.0) for d in ("a", "b", "c", "d")))
    X = np.asarray([[np.nan, 0.1], [np.nan, 0.9], [np.nan, np.nan], [np.nan, 0.5]])  # attention, dense
    assert policy.features == ("attention", "dense") and policy.serves_partly
    assert policy.priority(cands, X) == ["b", "d", "a", "c"]  # c: no signal, last


class _Prefetching(_SlowCold):
    """:class:`_SlowCold` that can make blocks warm ahead of its pass, ``per_block`` seconds each."""

    def __init__(self, per_block: float) -> None:
        super().__init__(per_block)
        self.warm: set[str] = set()

    def cold_candidates(self, candidates, block_store=None):  # type: ignore[no-untyped-def]
        return [d.doc_id not in self.warm for d in candidates]

    def prefetch_blocks(self, candidates, block_store=None):  # type: ignore[no-untyped-def]
        cold = [d for d in candidates if d.doc_id not in self.warm]
        time.sleep(self.per_block * len(cold))
        self.warm |= {d.doc_id for d in cold}
        return len(cold)

    def rerank(self, query, candidates, *, block_store=None):  # type: ignore[no-untyped-def]
        cold = [d for d in candidates if d.doc_id not in self.warm]
        time.sleep(self.per_block * len(cold))
        self.warm |= {d.doc_id for d in cold}
        self.read = [d.doc_id for d in candidates]
        return RerankResult(Ranking.from_scores(query.query_id, {d.doc_id: 1.0 for d in candidates}),
                            cache={"hits": len(candidates) - len(cold), "misses": len(cold)})


def test_a_busier_machine_stops_the_encoding_not_the_request() -> None:
    """A reranker that prefetches encodes a chunk at a time and measures each: blocks slower than
    the estimate (a second request on the same cores) stop the encoding early, within the deadline."""
    reranker = _Prefetching(per_block=0.1)  # faster than the 0.3 s prior; then the machine slows down
    cache = RerankerCache(lambda method, options=None, max_doc_tokens=None: reranker)
    docs = [Document(f"d{i}", f"text {i}") for i in range(30)]
    t0 = time.perf_counter()
    with cancel_scope(CancelToken(deadline=time.perf_counter() + 1.0)):
        done = cache.rerank(Query("q", "t"), docs, "slow-cold", priority=[d.doc_id for d in reversed(docs)])
    assert time.perf_counter() - t0 < 1.1
    assert 2 <= len(reranker.read) < 30 and set(reranker.read) == {f"d{i}" for i in range(30 - len(reranker.read), 30)}
    assert set(done.skipped) == {d.doc_id for d in docs} - set(reranker.read)
    reranker.per_block = 0.3  # the machine is busier now: fewer fit, still by the deadline
    more = [Document(f"e{i}", f"other {i}") for i in range(30)]
    t0 = time.perf_counter()
    with cancel_scope(CancelToken(deadline=time.perf_counter() + 1.0)):
        cache.rerank(Query("q", "t"), more, "slow-cold")
    assert time.perf_counter() - t0 < 1.2


def test_the_request_s_cold_budget_bounds_the_prefetch() -> None:
    """A search with a cold budget (the service's ``HEEDRANK_COLD_BUDGET``) encodes no more cold
    blocks than it, however much time is left."""
    reranker = _Prefetching(per_block=0.01)
    cache = RerankerCache(lambda method, options=None, max_doc_tokens=None: reranker)
    docs = [Document(f"d{i}", f"text {i}") for i in range(12)]
    with cancel_scope(CancelToken(deadline=time.perf_counter() + 20.0)):
        done = cache.rerank(Query("q", "t"), docs, "slow-cold", cold_budget=3)
    assert len(reranker.read) == 3 and len(reranker.warm) == 3 and len(done.skipped) == 9

"""Query passes side by side (:class:`heedrank.reranker.slots.PassSlots`): concurrent reranks
with the packaged card and query adapter score exactly as one at a time (oracle test), while
cold blocks are encoded by the base model at the same time."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from heedrank.reranker.slots import PassSlots

torch = pytest.importorskip("torch")

from heedrank.config import RerankerConfig  # noqa: E402
from heedrank.pipeline import call_gate  # noqa: E402
from heedrank.reranker.cached import CachedBlockRankReranker  # noqa: E402
from heedrank.types import Query  # noqa: E402

QUERIES = ["do statins reduce cancer risk", "vitamin d and bone fractures", "breast milk and infant health",
           "red meat and colon cancer", "fish oil heart disease", "obesity in children"]


def test_slots_bound_the_passes_and_share_the_threads() -> None:
    slots = PassSlots(2, threads=2)
    seen: list[tuple[int, int]] = []
    inside, done = threading.Barrier(2), threading.Barrier(2)

    def one() -> None:
        with slots.slot() as buffer:
            threads = torch.get_num_threads()
            inside.wait(timeout=10)  # both in a slot at once
            seen.append((slots.running, threads))
            done.wait(timeout=10)
            assert buffer is not None

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda _: one(), range(2)))
    # the first in took both threads (alone at its start), the second its share of 1
    assert [r for r, _ in seen] == [2, 2] and sorted(t for _, t in seen) == [1, 2]
    assert slots.running == 0 and len(slots.idle_buffers) == 2  # buffers are kept for the next passes

    def alone() -> int:
        with slots.slot():
            return torch.get_num_threads()

    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(alone).result() == 2  # a pass alone takes every thread
    with pytest.raises(ValueError):
        PassSlots(0)


def test_one_slot_never_touches_the_threads() -> None:
    before = torch.get_num_threads()
    with PassSlots(1, threads=before + 3).slot():
        assert torch.get_num_threads() == before


def test_concurrent_passes_score_as_one_at_a_time(default_lm, nfcorpus_head) -> None:
    """The default (packaged card and query adapter) with 2 passes at once, 3 threads, every
    block cold (encoded by the base model while another query's adapter pass runs): the same
    ranking and scores as one reranker with one pass reranking the queries in turn, to float32
    rounding (a pass sharing the threads sums its products in another order); a buffer or an
    adapter switched under a running pass would move them by orders of magnitude more."""
    docs = nfcorpus_head[:6]
    config = RerankerConfig(method="default")
    one = CachedBlockRankReranker(config, lm=default_lm, passes=1, block_cache_bytes=0)
    assert one.adapter is not None and one.scoring == "learned"  # the adapter's copy runs the passes
    want = {q: one.rerank(Query(str(i), q), docs).ranking.hits for i, q in enumerate(QUERIES)}
    two = CachedBlockRankReranker(config, lm=default_lm, passes=2, block_cache_bytes=0)
    assert two.concurrent_calls == 2 and call_gate(two)._value == 2 and call_gate(one)._value == 1
    with ThreadPoolExecutor(3) as pool:
        got = dict(zip(QUERIES, pool.map(lambda iq: two.rerank(Query(str(iq[0]), iq[1]), docs).ranking.hits,
                                         enumerate(QUERIES))))
    for q in QUERIES:
        assert [h.doc_id for h in got[q]] == [h.doc_id for h in want[q]], q
        assert [h.score for h in got[q]] == pytest.approx([h.score for h in want[q]], abs=1e-4), q

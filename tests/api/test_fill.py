"""The service's background fill of a document KV store (:class:`heedrank.api.fill.BlockFiller`)."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import pytest
from api_fakes import HeldRequest, SlowBlocks  # tests/api/api_fakes.py
from block_fakes import DocIndex, FakeCached, Idle  # tests/block_fakes.py

from heedrank.api.fill import BlockFiller, QuietGate
from heedrank.api.inference import InferencePool
from heedrank.types import Document


def test_the_fill_logs_every_tenth_and_when_full_and_describe_lists_no_files(tmp_path, caplog, monkeypatch) -> None:
    docs = [Document(f"d{i:02d}", f"text {i}") for i in range(40)]
    reranker, index = FakeCached(), DocIndex(tmp_path, docs)
    filler = BlockFiller(index, reranker, threading.Lock(), Idle(), name="c1")
    filler.commit_every = 4
    with caplog.at_level(logging.INFO, logger="heedrank.api.fill"):
        filler.start()
        deadline = time.monotonic() + 20
        while not filler.scan_done and time.monotonic() < deadline:
            time.sleep(0.02)
        filler.stop()
    assert filler.scan_done and len(reranker.encoded) == 40
    lines = [r.getMessage() for r in caplog.records if "document KV store fill" in r.getMessage()]
    assert [int(m.split("fill ")[1].split("%")[0]) for m in lines] == list(range(10, 101, 10)), lines
    assert "(40 of 40 documents scanned; " in lines[-1]
    assert any("document KV store full: every document's block is stored (40 blocks" in r.getMessage()
               for r in caplog.records)

    def no_io(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("describe() touched the store")

    monkeypatch.setattr(index.store, "stats", no_io)
    info = filler.describe()
    assert info["blocks"] == 40 and info["live_bytes"] > 0 and info["filled"] == 40
    assert info["documents"] == 40 and info["scanned"] == 40 and info["scan_done"] and not info["filling"]


def _fill(filler: Any) -> dict[str, Any]:
    """``filler`` started and waited for until its scan is done or stopped at the budget; its ``describe()``."""
    filler.start()
    deadline = time.monotonic() + 20
    while not (filler.scan_done or filler.at_budget) and time.monotonic() < deadline:
        time.sleep(0.02)
    filler.stop()
    return filler.describe()


def test_scanned_counts_the_last_document_handed_to_the_fill_when_the_budget_stops_the_scan(tmp_path) -> None:
    """The scan counts a document when it hands its block to the fill: stopped at the disk budget
    right after encoding one, ``scanned`` counts it (it once lagged one behind)."""
    docs = [Document(f"d{i:02d}", f"text {i}") for i in range(20)]
    reranker, index = FakeCached(), DocIndex(tmp_path, docs)
    filler = BlockFiller(index, reranker, threading.Lock(), Idle(), name="c1")
    filler._full = lambda pending: len(reranker.encoded) >= 5  # type: ignore[method-assign]  # budget after 5 blocks
    info = _fill(filler)
    assert info["at_budget"] and not info["scan_done"]
    assert reranker.encoded == [d.text for d in docs[:5]]
    assert info["scanned"] == 5 and info["filled"] == info["blocks"] == 5 and info["documents"] == 20


def test_identical_texts_share_a_block_so_blocks_may_be_fewer_than_documents_scanned(tmp_path) -> None:
    """A finished scan has ``scanned == documents``; ``blocks`` is fewer when texts repeat."""
    docs = [Document(f"d{i:02d}", f"text {i % 7}") for i in range(10)]  # 3 texts repeat
    reranker, index = FakeCached(), DocIndex(tmp_path, docs)
    info = _fill(BlockFiller(index, reranker, threading.Lock(), Idle(), name="c1"))
    assert info["scan_done"] and info["documents"] == info["scanned"] == 10
    assert info["blocks"] == info["filled"] == 7 and len(reranker.encoded) == 7


# -- stepping aside for requests (QuietGate) -----------------------------------------------------

class Watched:
    """An :class:`heedrank.api.fill.IdleSignal` that sets ``busy_seen`` each time the fill looks
    and finds the service busy."""

    def __init__(self, signal: Any) -> None:
        self.signal = signal
        self.busy_seen = threading.Event()

    def wait_idle(self, timeout: float | None = None) -> bool:
        idle = self.signal.wait_idle(timeout)
        if not idle:
            self.busy_seen.set()
        return idle


def _until(predicate: Any, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


class FakePool:
    def __init__(self, idle: float) -> None:
        self.idle = idle

    def idle_for(self) -> float:
        return self.idle


def test_the_quiet_gate_waits_for_every_pool_to_be_idle_for_the_hold() -> None:
    rerank, search = FakePool(5.0), FakePool(0.0)
    gate = QuietGate([rerank, search], hold=0.3, poll=0.01)
    assert gate.quiet_in() is None and not gate.wait_idle(0) and not gate.wait_idle(0.05)  # a search in flight
    search.idle = 0.1
    assert abs(gate.quiet_in() - 0.2) < 1e-9  # idle, not for the hold yet
    search.idle = 0.3
    assert gate.quiet_in() == 0.0 and gate.wait_idle(0) and gate.wait_idle()
    assert QuietGate([], hold=0.3).wait_idle(0)  # no pools: always quiet
    assert QuietGate([FakePool(1e-6)], hold=0.0).wait_idle(0)
    with pytest.raises(ValueError):
        QuietGate([], hold=-1)


def _slow_fill(tmp_path: Any, idle: Any, n: int = 40, seconds: float = 0.02) -> tuple[Any, Any, Any]:
    """A filler of ``n`` documents over :class:`api_fakes.SlowBlocks`: ``(filler, encoder, index)``."""
    docs = [Document(f"d{i:02d}", f"text {i}") for i in range(n)]
    encoder, index = SlowBlocks(seconds), DocIndex(tmp_path, docs)
    return BlockFiller(index, encoder, threading.Lock(), idle, name="c1"), encoder, index


def test_the_fill_steps_aside_while_a_request_is_queued_or_running_and_resumes_after_the_hold(tmp_path) -> None:
    """A request in the pool: the fill starts no block (at most the one it had looked for before
    the request came) until the pool has been idle for the hold, then finishes the scan."""
    hold = 0.2
    pool = InferencePool("rerank", workers=1, queue_size=4).start()
    watched = Watched(QuietGate([pool], hold=hold, poll=0.01))
    filler, encoder, index = _slow_fill(tmp_path, watched)  # 40 blocks of 0.02 s
    try:
        filler.start()
        encoder.wait_encoded(3)
        watched.busy_seen.clear()  # the pool has been idle since: the fill only saw it busy at its start
        request = HeldRequest(pool).start()
        assert watched.busy_seen.wait(10)  # the fill looked, saw the request, waits
        _until(lambda: filler.paused)
        seen = len(encoder.starts)
        assert sum(t > request.submitted_at for t in encoder.starts) <= 1  # the one it had looked for before
        encoder.encoding.clear()
        assert not encoder.encoding.wait(0.5)  # 25 blocks' time: none started
        assert len(encoder.starts) == seen and filler.pauses >= 1
        request.release()
        encoder.wait_encoded(seen + 1)
        assert encoder.starts[seen] >= request.released_at + hold  # resumed after the hold, not before
        _until(lambda: filler.scan_done)
        assert sorted(encoder.encoded) == sorted(d.content for d in index.docstore.iter_documents())
        assert not filler.paused and filler.describe()["pauses"] == filler.pauses
    finally:
        filler.stop()
        pool.close()


def test_stop_stops_the_fill_at_once_while_it_steps_aside_and_commits_what_it_encoded(tmp_path) -> None:
    pool = InferencePool("rerank", workers=1, queue_size=4).start()
    watched = Watched(QuietGate([pool], hold=0.05, poll=0.01))
    filler, encoder, index = _slow_fill(tmp_path, watched)
    filler.commit_every, filler.commit_seconds = 1000, 1000.0  # nothing committed before stop()
    request = None
    try:
        filler.start()
        encoder.wait_encoded(3)
        watched.busy_seen.clear()
        request = HeldRequest(pool).start()
        assert watched.busy_seen.wait(10)
        _until(lambda: filler.paused)
        t0 = time.monotonic()
        filler.stop(timeout=5)
        assert time.monotonic() - t0 < 1.0 and not filler.running  # pause_poll is 0.1 s
        encoded = set(encoder.encoded)
        assert len(encoded) >= 3 and filler.filled == len(encoded)
        assert all(index.store.contains(k) for k in encoder.block_keys(sorted(encoded)))  # committed on stop
    finally:
        if request is not None:
            request.release()
        filler.stop()
        pool.close()


def test_stop_before_the_first_block_while_the_service_is_busy(tmp_path) -> None:
    """Started while a request runs: the fill waits from the start, encodes nothing, and stops."""
    pool = InferencePool("search", workers=1, queue_size=4).start()
    request = HeldRequest(pool).start()
    watched = Watched(QuietGate([pool], hold=0.05, poll=0.01))
    filler, encoder, _ = _slow_fill(tmp_path, watched)
    try:
        filler.start()
        assert watched.busy_seen.wait(10)
        filler.stop(timeout=5)
        assert not filler.running and encoder.encoded == [] and filler.filled == 0
    finally:
        request.release()
        filler.stop()
        pool.close()


class Switch:
    """An :class:`heedrank.api.fill.IdleSignal` the test turns on and off."""

    def __init__(self) -> None:
        self.on = threading.Event()
        self.busy_seen = threading.Event()

    def wait_idle(self, timeout: float | None = None) -> bool:
        idle = self.on.wait(timeout)
        if not idle:
            self.busy_seen.set()
        return idle


def test_upserted_documents_are_encoded_after_skipped_blocks_and_ahead_of_the_scan(tmp_path) -> None:
    """:meth:`BlockFiller.add`: the blocks of upserted documents are queued (counted by
    ``queued``), encoded after the blocks searches skipped and before the rest of the scan,
    only while the service is idle, and also once the scan is done; stored ones are skipped."""
    switch = Switch()
    filler, encoder, index = _slow_fill(tmp_path, switch, n=6, seconds=0.0)
    try:
        filler.start()
        assert switch.busy_seen.wait(10)  # the scan's first block (d00) taken, waiting for idle
        filler.add([Document("n1", "new one"), Document("n2", "new two"), Document("d03", "text 3")])
        filler.offer([Document("s1", "skipped")])
        assert filler.queued() == 4 and filler.describe()["filling"]
        time.sleep(0.2)
        assert encoder.encoded == []  # nothing while busy
        switch.on.set()
        _until(lambda: filler.scan_done)
        assert encoder.encoded == ["text 0", "skipped", "new one", "new two", "text 3", "text 1", "text 2",
                                   "text 4", "text 5"]  # d03's block was stored from the upsert: not twice
        filler.add([Document("n3", "new three"), Document("n1", "new one")])  # after the scan: still encoded
        _until(lambda: filler.filled >= 10)
        assert encoder.encoded[-1] == "new three" and filler.filled == 10 and filler.queued() == 0
        assert index.store.contains(encoder.block_keys(["new three"])[0])
    finally:
        filler.stop()

"""The service's background fill of a document KV store (:class:`heedrank.api.fill.BlockFiller`)."""

from __future__ import annotations

import logging
import threading
from typing import Any

from block_fakes import DocIndex, FakeCached, Idle  # tests/block_fakes.py

from heedrank.api.fill import BlockFiller
from heedrank.types import Document


def test_the_fill_logs_every_tenth_and_when_full_and_describe_lists_no_files(tmp_path, caplog, monkeypatch) -> None:
    import time

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
    import time

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

"""The service and a collection's document KV store (cached BlockRank), on real BM25 index
directories: ``DELETE /documents/{id}`` drops the document's block right after the commit
(a block shared with a live document of the same text too: it is recomputed on that
document's next search), and a store built for another configuration fails start-up (status
``failed``, the message naming the rebuild command) instead of the first search. A fake
cached reranker (tiny blocks, no LM) for the API logic; the real BlockRank for the start-up
check."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from heedrank import registry
from heedrank.protocols import RerankResult
from heedrank.types import Document, Query, Ranking
from serving_fakes import AttributeServing  # noqa: E402

CORPUS = [
    {"_id": "a1", "title": "Apples", "text": "Apples are red or green fruit grown in orchards."},
    {"_id": "a2", "title": "Pears", "text": "Pears are sweet fruit related to apples."},
    {"_id": "a3", "title": "Plums", "text": "Plums are purple stone fruit."},
    {"_id": "a4", "title": "Apples", "text": "Apples are red or green fruit grown in orchards."},  # a1's text
]


class CachedFake(AttributeServing):
    """A cached-mode reranker in miniature (:class:`heedrank.protocols.BlockCachingReranker`):
    blocks keyed by the hash of the text, ``(layer + 1, 1, 1, 2)`` arrays, read from and
    written back to the store; scores are text lengths."""

    def __init__(self, config: Any) -> None:
        self.layer = int(dict(config.options).get("layer", 1))

    @classmethod
    def from_config(cls, config: Any) -> CachedFake:
        return cls(config)

    def block_store_header(self) -> dict[str, Any]:
        return {"model_hash": "fake-model", "prompt_template_version": "t1", "instruction_hash": "i0",
                "layer": self.layer, "kv_heads": 1, "head_dim": 2, "max_doc_tokens": 8, "dtype": "float16",
                "adapter_hash": None}

    def block_keys(self, texts: Sequence[str]) -> list[str]:
        return [hashlib.sha256(t.encode()).hexdigest()[:20] for t in texts]

    def encode_block_arrays(self, texts: Sequence[str]) -> list[tuple[str, Any, Any]]:
        out = []
        for key, text in zip(self.block_keys(texts), texts):
            k = np.full((self.layer + 1, 1, 1, 2), len(text), dtype=np.float32)
            out.append((key, k, -k))
        return out

    def rerank(self, query: Query, candidates: Sequence[Document], *, block_store: Any = None) -> RerankResult:
        keys = self.block_keys([c.content for c in candidates])
        hits = misses = 0
        if block_store is not None:
            found, missing = block_store.get_many(keys)
            hits, misses = len(found), len(missing)
            todo = [c.content for c, k in zip(candidates, keys) if k in set(missing)]
            if todo:
                block_store.put_many({k: (kk, vv) for k, kk, vv in self.encode_block_arrays(todo)})
        scores = {c.doc_id: float(len(c.text)) for c in candidates}
        return RerankResult(Ranking.from_scores(query.query_id, scores), cache={"hits": hits, "misses": misses})

    def describe(self) -> dict[str, Any]:
        return {"method": "cachedfake", "layer": self.layer}


class _Config:
    def __init__(self, options: dict[str, Any] | None = None) -> None:
        self.options = options or {}


@pytest.fixture
def cached_fake(monkeypatch):
    monkeypatch.setitem(registry._RERANKERS, "cachedfake", CachedFake)
    return CachedFake


@pytest.fixture
def index_dir(tmp_path):
    from heedrank.index.builder import build_index

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in CORPUS), encoding="utf-8")
    build_index(corpus, tmp_path / "ix", dense=False, show_progress=False)
    return tmp_path / "ix"


def _build_store(index_dir, reranker) -> list[str]:
    """``index kv build`` with ``reranker``; the stored block keys."""
    from heedrank.index.kv import build_index_blocks
    from heedrank.index.store import Index

    ix = Index.open(index_dir)
    try:
        store, _ = build_index_blocks(ix, reranker)
        return sorted(store.keys())
    finally:
        ix.close()


def _client(index_dir, method="cachedfake", options=None, **kw):
    from fastapi.testclient import TestClient

    from heedrank.api.app import create_app
    from heedrank.settings import Settings

    kw.setdefault("fill_blocks", False)  # the background fill has its own tests below
    settings = Settings(index=str(index_dir), rerank_method=method, rerank_options=options or {}, warmup=False, **kw)
    return TestClient(create_app(settings))


def _stored(client, method: str = "cachedfake") -> set[str]:
    pipeline = client.app.state.pipeline
    reranker = pipeline.rerankers.get(method)[0]
    return set(pipeline.index.block_store(reranker.block_store_header()).keys())


def test_delete_drops_the_documents_block(cached_fake, index_dir):
    fake = CachedFake(_Config())
    key = dict(zip(["a1", "a2", "a3", "a4"], fake.block_keys([f"{r['title']} {r['text']}" for r in CORPUS])))
    assert key["a1"] == key["a4"] and len(_build_store(index_dir, fake)) == 3
    with _client(index_dir) as c:
        assert c.app.state.runtime.wait_ready(10) and c.app.state.runtime.status == "ok"
        assert _stored(c) == {key["a1"], key["a2"], key["a3"]}
        r = c.delete("/documents/a2")
        assert r.status_code == 200, r.text
        assert _stored(c) == {key["a1"], key["a3"]}  # dropped before the answer
        # a1 shares its block with a4: deleting a1 drops it; a4's next search recomputes it
        assert c.delete("/documents/a1").status_code == 200
        assert _stored(c) == {key["a3"]}
        r = c.post("/search", json={"query": "apples orchards", "top_k": 2, "retriever": "bm25",
                                    "rerank": {"method": "cachedfake", "candidates": 2}})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["results"][0]["doc_id"] == "a4" and body["rerank"]["cache"]["misses"] == 1
        assert _stored(c) == {key["a3"], key["a4"]}
        assert c.delete("/documents/a2").status_code == 404  # already gone: nothing else changes
    from heedrank.index.kv import KVHeader, KVStore

    with KVStore.open(index_dir / "kv", KVHeader.from_dict(fake.block_store_header()), readonly=True) as store:
        assert set(store.keys()) == {key["a3"], key["a4"]}  # durable


def test_delete_without_a_store_or_a_cached_reranker(cached_fake, index_dir):
    with _client(index_dir) as c:  # cached reranker, no store: nothing is created
        assert c.app.state.runtime.wait_ready(10)
        assert c.delete("/documents/a2").status_code == 200
    assert not (index_dir / "kv").exists()
    fake = CachedFake(_Config())
    keys = _build_store(index_dir, fake)
    assert len(keys) == 2  # a1 and a4 share one block, a3
    with _client(index_dir, method="none") as c:  # no cached reranker built: the store is left alone
        assert c.delete("/documents/a3").status_code == 200
    from heedrank.index.kv import KVHeader, KVStore

    with KVStore.open(index_dir / "kv", KVHeader.from_dict(fake.block_store_header()), readonly=True) as store:
        assert sorted(store.keys()) == keys  # a3's block is stale until `index kv build --prune`


def test_startup_fails_on_a_store_of_another_configuration(cached_fake, index_dir):
    _build_store(index_dir, CachedFake(_Config({"layer": 1})))
    with _client(index_dir, options={"layer": 2}) as c:
        runtime = c.app.state.runtime
        assert runtime.wait_ready(10) and runtime.status == "failed"
        health = c.get("/health")
        assert health.status_code == 503
        error = health.json()["error"]
        assert "collection 'default'" in error and "layer" in error and "heedrank index kv build" in error
        assert "--layer 2" in error
        r = c.post("/search", json={"query": "apples", "retriever": "bm25", "rerank": {"method": "cachedfake"}})
        assert r.status_code == 503 and "heedrank index kv build" in r.json()["error"]
    with _client(index_dir, options={"layer": 1}) as c:  # the store's own configuration starts
        assert c.app.state.runtime.wait_ready(10) and c.app.state.runtime.status == "ok"


def test_startup_check_with_the_real_blockrank(index_dir):
    """The real cached BlockRank: a store built at layer 3 and a service configured for layer 4."""
    pytest.importorskip("torch")
    from heedrank.config import RerankerConfig

    options = {"scoring": "signal", "query_adapter": None, "layer": 3}
    _build_store(index_dir, registry.build_reranker(RerankerConfig(method="blockrank-cached", max_doc_tokens=32,
                                                                   options=options)))
    with _client(index_dir, method="blockrank-cached", options={**options, "layer": 4}, max_doc_tokens=32) as c:
        runtime = c.app.state.runtime
        assert runtime.wait_ready(300) and runtime.status == "failed"
        error = c.get("/health").json()["error"]
        assert "index kv build" in error and "--layer 4" in error and "layer: stored 3, expected 4" in error


class ColdAwareFake(CachedFake):
    """:class:`CachedFake` that says which candidates are cold (not in the store), as cached
    BlockRank does, so that a recompute budget applies."""

    def cold_candidates(self, candidates: Sequence[Document], block_store: Any = None) -> list[bool]:
        keys = self.block_keys([c.content for c in candidates])
        return [block_store is None or not block_store.contains(k) for k in keys]


def _wait(predicate, seconds: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_a_cold_store_answers_at_once_and_fills_in_the_background(monkeypatch, index_dir):
    """No store at start-up: a search with a budget of 0 reranks nothing and keeps the first
    stage (saying so), the background fill stores every document's block, and then the same
    search is fully reranked; a restart finds the store filled and encodes nothing."""
    from heedrank.api.fill import BlockFiller

    monkeypatch.setitem(registry._RERANKERS, "coldfake", ColdAwareFake)
    monkeypatch.setattr(BlockFiller, "scan_chunk", 1)
    body = {"query": "apples fruit", "top_k": 3, "retriever": "bm25",
            "rerank": {"method": "coldfake", "candidates": 3, "cold_budget": 0}}
    gate = __import__("threading").Event()
    real_scan = BlockFiller._scan

    def held_scan(self):  # the fill's document scan waits for the test's first search
        gate.wait(10)
        yield from real_scan(self)

    monkeypatch.setattr(BlockFiller, "_scan", held_scan)
    with _client(index_dir, method="coldfake", fill_blocks=True) as c:
        runtime = c.app.state.runtime
        assert runtime.wait_ready(10) and runtime.status == "ok"
        first = c.post("/search", json=body).json()
        assert first["rerank"]["reranked"] == 0 and first["rerank"]["skipped_cold"] == 3
        assert all(h["reranked"] is False and h["score"] is None for h in first["results"])  # nothing to read
        plain = c.post("/search", json={**body, "rerank": False}).json()
        assert [h["doc_id"] for h in first["results"]] == [h["doc_id"] for h in plain["results"]]  # first stage kept
        gate.set()
        filler = runtime.fillers["default"]
        _wait(lambda: filler.scan_done and filler.queued() == 0)
        assert len(_stored(c, "coldfake")) == 3  # a1 and a4 share one block
        kv = c.get("/info").json()["collections"]["default"]["kv_store"]
        assert kv["blocks"] == 3 and kv["scan_done"] and not kv["filling"] and kv["disk_budget"] is None
        again = c.post("/search", json=body).json()
        assert again["rerank"]["reranked"] == 3 and again["rerank"]["skipped_cold"] == 0
        assert all(h["reranked"] and h["score"] is not None for h in again["results"])
        unlimited = c.post("/search", json={**body, "rerank": {**body["rerank"], "cold_budget": "unlimited"}})
        assert unlimited.status_code == 200 and unlimited.json()["rerank"]["skipped_cold"] == 0
    with _client(index_dir, method="coldfake", fill_blocks=True) as c:
        runtime = c.app.state.runtime
        assert runtime.wait_ready(10)
        filler = runtime.fillers["default"]
        _wait(lambda: filler.scan_done)
        assert filler.filled == 0


def test_the_fill_yields_to_requests(monkeypatch, index_dir):
    """While a request is in flight the fill encodes nothing; it resumes when the service is idle."""
    from heedrank.api.fill import BlockFiller

    monkeypatch.setitem(registry._RERANKERS, "coldfake", ColdAwareFake)
    with _client(index_dir, method="coldfake") as c:  # no fill at start-up: driven by hand below
        runtime = c.app.state.runtime
        assert runtime.wait_ready(10)
        pipeline = c.app.state.pipeline
        reranker, lock = pipeline.rerankers.get("coldfake")
        cache = pipeline.rerankers
        with cache._idle:
            cache._active += 1  # a request in flight
        filler = BlockFiller(pipeline.index, reranker, lock, cache).start()
        try:
            import time

            time.sleep(0.3)
            assert filler.filled == 0 and not _stored(c, "coldfake")
            with cache._idle:
                cache._active -= 1
                cache._idle.notify_all()
            _wait(lambda: filler.scan_done)
            filler.stop()
            assert filler.filled == 3 and len(_stored(c, "coldfake")) == 3
        finally:
            filler.stop()


def test_the_fill_stops_at_the_disk_budget(monkeypatch, index_dir):
    """A store with room for fewer than the three distinct blocks: the fill stores what fits, counting
    each block at the largest a block can be, and stops its scan; the store never passes its budget."""
    monkeypatch.setitem(registry._RERANKERS, "coldfake", ColdAwareFake)
    largest = 128  # a fake block of 8 tokens: (2, 1, 8, 2) float16 keys and values
    with _client(index_dir, method="coldfake", fill_blocks=True, kv_disk_bytes=2 * largest) as c:
        runtime = c.app.state.runtime
        assert runtime.wait_ready(10)
        filler = runtime.fillers["default"]
        _wait(lambda: filler.at_budget)
        stats = filler.store.stats()
        assert 1 <= stats.blocks < 3 and stats.live_bytes <= 2 * largest and not filler.scan_done


NEW_DOCS = [{"id": "n1", "title": "Quinces", "text": "Quinces are hard yellow fruit."},
            {"id": "n2", "title": "Figs", "text": "Figs grow in warm climates."},
            {"id": "n3", "title": "Dates", "text": "Dates grow on palms."}]


def _new_keys() -> set[str]:
    return set(CachedFake(_Config()).block_keys([f"{d['title']} {d['text']}" for d in NEW_DOCS]))


@pytest.mark.parametrize("fill", [True, False], ids=["through-the-fill", "fill-off"])
def test_upserted_documents_blocks_wait_while_a_request_runs_and_are_stored_after(monkeypatch, index_dir, fill):
    """``POST /documents`` is answered at once; its documents' blocks are encoded in the background
    only once no request is in flight: through the fill's queue when the fill runs, else in the
    ingest pool (the fill off). While a rerank request is held, none is stored; after it, all are."""
    from api_fakes import HeldRequest

    monkeypatch.setitem(registry._RERANKERS, "coldfake", ColdAwareFake)
    with _client(index_dir, method="coldfake", fill_blocks=fill, fill_hold_s=0.1) as c:
        runtime = c.app.state.runtime
        assert runtime.wait_ready(10) and runtime.status == "ok"
        if fill:
            filler = runtime.fillers["default"]
            _wait(lambda: filler.scan_done)
        else:
            assert not runtime.fillers
        request = HeldRequest(runtime.pools["rerank"]).start()
        try:
            r = c.post("/documents", json={"documents": NEW_DOCS})
            assert r.status_code == 200, r.text
            if fill:
                _wait(lambda: filler.paused)  # the fill took the first new block and waits
            import time

            time.sleep(0.5)  # five holds
            assert not (_stored(c, "coldfake") & _new_keys())
        finally:
            request.release()
        _wait(lambda: _new_keys() <= _stored(c, "coldfake"))
        assert c.get("/info").status_code == 200

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

CORPUS = [
    {"_id": "a1", "title": "Apples", "text": "Apples are red or green fruit grown in orchards."},
    {"_id": "a2", "title": "Pears", "text": "Pears are sweet fruit related to apples."},
    {"_id": "a3", "title": "Plums", "text": "Plums are purple stone fruit."},
    {"_id": "a4", "title": "Apples", "text": "Apples are red or green fruit grown in orchards."},  # a1's text
]


class CachedFake:
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
        return RerankResult(Ranking.from_scores(query.query_id, scores), details={"cache": {"hits": hits, "misses": misses}})

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

    settings = Settings(index=str(index_dir), rerank_method=method, rerank_options=options or {}, warmup=False, **kw)
    return TestClient(create_app(settings))


def _stored(client) -> set[str]:
    pipeline = client.app.state.pipeline
    reranker = pipeline.rerankers.get("cachedfake")[0]
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

"""/search end to end on real data: a BM25 index of the first 60 NFCorpus documents and the
packaged LM reranking 5 candidates with ICR (about 5-25 s to load the LM, ~2 s a query)."""

from __future__ import annotations

import gzip
import itertools
import json

import pytest

N_DOCS = 60


@pytest.fixture(scope="module")
def real_client(nfcorpus_dir, tmp_path_factory):
    from fastapi.testclient import TestClient

    from heedrank.api.app import create_app
    from heedrank.settings import Settings
    from heedrank.index.builder import build_index

    root = tmp_path_factory.mktemp("nfcorpus60")
    corpus = root / "corpus.jsonl"
    with gzip.open(nfcorpus_dir / "corpus.jsonl.gz", "rt", encoding="utf-8") as src:
        lines = list(itertools.islice(src, N_DOCS))
    corpus.write_text("".join(lines), encoding="utf-8")
    ids = {json.loads(line)["_id"] for line in lines}
    build_index(corpus, root / "index", dense=False, show_progress=False)

    settings = Settings(index=str(root / "index"), rerank_method="icr", preload=True)
    with TestClient(create_app(settings)) as client:
        assert client.app.state.runtime.wait_ready(300)  # the LM loads in the background
        assert client.app.state.runtime.status == "ok"
        assert "icr" in client.app.state.pipeline.loaded_rerankers()  # preloaded at start-up
        yield client, ids


def test_health_real(real_client):
    client, _ = real_client
    assert client.get("/health").json() == {"status": "ok"}


def test_search_with_icr_rerank(real_client):
    client, ids = real_client
    k = 5
    r = client.post(
        "/search",
        json={"query": "peppermint oil for irritable bowel syndrome", "top_k": k,
              "rerank": {"method": "icr", "candidates": 5}},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    hits = body["results"]
    doc_ids = [h["doc_id"] for h in hits]
    scores = [h["raw_score"] for h in hits]
    assert len(hits) == k
    assert len(set(doc_ids)) == k
    assert set(doc_ids) <= ids
    assert scores == sorted(scores, reverse=True)
    assert all(h["title"] and h["text"] for h in hits)
    info = body["rerank"]
    assert info["method"] == "icr" and info["candidates"] == 5
    assert 0 <= info["truncated"] <= info["candidates"]  # a count of the candidates over the budget
    assert info["doc_tokens"] == client.app.state.pipeline.reranker("icr").config.max_doc_tokens > 0
    assert info["prompt_tokens"] > 0
    assert body["timings"]["rerank"] > 0


def test_first_stage_and_reranked_share_the_candidates(real_client):
    client, _ = real_client
    query = {"query": "irritable bowel syndrome treatment", "top_k": 5}
    base = client.post("/search", json={**query, "rerank": False}).json()
    assert base["rerank"] is None
    reranked = client.post("/search", json={**query, "rerank": {"method": "icr", "candidates": 5}}).json()
    assert {h["doc_id"] for h in base["results"]} == {h["doc_id"] for h in reranked["results"]}


def test_explain_gives_evidence_spans_of_the_text(real_client):
    client, _ = real_client
    r = client.post("/search", json={"query": "breast cancer risk", "top_k": 3, "explain": True,
                                     "rerank": {"method": "icr", "candidates": 3}})
    assert r.status_code == 200, r.text
    for hit in r.json()["results"]:
        assert hit["evidence"], hit["doc_id"]
        for span in hit["evidence"]:
            value = hit["title"] if span["field"] == "title" else hit["text"]
            assert value[span["start"]:span["end"]] == span["text"]


def test_cohere_rerank_real(real_client):
    client, _ = real_client
    docs = ["Peppermint oil relieves symptoms of irritable bowel syndrome in trials.",
            "The Eiffel Tower is in Paris.", "Bowel symptoms improved with peppermint."]
    r = client.post("/rerank", json={"model": "icr", "query": "peppermint oil for IBS", "documents": docs,
                                     "return_documents": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert sorted(x["index"] for x in body["results"]) == [0, 1, 2]
    assert body["results"][-1]["index"] == 1  # the off-topic document last
    assert body["meta"]["reranked"] and body["meta"]["tokens"]["input_tokens"] > 0

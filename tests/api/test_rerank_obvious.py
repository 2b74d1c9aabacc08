"""Obvious cases through ``POST /rerank`` with the default reranker (the packaged LM): one
relevant document among 2, 3, 5 and 10 off-topic ones, sent in every position, ranks first with
no options, and through the official Cohere SDK with ``model="rerank-v3.5"``. Identical texts
share one score."""

from __future__ import annotations

import json

import pytest

from heedrank.api.app import create_app
from live_server import serve

CASES = [
    ("What is the boiling point of water at sea level?",
     "At sea level, pure water boils at 100 degrees Celsius, which is 212 degrees Fahrenheit."),
    ("Which vitamin deficiency causes scurvy?",
     "Scurvy is caused by a lack of vitamin C in the diet; it was common among sailors."),
]
OFF_TOPIC = [
    "Tide tables list the times of high and low tide for coastal towns.",
    "The stock market closed higher on Friday after strong earnings reports.",
    "Cats are small domesticated carnivorous mammals often kept as pets.",
    "Rome is the capital city of Italy and was founded, by legend, in 753 BC.",
    "The violin has four strings tuned in perfect fifths.",
    "Basketball teams have five players each on the court.",
    "The Eiffel Tower was completed in 1889 for the World's Fair in Paris.",
    "Chess is played on a board of sixty-four squares.",
    "A haiku is a short poem of three lines with five, seven and five syllables.",
    "Copper is a good conductor of electricity and is used in wiring.",
]


def _served(tmp_path_factory, name: str, **settings):
    """A live service with the default reranker over a one-document BM25 index."""
    pytest.importorskip("torch")
    from heedrank.index.builder import build_index
    from heedrank.settings import Settings

    tmp = tmp_path_factory.mktemp(name)
    corpus = tmp / "corpus.jsonl"
    corpus.write_text(json.dumps({"_id": "d1", "title": "", "text": "unused"}) + "\n", encoding="utf-8")
    build_index(corpus, tmp / "index", dense=False, show_progress=False)
    with serve(create_app(Settings(index=str(tmp / "index"), rerank_method="default", warmup=False,
                                   **settings))) as base:
        yield base


@pytest.fixture(scope="module")
def base_url(tmp_path_factory):
    yield from _served(tmp_path_factory, "obvious")


def _lists():
    for query, relevant in CASES:
        for n_off in (2, 3, 5, 10):
            for position in range(n_off + 1):
                docs = list(OFF_TOPIC[:n_off])
                docs.insert(position, relevant)
                yield query, docs, position


def test_the_relevant_document_ranks_first_in_every_position(base_url):
    import httpx

    misses = []
    with httpx.Client(base_url=base_url, timeout=300) as client:
        for query, docs, position in _lists():
            r = client.post("/rerank", json={"query": query, "documents": docs})
            assert r.status_code == 200, r.text
            first = r.json()["results"][0]["index"]
            if first != position:
                misses.append((query[:30], len(docs), position, first))
    assert not misses, f"the relevant document was not first in {len(misses)} lists: {misses}"


def test_the_cohere_sdk_with_a_real_model_name(base_url):
    cohere = pytest.importorskip("cohere")
    client = cohere.ClientV2(api_key="unused", base_url=base_url, timeout=300)
    query, relevant = CASES[0]
    for n_off in (2, 5, 10):
        docs = OFF_TOPIC[:n_off] + [relevant]  # the relevant document sent last
        res = client.rerank(model="rerank-v3.5", query=query, documents=docs)
        assert res.results[0].index == n_off
        assert all(0.0 <= r.relevance_score <= 1.0 for r in res.results)
        assert res.meta.model_extra["method"] == "blockrank-cached"
        assert not any("not a model id" in w for w in (res.meta.warnings or []))


def test_identical_texts_share_one_score(base_url):
    import httpx

    query, relevant = CASES[0]
    docs = [relevant, relevant, OFF_TOPIC[0], OFF_TOPIC[1]]
    with httpx.Client(base_url=base_url, timeout=300) as client:
        body = client.post("/rerank", json={"query": query, "documents": docs}).json()
    by_index = {r["index"]: r["relevance_score"] for r in body["results"]}
    assert by_index[0] == by_index[1]
    assert [r["index"] for r in body["results"]][:2] == [0, 1]


@pytest.fixture(scope="module")
def independent_url(tmp_path_factory):
    yield from _served(tmp_path_factory, "independent", rerank_options={"scoring": "independent"})


def test_independent_scoring_gives_one_relevance_score_wherever_a_document_is_sent(independent_url):
    """With ``scoring=independent`` (a service option) a document's ``relevance_score`` is the same
    alone and in any list and position, and results come in that order."""
    import httpx

    query, relevant = CASES[1]
    with httpx.Client(base_url=independent_url, timeout=300) as client:
        alone = client.post("/rerank", json={"query": query, "documents": [relevant]}).json()["results"][0]
        for n_off, position in ((2, 0), (5, 3), (10, 10)):
            docs = list(OFF_TOPIC[:n_off])
            docs.insert(position, relevant)
            body = client.post("/rerank", json={"query": query, "documents": docs}).json()
            scores = [r["relevance_score"] for r in body["results"]]
            assert scores == sorted(scores, reverse=True)
            assert body["results"][0]["index"] == position
            assert body["results"][0]["relevance_score"] == pytest.approx(alone["relevance_score"], abs=1e-6)

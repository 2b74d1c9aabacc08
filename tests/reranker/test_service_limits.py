"""Requests inside the limits /info states succeed, end to end through the API
with the real small LM and a small fake window, and /info lists every method's options."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")

from heedrank.config import RerankerConfig  # noqa: E402
from heedrank.pipeline import Pipeline, reranker_factory  # noqa: E402
from heedrank.settings import Settings  # noqa: E402
from heedrank.types import Document, Query, Ranking  # noqa: E402

DOCS = [Document(f"p{i:02d}", f"{text} {text}") for i, text in enumerate([  # ~25 tokens each
    "Water boils at 100 degrees Celsius at sea level.",
    "Cats are small domesticated carnivorous mammals.",
    "Rome is the capital city of Italy.",
    "The guitar is a fretted musical instrument.",
    "A volcano is a rupture in the crust of a planet.",
    "Bread is a staple food prepared from a dough.",
    "Tennis is a racket sport played between two players.",
    "Ice melts at 0 degrees Celsius under normal pressure.",
    "The Moon is Earth's only natural satellite.",
    "Tea is brewed by pouring boiling water over leaves.",
])]


class AllDocs:
    """First stage returning every document, scored by its position (a stand-in for BM25)."""

    name = "bm25"

    def retrieve(self, queries: Sequence[Query], k: int, *, filter=None) -> list[Ranking]:
        return [Ranking.from_scores(q.query_id, {d.doc_id: 1.0 / (1 + i) for i, d in enumerate(DOCS)}, k)
                for q in queries]


@pytest.fixture(scope="module")
def client(default_lm):
    from fastapi.testclient import TestClient

    from heedrank.api.app import create_app
    from heedrank.index.memory import InMemoryDocStore

    base = RerankerConfig(method="icr", max_doc_tokens=32, options={"window_tokens": 256})
    pipeline = Pipeline(retrievers={"bm25": AllDocs()}, docstore=InMemoryDocStore(DOCS),
                        reranker_factory=reranker_factory(base), max_top_k=20, max_candidates=10)
    settings = Settings(index="unused", rerank_method="icr", max_doc_tokens=32, max_candidates=10,
                        max_documents=10, default_candidates=10, warmup=False)
    with TestClient(create_app(settings, pipeline=pipeline)) as c:
        assert c.app.state.runtime.wait_ready(60)
        yield c


def test_rerank_and_search_at_the_limits_succeed_in_windows(client):
    info = client.get("/info").json()
    limits = info["reranker"]["limits"]
    assert limits["icr"]["window_tokens"] == 256 and limits["icr"]["max_query_tokens"] == 64
    assert limits["icr"]["max_documents"] == 10 and limits["icr"]["max_candidates"] == 10
    assert limits["icr"]["candidates_per_window"] < 10  # one prompt cannot hold them: windows must
    assert {o["name"] for o in info["reranker"]["options"]["blockrank"]} >= {"layer", "doc_labels"}
    assert {o["name"] for o in info["reranker"]["options"]["blockrank-cached"]} >= {"layer", "kv_dtype", "query_adapter"}
    long_query = "what temperature does water boil at " * 110  # ~4,000 characters
    r = client.post("/rerank", json={"query": long_query[:4000], "documents": [d.text for d in DOCS]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert sorted(x["index"] for x in body["results"]) == list(range(10))
    warnings = " ".join(body["meta"]["warnings"])
    assert "query cut to its first 64 of" in warnings and "windows" in warnings
    r = client.post("/search", json={"query": "boiling water", "top_k": 10, "rerank": {"candidates": 10}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert sorted(h["doc_id"] for h in body["results"]) == [d.doc_id for d in DOCS]
    assert any("windows" in w for w in body["rerank"]["warnings"])


def test_unknown_option_in_a_search_is_a_422(client):
    r = client.post("/search", json={"query": "water", "rerank": {"method": "blockrank", "heads": "learned"}})
    assert r.status_code == 422 and "ICR only" in r.json()["error"]

"""Requests inside the limits /info states succeed, end to end through the API
with the real small LM and a small fake window, and /info lists every method's options."""

from __future__ import annotations

import logging
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
                        max_documents=10, default_candidates=10, warmup=False,
                        request_budget_s=None)  # a busy machine's slow windows are not what is tested here
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


# The longest query of each evaluation set with the SmolLM2 tokenizer (NFCorpus 34 tokens, TREC DL 2019 13,
# 2021 33, 2022 15; SciFact's second longest, 45: its longest, 66, is the one query of these sets the default
# 64-token budget cuts) and a few ordinary ones: the default query budget never cuts them.
ORDINARY_QUERIES = [
    "Do algae-based omega-3 supplements contain beta-N-methylamino-L-alanine (BMAA) that has been found in "
    "blue-green algae?",
    "FACT and other histone chaperone(s) compensate for Histone 2A (H2A)-histone 2B (H2B) dimer eviction during "
    "the histone exchange process.",
    "why did the us volunterilay enter ww1",
    "which scientist developed the idea that microorganisms can cause diseases?paul ehrlichanton van "
    "leeuwenhoeklouis pasteuralexander fleming",
    "how often should you take your toddler to the potty when potty training",
    "Breast Cancer Cells Feed on Cholesterol",
    "do goldfish grow",
]


@pytest.fixture(scope="module")
def cached(default_lm):
    from heedrank.reranker.cached import CachedBlockRankReranker

    return CachedBlockRankReranker(RerankerConfig(method="blockrank-cached"), lm=default_lm).load()


def test_the_default_query_budget_cuts_a_pasted_page_to_64_tokens_with_a_warning(cached, caplog):
    from heedrank.reranker.blockrank import BlockRankReranker
    from heedrank.reranker.icr import ICRReranker
    from heedrank.reranker.options import DEFAULT_MAX_QUERY_TOKENS
    from heedrank.reranker.prompt import encode_untrusted

    assert DEFAULT_MAX_QUERY_TOKENS == 64
    page = ("Vitamin D supplementation and the risk of fractures in older adults: a systematic review. " * 50)[:4000]
    lm = cached.base_lm
    others = [BlockRankReranker(RerankerConfig(method="blockrank"), lm=lm), ICRReranker(RerankerConfig(method="icr"), lm=lm)]
    for reranker in [cached, *others]:
        assert reranker.query_budget(DOCS[:3]) == 64, reranker.name
        with caplog.at_level(logging.INFO, logger="heedrank.reranker.base"):
            text, warnings = reranker.fit_query(page, DOCS[:3])
        n = len(encode_untrusted(lm.tokenizer, " " + text))
        assert 60 <= n <= 64 and page.startswith(text), (reranker.name, n)
        assert len(warnings) == 1 and warnings[0].startswith("query cut to its first 64 of "), warnings
        assert warnings[0] in caplog.text
    res = cached.rerank(Query("long", page), DOCS[:3])  # the cached default's own path: the cut and its warning
    assert sorted(res.ranking.doc_ids) == sorted(d.doc_id for d in DOCS[:3])
    assert any(w.startswith("query cut to its first 64 of ") for w in res.warnings)


def test_ordinary_queries_are_never_cut_so_rankings_are_unchanged(cached):
    from heedrank.reranker.base import AttentionReranker

    for q in ORDINARY_QUERIES:
        assert cached.fit_query(q, DOCS[:3]) == (q, []), q
    res = cached.rerank(Query("q", ORDINARY_QUERIES[1]), DOCS[:4])
    assert not [w for w in res.warnings if "query cut" in w]
    # the oracle: the budget of before (a quarter of the context, 2,048 tokens) ranks them the same
    before = AttentionReranker.query_budget
    try:
        AttentionReranker.query_budget = lambda self, candidates: max(1, self.context_limit() // 4)  # type: ignore
        old = cached.rerank(Query("q", ORDINARY_QUERIES[1]), DOCS[:4])
    finally:
        AttentionReranker.query_budget = before  # type: ignore[method-assign]
    assert old.ranking.to_dict() == pytest.approx(res.ranking.to_dict())

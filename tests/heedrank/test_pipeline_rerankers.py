"""Pipeline rerankers built per (method, options), cached, shared between pipelines."""

from __future__ import annotations

import pytest

from heedrank.errors import ValidationError
from heedrank.pipeline import Pipeline, RerankerCache, SearchOptions, options_key
from heedrank.protocols import RerankResult
from heedrank.types import Document, Query, Ranking

DOCS = [Document("a", "alpha"), Document("b", "beta beta"), Document("c", "gamma gamma gamma")]


class Rec:
    def __init__(self, method, options=None, max_doc_tokens=None):
        self.name, self.options, self.max_doc_tokens = method, dict(options or {}), max_doc_tokens

    def rerank(self, query, candidates):
        return RerankResult(Ranking.from_scores(query.query_id, {d.doc_id: float(len(d.text)) for d in candidates}),
                            details={"options": self.options})

    def rerank_batch(self, queries, candidates):
        return [self.rerank(q, c) for q, c in zip(queries, candidates)]

    def describe(self):
        return {"method": self.name, "options": self.options}


class Retr:
    name = "r"

    def retrieve(self, queries, k, *, filter=None):
        return [Ranking.from_scores(q.query_id, {"a": 3.0, "b": 2.0, "c": 1.0}, k) for q in queries]


def _pipeline(factory, **kw):
    from heedrank.index.memory import InMemoryDocStore

    return Pipeline(retrievers={"r": Retr()}, docstore=InMemoryDocStore(DOCS), reranker_factory=factory, **kw)


def test_options_key_is_canonical():
    assert options_key({"b": 1, "a": [1, 2]}) == options_key({"a": [1, 2], "b": 1}) == '{"a":[1,2],"b":1}'
    assert options_key(None) == options_key({}) == "{}"
    with pytest.raises(ValidationError):
        options_key({"x": object()})


def test_one_reranker_per_distinct_options():
    built = []

    def factory(method, options=None, max_doc_tokens=None):
        built.append((method, options, max_doc_tokens))
        return Rec(method, options, max_doc_tokens)

    cache = RerankerCache(factory)
    default = cache.get("icr")[0]
    assert cache.get("icr")[0] is default and built == [("icr",  None, None)]
    qr = cache.get("icr", {"heads": "qr"})[0]
    assert cache.get("icr", {"heads": "qr"})[0] is qr and qr is not default
    assert qr.options == {"heads": "qr"}
    short = cache.get("icr", None, 32)[0]
    assert short.max_doc_tokens == 32
    assert len(built) == 3
    assert set(cache.loaded()) == {"icr", 'icr{"heads":"qr"}', "icr[max_doc_tokens=32]"}


def test_non_default_entries_are_lru_bounded_defaults_kept():
    cache = RerankerCache(lambda m, options=None, max_doc_tokens=None: Rec(m, options), max_entries=2)
    d = cache.get("icr")[0]
    for g in range(5):
        cache.get("icr", {"reattn": {"gamma": g}})
    assert len(cache.loaded()) == 3 and cache.get("icr")[0] is d


def test_name_only_factory_refuses_options():
    cache = RerankerCache(lambda m: Rec(m))
    assert cache.get("icr")[0].name == "icr"
    with pytest.raises(ValidationError, match="options are not supported"):
        cache.get("icr", {"heads": "qr"})


def test_search_passes_options_and_shares_the_cache():
    p1 = _pipeline(lambda m, options=None, max_doc_tokens=None: Rec(m, options))
    p2 = _pipeline(None, rerankers=p1.rerankers)
    opts = SearchOptions(top_k=3, retriever="r", rerank="icr", candidates=3, rerank_options={"heads": "qr"})
    r = p2.search(Query("q", "x"), opts)
    assert r.rerank.details["options"] == {"heads": "qr"}
    assert r.ranking.doc_ids == ["c", "b", "a"]
    assert p1.loaded_rerankers() == p2.loaded_rerankers()


def test_explain_needs_a_reranker_that_explains():
    p = _pipeline(lambda m, options=None, max_doc_tokens=None: Rec(m, options))
    with pytest.raises(ValidationError, match="explain is not supported"):
        p.search(Query("q", "x"), SearchOptions(top_k=3, retriever="r", rerank="icr", candidates=3, explain=True))

"""The records of a search: :class:`heedrank.results.SearchResult`'s JSON codec (what the Ray
engine ships: nothing dropped), the one reranking path (:meth:`Pipeline.rerank_documents`), and
``/search``'s score (relevance) never rising down the reranked hits."""

from __future__ import annotations

import json

import pytest

from heedrank.pipeline import Pipeline, SearchOptions
from heedrank.protocols import Reranked, RerankResult
from heedrank.results import SearchResult
from heedrank.types import Document, EvidenceSpan, Query, Ranking, ScoredDoc


class _Reverse:
    """A reranker that puts the first stage's last candidate first; 0.5 of an unset scale."""

    name = "reverse"
    score_scale = 2.0

    def rerank(self, query, candidates):
        return RerankResult(Ranking.from_hits(query.query_id, (ScoredDoc(d.doc_id, float(i), d)
                                                                for i, d in enumerate(candidates))),
                            cache={"hits": 1, "misses": len(candidates) - 1})

    def rerank_batch(self, queries, candidates):
        return [self.rerank(q, c) for q, c in zip(queries, candidates)]

    def describe(self):
        return {"method": self.name}


@pytest.fixture
def pipe() -> Pipeline:
    from heedrank.index.store import Index
    from heedrank.retriever.bm25 import BM25Retriever

    docs = [Document(f"d{i}", "apple " * (6 - i) + "pear", title=f"t{i}", metadata={"n": i}) for i in range(6)]
    ix = Index.from_documents(docs)
    return Pipeline({"bm25": BM25Retriever.from_index(ix)}, ix.docstore, reranker_factory=lambda method: _Reverse())


def test_a_search_result_survives_its_json_codec(pipe) -> None:
    result = pipe.search(Query("q", "apple"), SearchOptions(rerank="reverse", candidates=4, top_k=5, fusion=0.5))
    result = SearchResult(**{**vars(result), "probabilities": {"d1": 0.25}, "cutoff": 0.1, "missing": ("gone",),
                             "skipped": ("d3",), "doc_tokens": 128, "warnings": ("served: 1 of 4 without attention",),
                             "rerank": RerankResult(**{**vars(result.rerank), "details": {"timings": {"x": 1.5}},
                                                       "warnings": ("w",), "truncated": ("d0",),
                                                       "evidence": {"d0": [EvidenceSpan("text", 0, 5, "apple", 0.5)]}})})
    data = json.loads(json.dumps(result.to_json()))  # plain JSON, as the Ray actors send it
    docs = {h.doc_id: h.document for h in result.ranking.hits + result.rerank.ranking.hits}
    back = SearchResult.from_json(data, docs)
    assert back == result
    assert back.rerank.evidence["d0"][0] == EvidenceSpan("text", 0, 5, "apple", 0.5)
    assert back.rerank.cache == {"hits": 1, "misses": 3} and back.relevance == result.relevance
    assert all(h.document is not None for h in back.ranking.hits)
    assert back.warnings == ("served: 1 of 4 without attention",)


@pytest.mark.parametrize("fusion", [None, 0.5])
def test_search_scores_never_rise_down_the_reranked_hits(pipe, fusion) -> None:
    result = pipe.search(Query("q", "apple"), SearchOptions(rerank="reverse", candidates=5, top_k=6, fusion=fusion))
    reranked = [h.doc_id for h in result.ranking.hits if h.doc_id in set(result.rerank.ranking.doc_ids)]
    relevance = [result.relevance[d] for d in reranked]
    assert len(reranked) == 5 and relevance == sorted(relevance, reverse=True)
    assert result.doc_tokens is None  # the fake has no config
    assert result.rerank.cache == {"hits": 1, "misses": 4}


def test_rerank_documents_is_the_search_step(pipe) -> None:
    options = SearchOptions(rerank="reverse", candidates=4, top_k=4, fusion=0.5)
    search = pipe.search(Query("q", "apple"), options)
    given = search.first_stage.top(4).with_documents(pipe.docstore.get_many(search.first_stage.top(4).doc_ids))
    done = pipe.rerank_documents(Query("q", "apple"), given, options)
    assert isinstance(done.reranked, Reranked) and done.reranked.skipped == ()
    assert done.served.ranking.doc_ids == search.ranking.doc_ids
    assert done.served.relevance == pytest.approx(dict(search.relevance))
    assert done.policy.alpha == 0.5 and done.reranked.cache == {"hits": 1, "misses": 3}


def test_options_are_checked_once(pipe) -> None:
    options = pipe.validate(SearchOptions(rerank="reverse", candidates=4, cutoff="none"))
    assert options.checked == "search" and options.cutoff is None
    assert pipe.validate(options) is options and pipe.check_rerank(options) is options
    reranking = pipe.check_rerank(SearchOptions(rerank="reverse", fusion=0.5))
    assert reranking.checked == "rerank" and pipe.check_rerank(reranking) is reranking
    assert pipe.validate(reranking).checked == "search"  # the search's own checks still run

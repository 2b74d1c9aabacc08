"""The recompute budget (``SearchOptions.cold_budget``): which candidates are reranked, where the
skipped ones go (:func:`heedrank.serving.place_skipped`), and that they reach the background fill."""

from __future__ import annotations

import pytest

from heedrank.errors import ValidationError
from heedrank.pipeline import Pipeline, SearchOptions, _within_budget
from heedrank.protocols import RerankResult
from heedrank.serving import Served, place_skipped
from heedrank.types import Document, Query, Ranking, ScoredDoc
from serving_fakes import AttributeServing  # noqa: E402


def _ranking(pairs: list[tuple[str, float]]) -> Ranking:
    return Ranking("q", tuple(ScoredDoc(d, s) for d, s in pairs))


def test_skipped_candidates_keep_their_first_stage_positions() -> None:
    first = _ranking([("a", 9.0), ("b", 8.0), ("c", 7.0), ("d", 6.0), ("e", 5.0)])
    # b and d were skipped; the reranker ordered the others e, a, c
    served = Served(_ranking([("e", 2.0), ("a", 1.0), ("c", -1.0)]))
    placed = place_skipped(served, first, {"b", "d"})
    assert placed.ranking.doc_ids == ["e", "b", "a", "d", "c"]
    scores = [h.score for h in placed.ranking.hits]
    assert scores == sorted(scores, reverse=True) and len(set(scores)) == 5
    assert scores[0] == 2.0 and scores[2] == 1.0 and scores[4] == -1.0  # reranked scores as served
    assert scores[1] == pytest.approx(1.5) and scores[3] == pytest.approx(0.0)


def test_skipped_at_the_ends_and_nothing_reranked() -> None:
    first = _ranking([("a", 9.0), ("b", 8.0), ("c", 7.0), ("d", 6.0)])
    placed = place_skipped(Served(_ranking([("c", 0.5), ("b", 0.2)])), first, {"a", "d"})
    assert placed.ranking.doc_ids == ["a", "c", "b", "d"]
    assert [h.score for h in placed.ranking.hits] == pytest.approx([1.5, 0.5, 0.2, -0.8])
    assert place_skipped(Served(_ranking([])), first, {"a", "b", "c", "d"}).ranking == first
    assert place_skipped(Served(first), first, set()).ranking == first


def test_a_cut_list_refuses_skipped_candidates() -> None:
    first = _ranking([("a", 9.0), ("b", 8.0)])
    with pytest.raises(ValidationError):
        place_skipped(Served(_ranking([("a", 1.0)]), threshold=0.5), first, {"b"})


def test_within_budget_keeps_warm_and_the_first_cold_ones() -> None:
    docs = [Document(f"d{i}", f"text {i}") for i in range(6)] + [Document("d6", "text 1")]  # d6 shares d1's text
    cold = [False, True, True, False, True, True, True]
    kept, skipped = _within_budget(docs, cold, 2)
    assert [d.doc_id for d in kept] == ["d0", "d1", "d2", "d3", "d6"]  # d6: d1's block, already paid for
    assert [d.doc_id for d in skipped] == ["d4", "d5"]
    kept, skipped = _within_budget(docs, cold, 0)
    assert [d.doc_id for d in kept] == ["d0", "d3"] and len(skipped) == 5


class _ColdAware(AttributeServing):
    """A reranker that reverses the candidates and says documents with 'cold' in them are cold."""

    name = "reverse"

    def __init__(self) -> None:
        self.seen: list[list[str]] = []

    def cold_candidates(self, candidates, block_store=None):
        return ["cold" in d.content for d in candidates]

    def rerank(self, query, candidates):
        self.seen.append([d.doc_id for d in candidates])
        return RerankResult(Ranking.from_hits(query.query_id, (ScoredDoc(d.doc_id, float(i), d)
                                                                for i, d in enumerate(candidates))))

    def rerank_batch(self, queries, candidates):
        return [self.rerank(q, c) for q, c in zip(queries, candidates)]

    def describe(self):
        return {"method": self.name}


def test_the_pipeline_reranks_within_the_budget_and_hands_the_rest_to_the_fill() -> None:
    from heedrank.index.store import Index
    from heedrank.retriever.bm25 import BM25Retriever

    texts = ["apple apple apple apple pear", "apple apple apple cold pear", "apple apple warm pear",
             "apple cold pear", "apple warm plum"]
    ix = Index.from_documents([Document(f"d{i}", t) for i, t in enumerate(texts)])
    reranker = _ColdAware()
    pipe = Pipeline({"bm25": BM25Retriever.from_index(ix)}, ix.docstore, reranker_factory=lambda method: reranker)
    offered: list[list[str]] = []
    pipe._cache().cold_listener = lambda r, store, docs: offered.append([d.doc_id for d in docs])
    full = pipe.search(Query("q", "apple"), SearchOptions(rerank="reverse", candidates=5, top_k=5))
    first = full.first_stage.top(5).doc_ids
    cold = [d for d in first if "cold" in texts[int(d[1:])]]
    assert len(cold) == 2 and full.skipped == () and not offered

    part = pipe.search(Query("q", "apple"), SearchOptions(rerank="reverse", candidates=5, top_k=5, cold_budget=1))
    assert part.skipped == (cold[1],) and offered == [[cold[1]]]
    assert reranker.seen[-1] == [d for d in first if d != cold[1]]
    assert part.ranking.doc_ids.index(cold[1]) == first.index(cold[1])  # its first-stage slot
    assert sorted(part.ranking.doc_ids) == sorted(first)
    with pytest.raises(ValidationError, match="cold_budget"):
        pipe.search(Query("q", "apple"), SearchOptions(rerank="reverse", cold_budget=-1))


@pytest.mark.parametrize(("raw", "want"), [("4", 4), ("0", 0), ("unlimited", None), ("null", None), ("", None)])
def test_the_service_setting(monkeypatch, raw, want) -> None:
    from heedrank.settings import Settings

    monkeypatch.setenv("HEEDRANK_COLD_BUDGET", raw)
    assert Settings().cold_budget == want
    monkeypatch.delenv("HEEDRANK_COLD_BUDGET")
    assert Settings().cold_budget == 4  # the default


def test_the_default_scorer_scores_a_skipped_candidate_from_the_signals_at_hand() -> None:
    """With the default's scorer, a candidate over the cold budget is not left at its first-stage
    place: it is scored from the dense and first-stage signals (its model in the card), and the
    response says how many were scored without the LM."""
    from heedrank.index.cosines import DenseSignal
    from heedrank.index.hashing import HashingEncoder
    from heedrank.index.store import Index
    from heedrank.retriever.bm25 import BM25Retriever
    from heedrank.scorer import Scorer

    texts = ["apple apple apple apple pear", "apple apple apple cold pear", "apple apple warm pear",
             "apple cold pear", "apple warm plum"]
    ix = Index.from_documents([Document(f"d{i}", t) for i, t in enumerate(texts)], encoder=HashingEncoder(64))
    scorer = Scorer.from_card({"scorer": {"models": [
        {"uses": ["attention", "dense", "rank"], "weights": [1.0, 2.0, -0.1], "bias": -1.0},
        {"uses": ["dense", "rank"], "weights": [50.0, -0.1], "bias": -2.0}], "threshold": 0.5}})

    class Scored(_ColdAware):
        def __init__(self) -> None:
            super().__init__()
            self.scorer = scorer

    reranker = Scored()
    pipe = Pipeline({"bm25": BM25Retriever.from_index(ix)}, ix.docstore, reranker_factory=lambda method: reranker,
                    dense=DenseSignal.of_index(ix))
    res = pipe.search(Query("q", "apple cold"), SearchOptions(rerank="reverse", candidates=5, top_k=5, cold_budget=0))
    first = res.first_stage.top(5).doc_ids
    cold = [d for d in first if "cold" in texts[int(d[1:])]]
    assert sorted(res.skipped) == sorted(cold) and sorted(res.ranking.doc_ids) == sorted(first)
    # the cold candidates share the query's word 'cold': the dense model puts them first
    assert set(res.ranking.doc_ids[:2]) == set(cold)
    assert res.probabilities is not None and set(res.probabilities) == set(first)
    probs = [res.probabilities[d] for d in res.ranking.doc_ids]
    assert probs == sorted(probs, reverse=True) and res.relevance == res.probabilities

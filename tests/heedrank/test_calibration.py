"""The relevance cut-off (:mod:`heedrank.calibration`) and its use by the pipeline
(``SearchOptions.cutoff``)."""

from __future__ import annotations

import math

import pytest

from heedrank.calibration import AUTO, Calibration, PlattMap, apply_cutoff, features, resolve_cutoff
from heedrank.errors import ValidationError
from heedrank.pipeline import Pipeline, SearchOptions
from heedrank.types import Document, Query, Ranking, ScoredDoc
from serving_fakes import AttributeServing  # noqa: E402

MAP = PlattMap((1.0, -0.5, 0.2, -0.1), -1.0, 0.3)


def test_features_are_score_rank_top_and_count() -> None:
    f = features([2.0, 1.0, -1.0])
    assert f[0] == (2.0, 0.0, 2.0, pytest.approx(math.log(3)))
    assert f[2] == (-1.0, pytest.approx(math.log(3)), 2.0, pytest.approx(math.log(3)))
    assert features([]) == []


def test_probabilities_are_the_platt_map_made_non_increasing() -> None:
    scores = [2.0, 1.0, 1.9, -1.0]  # not sorted at 1..2: the running minimum keeps the prefix property
    probs = MAP.probabilities(scores)
    raw = [1 / (1 + math.exp(-(sum(w * x for w, x in zip(MAP.coef, f)) + MAP.intercept))) for f in features(scores)]
    assert probs[0] == pytest.approx(raw[0]) and probs[1] == pytest.approx(raw[1])
    assert raw[2] > raw[1] and probs[2] == pytest.approx(raw[1])
    assert all(a >= b for a, b in zip(probs, probs[1:])) and all(0 <= p <= 1 for p in probs)


def test_apply_cutoff_keeps_the_prefix_above_the_threshold() -> None:
    scores = [3.0, 1.0, 0.0, -2.0]
    probs, t, keep = apply_cutoff(scores, AUTO, MAP)
    assert t == 0.3 and keep == sum(p >= 0.3 for p in probs) and 0 < keep < 4
    assert apply_cutoff(scores, 0.0, MAP)[2] == 4 and apply_cutoff(scores, 1.0, MAP)[2] == 0


def test_a_map_warns_outside_the_counts_it_was_fitted_at() -> None:
    cal = Calibration.from_json({**Calibration(0.6, {"score": MAP}).to_json(), "counts": [20, 10, 50, 30]})
    plat = cal.map_for(0.6)
    assert plat.counts == (10, 50) and plat.extrapolation(10) is None and plat.extrapolation(50) is None
    assert "fitted on 10-50 candidates" in plat.extrapolation(4) and "with 4 " in plat.extrapolation(4)
    assert plat.extrapolation(100) is not None and MAP.extrapolation(1) is None  # no counts recorded: no warning


def test_resolve_cutoff() -> None:
    assert resolve_cutoff(None) is None and resolve_cutoff("none") is None and resolve_cutoff(" Auto ") == AUTO
    assert resolve_cutoff(0.25) == 0.25 and resolve_cutoff("0.5") == 0.5
    for bad in (1.5, -0.1, "high", True):
        with pytest.raises(ValidationError, match="cutoff must be a probability"):
            resolve_cutoff(bad)


def test_calibration_json_round_trip_and_map_for() -> None:
    cal = Calibration(0.6, {"score": MAP, "none": PlattMap((1.0, 0.0, 0.0, 0.0), 0.0, 0.5)}, {"note": "x"})
    back = Calibration.from_json(cal.to_json())
    assert back == cal
    assert back.map_for(0.6) is back.maps["score"] and back.map_for(None).threshold == 0.5
    with pytest.raises(ValidationError, match="calibrated only for fusion 0.6 \\(score\\), fusion none; got fusion 0.3"):
        back.map_for(0.3)
    with pytest.raises(ValidationError, match="got fusion 0.6"):
        back.map_for(0.6, by="rank")  # no map for /rerank's reciprocal-rank fusion
    with pytest.raises(ValidationError, match="features"):
        Calibration.from_json({**cal.to_json(), "features": ["score"]})
    with pytest.raises(ValidationError, match="threshold"):
        PlattMap((0.0,) * 4, 0.0, 1.0)


class _Calibrated(AttributeServing):
    """Scores candidates by position (the first stage's last candidate first) and carries a
    calibration whose probability falls with the score."""

    name = "calibrated"
    default_fusion = None
    calibration = Calibration(0.5, {"none": PlattMap((4.0, 0.0, 0.0, 0.0), 0.0, 0.5),
                                    "score": PlattMap((4.0, 0.0, 0.0, 0.0), 0.0, 0.5)})

    def rerank(self, query, candidates):
        from heedrank.protocols import RerankResult

        return RerankResult(Ranking.from_hits(query.query_id, (ScoredDoc(d.doc_id, float(i), d)
                                                                for i, d in enumerate(candidates))))

    def rerank_batch(self, queries, candidates):
        return [self.rerank(q, c) for q, c in zip(queries, candidates)]

    def describe(self):
        return {"method": self.name}


def _pipeline(reranker) -> Pipeline:
    from heedrank.index.store import Index
    from heedrank.retriever.bm25 import BM25Retriever

    docs = [Document(f"d{i}", "apple " * (5 - i) + "pear") for i in range(5)]
    ix = Index.from_documents(docs)
    return Pipeline({"bm25": BM25Retriever.from_index(ix)}, ix.docstore, reranker_factory=lambda method: reranker)


def test_the_pipeline_cuts_at_the_calibrated_probability() -> None:
    pipe = _pipeline(_Calibrated())
    opts = SearchOptions(rerank="calibrated", candidates=5, top_k=5)
    full = pipe.search(Query("q", "apple"), opts)
    assert len(full.ranking) == 5 and full.cutoff is None
    probs = full.probabilities
    assert probs is not None and set(probs) == {h.doc_id for h in full.ranking.hits}
    # pure reranker: z-scores of 4, 3, 2, 1, 0 are (1.41, 0.71, 0, -0.71, -1.41); P = sigmoid(4 z)
    top = full.ranking.hits[0].doc_id
    assert probs[top] == pytest.approx(1 / (1 + math.exp(-4 * math.sqrt(2))))
    cut = pipe.search(Query("q", "apple"), SearchOptions(rerank="calibrated", candidates=5, top_k=5, cutoff="auto"))
    assert cut.cutoff == 0.5 and [h.doc_id for h in cut.ranking.hits] == [h.doc_id for h in full.ranking.hits[:3]]
    assert len(pipe.search(Query("q", "apple"), SearchOptions(rerank="calibrated", candidates=5, top_k=2,
                                                              cutoff=0.0)).ranking) == 2  # top_k still bounds it
    assert len(pipe.search(Query("q", "apple"), SearchOptions(rerank="calibrated", candidates=5, cutoff=1.0)).ranking) == 0
    fused = pipe.search(Query("q", "apple"), SearchOptions(rerank="calibrated", candidates=5, fusion=0.5, cutoff="auto"))
    assert fused.fusion == 0.5 and all(fused.probabilities[h.doc_id] >= 0.5 for h in fused.ranking.hits)


def test_the_pipeline_refuses_a_cutoff_it_cannot_calibrate() -> None:
    pipe = _pipeline(_Calibrated())
    with pytest.raises(ValidationError, match="got fusion 0.3"):
        pipe.search(Query("q", "apple"), SearchOptions(rerank="calibrated", fusion=0.3, cutoff="auto"))
    with pytest.raises(ValidationError, match="cutoff needs reranking"):
        pipe.search(Query("q", "apple"), SearchOptions(cutoff="auto"))
    with pytest.raises(ValidationError, match="cutoff must be a probability"):
        pipe.search(Query("q", "apple"), SearchOptions(rerank="calibrated", cutoff=2))

    class _Plain(_Calibrated):
        calibration = None

    plain = _pipeline(_Plain())
    assert plain.search(Query("q", "apple"), SearchOptions(rerank="calibrated")).probabilities is None
    with pytest.raises(ValidationError, match="has no calibrated scores"):
        plain.search(Query("q", "apple"), SearchOptions(rerank="calibrated", cutoff=0.5))

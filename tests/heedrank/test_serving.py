"""The serving strategies (:mod:`heedrank.serving`): the position prior (``/rerank``'s default for a
list-relative reranker): the formula, the gate, and that a confident reranker wins wherever its
answer was sent; relevance that follows the served order; each pair's own log-odds served as its
probability; and one signal matrix in, one :class:`~heedrank.serving.Served` out."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from heedrank.fusion import standardize_list
from heedrank.serving import PositionPrior, ServePolicy, SigmoidServing, ZFusion
from heedrank.types import Ranking, ScoredDoc


def test_the_prior_is_its_formula() -> None:
    prior = PositionPrior()
    r = [3.0, 2.5, 2.0, 0.5, 0.1, -0.2]  # agrees with the given order
    z = standardize_list(r)
    w = standardize_list([-math.log1p(i) for i in range(len(r))])
    t = math.sqrt(len(r) - 1) * sum(a * b for a, b in zip(z, w)) / len(r)
    g = min(1.0, max(0.0, (t - prior.onset) / prior.width))
    assert prior.agreement(z) == pytest.approx(t) and t > 1.5 and g == 1.0
    assert prior.scores(r) == pytest.approx([zi - g * prior.weight * math.log1p(i) for i, zi in enumerate(z)])
    assert prior.strength(r) == pytest.approx(prior.weight)


def test_an_order_that_disagrees_or_carries_nothing_is_ignored() -> None:
    prior = PositionPrior()
    assert prior.strength([0.0, 1.0, 2.0, 3.0, 4.0]) == 0.0  # reversed: the reranker alone
    rng = random.Random(7)
    strengths = [prior.strength([rng.random() for _ in range(20)]) for _ in range(400)]
    # a random order mostly does not count, and counts little when it does (T ~ N(0, 1): g > 0 for about
    # 31% of orders, mean g about 0.17)
    assert sum(s == 0.0 for s in strengths) / len(strengths) > 0.6
    assert sum(strengths) / len(strengths) < 0.25 * prior.weight


@pytest.mark.parametrize("n", [2, 3, 5, 11])
def test_a_confident_reranker_wins_in_every_position(n: int) -> None:
    policy = ZFusion(by="prior")
    for position in range(n):
        ids = [f"d{i:02d}" for i in range(n)]
        scores = {d: (5.0 if i == position else 0.1 * ((i * 7) % 5)) for i, d in enumerate(ids)}
        given = Ranking("q", tuple(ScoredDoc(d, 1.0 / (1 + i)) for i, d in enumerate(ids)))
        served = policy.apply(given, Ranking.from_scores("q", scores))
        assert served.ranking.hits[0].doc_id == ids[position]


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from serving_fakes import AttributeServing  # noqa: E402
from heedrank.seam import IndependentServing  # noqa: E402

_SCORES = st.lists(st.floats(-5.0, 5.0, allow_nan=False), min_size=1, max_size=16)


@settings(max_examples=200, deadline=None)
@given(own=_SCORES, first=_SCORES, by=st.sampled_from(["score", "rank", "prior"]),
       alpha=st.sampled_from([None, 0.3]), calibrated=st.booleans(), scale=st.sampled_from([None, 0.05]),
       cutoff=st.sampled_from([None, 0.4]))
def test_relevance_agrees_with_the_served_order(own, first, by, alpha, calibrated, scale, cutoff) -> None:
    """Whatever the given order contributes (the position prior, a fusion weight) is inside the
    score a user reads: ``Served.relevance`` (and the probability) never rises down the served
    ranking, and a cut-off keeps a prefix of it."""
    from heedrank.calibration import PlattMap

    n = len(own)
    first = (first * n)[:n]
    ids = [f"d{i:02d}" for i in range(n)]
    given_order = Ranking.from_hits("q", (ScoredDoc(d, s) for d, s in zip(ids, sorted(first, reverse=True))))
    reranked = Ranking.from_scores("q", dict(zip(ids, own)))
    plat = PlattMap((2.0, -0.5, 0.3, 0.0), 0.1, 0.5) if calibrated else None
    policy = ZFusion(alpha=None if by == "prior" else alpha, by=by, plat=plat, scale=scale)
    served = policy.apply(given_order, reranked, cutoff if calibrated else None)
    relevance = [served.relevance[h.doc_id] for h in served.ranking.hits]
    assert all(a >= b for a, b in zip(relevance, relevance[1:])), (relevance, served.ranking)
    if served.probabilities is not None:
        probs = [served.probabilities[h.doc_id] for h in served.ranking.hits]
        assert all(a >= b for a, b in zip(probs, probs[1:]))
    if served.threshold is not None:
        assert all(served.probabilities[d] < served.threshold for d in ids if d not in set(served.ranking.doc_ids))


class _Absolute(AttributeServing):
    """A reranker whose scores are each pair's log-odds (its record's ``independent``)."""

    independent = IndependentServing(0.4)
    default_fusion = 0.5
    calibration = None
    score_scale = 1.0


def _column(given: Ranking, scores: dict[str, float]) -> np.ndarray:
    """``(N, 1)``: the reranker's scores of ``given``'s candidates, NaN where it has none."""
    return np.asarray([[scores.get(d, np.nan)] for d in given.doc_ids], dtype=np.float64)


def test_absolute_scores_are_served_as_their_own_probability_in_any_list() -> None:
    logits = {"a": 2.0, "b": -1.0, "c": 0.3, "d": -3.0}
    given = Ranking("q", tuple(ScoredDoc(d, 1.0 / (1 + i)) for i, d in enumerate(["d", "c", "b", "a"])))
    rerank = ServePolicy.of(_Absolute(), fusion=None, by="prior")  # /rerank: no prior, its own order
    assert isinstance(rerank.strategy, SigmoidServing) and rerank.alpha is None and rerank.strategy.threshold == 0.4
    served = rerank.serve(given, _column(given, logits))
    assert served.ranking.doc_ids == ["a", "c", "b", "d"]
    relevance = [served.relevance[d] for d in served.ranking.doc_ids]
    assert relevance == sorted(relevance, reverse=True)
    assert served.probabilities == pytest.approx({d: 1 / (1 + math.exp(-s)) for d, s in logits.items()})
    one = Ranking("q", (ScoredDoc("b", 1.0),))
    alone = rerank.serve(one, _column(one, {"b": -1.0}))
    assert alone.probabilities == pytest.approx({"b": served.probabilities["b"]})
    # /search without a fused map: the fused order, each pair's own probability
    search = ServePolicy.of(_Absolute(), fusion="default", cutoff="auto")
    fused = search.serve(given, _column(given, logits))
    assert fused.probabilities == served.probabilities and fused.threshold == 0.4
    assert set(fused.ranking.doc_ids) == {"a", "c"}


def test_a_fused_map_gives_search_a_probability_in_its_order() -> None:
    class Mapped(_Absolute):
        independent = IndependentServing(0.4, (2.0, -1.0), 0.3)

    logits = {"a": 2.0, "b": -1.0, "c": 0.3, "d": -3.0}
    given = Ranking("q", tuple(ScoredDoc(d, 1.0 / (1 + i)) for i, d in enumerate(["d", "c", "b", "a"])))
    served = ServePolicy.of(Mapped(), fusion="default", cutoff="auto").serve(given, _column(given, logits))
    probs = [served.probabilities[h.doc_id] for h in served.ranking.hits]
    assert probs == sorted(probs, reverse=True) and served.threshold == 0.3
    assert probs == pytest.approx([1 / (1 + math.exp(-(2.0 * h.score - 1.0))) for h in served.ranking.hits])
    rerank = ServePolicy.of(Mapped(), fusion=None, by="prior").serve(given, _column(given, logits))
    assert rerank.probabilities == pytest.approx({d: 1 / (1 + math.exp(-s)) for d, s in logits.items()})


@pytest.mark.parametrize("by", ["score", "rank", "prior"])
def test_a_list_whose_scores_do_not_differ_says_its_number_is_the_lists(by) -> None:
    """One document (or equal scores) under a list-relative scorer gets the map's base number
    whatever it is: the served warning says so; a list whose scores differ gets none, and a
    per-pair (absolute) scorer never does."""
    from heedrank.calibration import PlattMap
    from heedrank.serving import FLAT_LIST

    plat = PlattMap((2.0, -0.5, 0.3, 0.0), 0.1, 0.5)
    policy = ZFusion(alpha=None, by=by, plat=plat, scale=None)
    one = Ranking("q", (ScoredDoc("a", 1.0),))
    alone = policy.apply(one, Ranking.from_scores("q", {"a": 3.7}))
    assert FLAT_LIST in alone.warnings
    other = policy.apply(one, Ranking.from_scores("q", {"a": -2.0}))
    assert other.probabilities == alone.probabilities  # the same number, whatever the document
    two = Ranking("q", (ScoredDoc("a", 1.0), ScoredDoc("b", 0.5)))
    assert FLAT_LIST not in policy.apply(two, Ranking.from_scores("q", {"a": 3.7, "b": 0.2})).warnings
    own_log_odds = ServePolicy.of(_Absolute(), fusion=None, by="prior")
    assert FLAT_LIST not in own_log_odds.serve(one, _column(one, {"a": 3.7})).warnings

"""The serving policy's position prior (``/rerank``'s default): the formula, the gate, and that a
confident reranker wins wherever its answer was sent."""

from __future__ import annotations

import math
import random

import pytest

from heedrank.fusion import standardize_list
from heedrank.serving import PositionPrior, ServePolicy
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
    policy = ServePolicy(by="prior")
    for position in range(n):
        ids = [f"d{i:02d}" for i in range(n)]
        scores = {d: (5.0 if i == position else 0.1 * ((i * 7) % 5)) for i, d in enumerate(ids)}
        given = Ranking("q", tuple(ScoredDoc(d, 1.0 / (1 + i)) for i, d in enumerate(ids)))
        served = policy.apply(given, Ranking.from_scores("q", scores))
        assert served.ranking.hits[0].doc_id == ids[position]

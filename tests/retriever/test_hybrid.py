"""reciprocal_rank_fusion and weighted_score_fusion (retriever/hybrid.py) on hand-computed examples and their invariants."""

from __future__ import annotations

import statistics

import pytest
import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from heedrank.errors import ValidationError
from heedrank.types import Ranking
from heedrank.retriever.hybrid import reciprocal_rank_fusion, weighted_score_fusion


def test_hand_computed_example() -> None:
    a = Ranking.from_scores("q", {"d1": 9.0, "d2": 5.0, "d3": 1.0})  # d1, d2, d3
    b = Ranking.from_scores("q", {"d3": 0.9, "d4": 0.8, "d1": 0.1})  # d3, d4, d1
    fused = reciprocal_rank_fusion([a, b], k=10)
    # d1: 1/61 + 1/63, d3: 1/63 + 1/61 (tie -> doc id), d2: 1/62, d4: 1/62 (tie -> doc id)
    assert fused.doc_ids == ["d1", "d3", "d2", "d4"]
    assert fused.hits[0].score == pytest.approx(1 / 61 + 1 / 63, abs=1e-15)
    assert fused.hits[0].score == pytest.approx(0.0322665, abs=1e-7)
    assert fused.hits[2].score == pytest.approx(1 / 62)
    assert reciprocal_rank_fusion([a, b], k=2).doc_ids == ["d1", "d3"]
    # rrf_k=0: d1 = d3 = 1/1 + 1/3, d2 = d4 = 1/2
    assert [round(h.score, 6) for h in reciprocal_rank_fusion([a, b], k=4, rrf_k=0).hits] == [
        1.333333, 1.333333, 0.5, 0.5,
    ]


def test_single_ranking_keeps_order_and_scores_ignore_input_scale() -> None:
    a = Ranking.from_scores("q", {"x": 1000.0, "y": 0.001, "z": -5.0})
    fused = reciprocal_rank_fusion([a], k=3)
    assert fused.doc_ids == ["x", "y", "z"]
    assert [h.score for h in fused.hits] == [1 / 61, 1 / 62, 1 / 63]


def test_errors() -> None:
    with pytest.raises(ValidationError):
        reciprocal_rank_fusion([], k=3)
    with pytest.raises(ValidationError, match="different queries"):
        reciprocal_rank_fusion([Ranking("a"), Ranking("b")], k=3)
    assert reciprocal_rank_fusion([Ranking("a"), Ranking("a")], k=3) == Ranking("a")


ids = st.lists(st.sampled_from([f"d{i}" for i in range(12)]), unique=True, max_size=12)


@given(st.lists(ids, min_size=1, max_size=4), st.integers(0, 15))
def test_invariants(lists: list[list[str]], k: int) -> None:
    rankings = [Ranking.from_scores("q", {d: float(len(ds) - i) for i, d in enumerate(ds)}) for ds in lists]
    fused = reciprocal_rank_fusion(rankings, k)
    union = set().union(*lists)
    assert len(fused) == min(k, len(union))
    assert set(fused.doc_ids) <= union and len(set(fused.doc_ids)) == len(fused)
    for h in fused.hits:
        expected = sum(1 / (60 + ds.index(h.doc_id) + 1) for ds in lists if h.doc_id in ds)
        assert h.score == pytest.approx(expected)


def test_weighted_fusion_hand_computed() -> None:
    a = Ranking.from_scores("q", {"d1": 10.0, "d2": 5.0, "d3": 0.0})  # min-max: 1, 0.5, 0
    b = Ranking.from_scores("q", {"d3": 0.9, "d1": 0.5})  # min-max: d3 1, d1 0; d2 absent -> 0
    fused = weighted_score_fusion([a, b], k=3, weights=[0.25, 0.75])
    assert fused.doc_ids == ["d3", "d1", "d2"]
    assert {h.doc_id: round(h.score, 6) for h in fused.hits} == {"d3": 0.75, "d1": 0.25, "d2": 0.125}
    z = weighted_score_fusion([a, b], k=3, normalization="zscore")
    za = (np.array([10.0, 5.0, 0.0]) - 5.0) / statistics.pstdev([10.0, 5.0, 0.0])
    zb = np.array([1.0, -1.0])  # (0.9, 0.5) standardised; d2 gets b's minimum
    expected = {"d1": 0.5 * (za[0] + zb[1]), "d2": 0.5 * (za[1] + zb[1]), "d3": 0.5 * (za[2] + zb[0])}
    assert {h.doc_id: h.score for h in z.hits} == pytest.approx(expected)
    same = Ranking.from_scores("q", {"x": 2.0, "y": 2.0})
    assert [h.score for h in weighted_score_fusion([same], 2).hits] == [1.0, 1.0]
    assert weighted_score_fusion([Ranking("q"), a], 2, weights=[1.0, 1.0]).doc_ids == ["d1", "d2"]
    for bad in ([1.0], [-1.0, 1.0], [float("nan"), 1.0]):
        with pytest.raises(ValidationError):
            weighted_score_fusion([a, b], 3, weights=bad)
    with pytest.raises(ValidationError, match="normalization"):
        weighted_score_fusion([a, b], 3, normalization="rank")


@given(st.lists(ids, min_size=1, max_size=4), st.integers(0, 15))
def test_weighted_invariants(lists: list[list[str]], k: int) -> None:
    rankings = [Ranking.from_scores("q", {d: float(len(ds) - i) for i, d in enumerate(ds)}) for ds in lists]
    fused = weighted_score_fusion(rankings, k)
    union = set().union(*lists)
    assert len(fused) == min(k, len(union))
    assert all(-1e-9 <= h.score <= 1 + 1e-9 for h in fused.hits)  # min-max, weights summing to 1
    keys = [(-h.score, h.doc_id) for h in fused.hits]
    assert keys == sorted(keys)

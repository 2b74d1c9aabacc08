"""Window planning and anchor alignment, without a model."""

from __future__ import annotations

import pytest

from heedrank.errors import ContextOverflowError
from heedrank.reranker.scoring import distinct_texts, spans_from_lengths
from heedrank.reranker.windows import WindowPlan, align_to_anchors, plan_windows
from heedrank.types import Document


def test_everything_that_fits_is_one_window():
    plan = plan_windows([10, 10, 10], fixed=20, limit=50)
    assert plan == WindowPlan((), ((0, 1, 2),))


def test_windows_carry_the_anchor_cover_every_candidate_and_fit():
    costs = [10] * 9  # fixed 20 + anchor 10 leaves 30: three more per window
    plan = plan_windows(costs, fixed=20, limit=60, anchors=1)
    assert plan.anchors == (0,)
    assert plan.windows == ((0, 1, 2, 3), (0, 4, 5, 6), (0, 7, 8))
    for w in plan.windows:
        assert 20 + sum(costs[i] for i in w) <= 60
    owned = [i for w in range(len(plan.windows)) for i in plan.own(w)]
    assert sorted(owned) == list(range(9))  # each candidate scored by exactly one window


def test_balanced_split_instead_of_a_tiny_last_window():
    plan = plan_windows([10] * 8, fixed=20, limit=60, anchors=1)  # greedy: 3 + 3 + 1
    assert [len(w) - 1 for w in plan.windows] == [3, 2, 2]


def test_anchors_drop_when_they_do_not_fit_and_a_lone_giant_overflows():
    plan = plan_windows([30, 30, 30], fixed=20, limit=55, anchors=1)
    assert plan.anchors == () and plan.windows == ((0,), (1,), (2,))
    with pytest.raises(ContextOverflowError) as err:
        plan_windows([10, 100], fixed=20, limit=60)
    assert err.value.max_candidates == 0


def test_alignment_shifts_each_window_so_the_anchor_agrees():
    plan = WindowPlan((0,), ((0, 1, 2), (0, 3, 4)))
    scores, shifts = align_to_anchors(plan, [[5.0, 1.0, 2.0], [3.0, 4.0, 0.5]])
    assert shifts == [0.0, 2.0]
    assert scores == [5.0, 1.0, 2.0, 6.0, 2.5]
    two = WindowPlan((0, 1), ((0, 1, 2), (0, 1, 3)))
    scores, shifts = align_to_anchors(two, [[4.0, 2.0, 1.0], [3.0, 2.0, 7.0]])
    assert shifts == [0.0, 0.5] and scores == [4.0, 2.0, 1.0, 7.5]


def test_distinct_texts_and_spans():
    docs = [Document("a", "same"), Document("b", "other"), Document("c", "x", "t"), Document("d", "same"),
            Document("e", "t x")]
    unique, owner = distinct_texts(docs)
    assert [d.doc_id for d in unique] == ["a", "b", "c"] and owner == [0, 1, 2, 0, 2]  # "t x" == title t + text x
    assert spans_from_lengths([2, 3]) == [(0, 2), (2, 5)]
    # the stand-in of a text does not depend on the order: smallest id, at the first place
    unique, owner = distinct_texts(docs[::-1])
    assert [d.doc_id for d in unique] == ["c", "a", "b"] and owner == [0, 1, 0, 2, 1]

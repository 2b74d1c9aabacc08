"""Metrics on tiny hand-computed examples (linear-gain nDCG, as trec_eval)."""

from __future__ import annotations

import math

import pytest

from heedrank.errors import UnknownNameError, ValidationError
from heedrank.eval.metrics import (
    BEIR_METRICS,
    MSMARCO_DEV_METRICS,
    NOVELEVAL_METRICS,
    TREC_DL_METRICS,
    evaluate_run,
    parse_metrics,
    rank_scores,
    relevance_level,
)

QRELS = {
    "q1": {"a": 2, "b": 1, "c": 0},
    "q2": {"x": 1, "y": 0},
    "q4": {"w": 1},
}
RUN = {
    "q1": {"b": 3.0, "c": 2.0, "a": 1.0, "d": 0.5},  # d is unjudged
    "q2": {"y": 2.0, "z": 1.0},  # x (relevant) not retrieved
    "q3": {"a": 1.0},  # no qrels
}
# q1: DCG = 1/log2(2) + 0/log2(3) + 2/log2(4) + 0 = 2; IDCG = 2/log2(2) + 1/log2(3)
NDCG_Q1 = 2.0 / (2.0 + 1.0 / math.log2(3))  # 0.760187...
METRICS = ["nDCG@10", "R@100", "RR@10", "Judged@10", "RR(rel=2)@10", "R(rel=2)@100"]


def test_per_query_values_exact():
    ev = evaluate_run(RUN, QRELS, METRICS)
    assert ev.query_ids == ["q1", "q2"]
    assert ev.excluded == ["q3"]
    q1, q2 = ev.per_query["q1"], ev.per_query["q2"]
    assert q1["nDCG@10"] == pytest.approx(NDCG_Q1, abs=1e-12)
    assert q1["nDCG@10"] == pytest.approx(0.7601875334, abs=1e-9)
    assert q1["R@100"] == 1.0
    assert q1["RR@10"] == 1.0  # b (grade 1) at rank 1
    assert q1["RR(rel=2)@10"] == pytest.approx(1 / 3)  # a (grade 2) at rank 3
    assert q1["R(rel=2)@100"] == 1.0
    assert q1["Judged@10"] == 0.75  # 3 of 4 retrieved are judged
    assert q2 == {"nDCG@10": 0.0, "R@100": 0.0, "RR@10": 0.0, "Judged@10": 0.5, "RR(rel=2)@10": 0.0,
                  "R(rel=2)@100": 0.0}


def test_aggregate_is_mean_over_judged_queries():
    ev = evaluate_run(RUN, QRELS, ["nDCG@10", "Judged@10"])
    assert ev.aggregate["nDCG@10"] == pytest.approx(NDCG_Q1 / 2)
    assert ev.aggregate["Judged@10"] == pytest.approx((0.75 + 0.5) / 2)


def test_judged_query_without_hits_scores_zero():
    ev = evaluate_run(RUN, QRELS, ["nDCG@10", "RR@10"], query_ids=["q1", "q2", "q3", "q4"])
    assert ev.query_ids == ["q1", "q2", "q4"]
    assert ev.excluded == ["q3"]
    assert ev.per_query["q4"] == {"nDCG@10": 0.0, "RR@10": 0.0}
    assert ev.aggregate["nDCG@10"] == pytest.approx(NDCG_Q1 / 3)


def test_ideal_ranking_is_one():
    ev = evaluate_run({"q1": {"a": 3.0, "b": 2.0, "c": 1.0}}, QRELS, ["nDCG@10", "RR@10", "R@100"])
    assert ev.aggregate == {"nDCG@10": 1.0, "RR@10": 1.0, "R@100": 1.0}


def test_cutoff_applies():
    run = {"q1": {f"n{i:02d}": 100.0 - i for i in range(10)} | {"a": 1.0}}  # a at rank 11
    ev = evaluate_run(run, QRELS, ["nDCG@10", "RR@10", "R@100"])
    assert ev.per_query["q1"]["nDCG@10"] == 0.0
    assert ev.per_query["q1"]["RR@10"] == 0.0
    assert ev.per_query["q1"]["R@100"] == 0.5


def test_ties_follow_heedrank_order_not_trec_eval():
    # equal scores: heedrank ranks a before b (doc id ascending); trec_eval would put b first
    ev = evaluate_run({"q": {"a": 1.0, "b": 1.0}}, {"q": {"a": 1}}, ["RR@10"])
    assert ev.aggregate["RR@10"] == 1.0


def test_rank_scores_strictly_decreasing_and_input_untouched():
    run = {"q": {"b": 1.0, "a": 1.0, "c": float("nan"), "d": 5.0}}
    before = {q: dict(v) for q, v in run.items()}
    ranked = rank_scores(run)
    assert sorted(ranked["q"], key=ranked["q"].get, reverse=True) == ["d", "a", "b", "c"]
    assert run == before
    evaluate_run(run, {"q": {"a": 1}})
    assert run == before


def test_no_judged_query_gives_nan():
    ev = evaluate_run({"q3": {"a": 1.0}}, QRELS, ["nDCG@10"])
    assert ev.query_ids == [] and math.isnan(ev.aggregate["nDCG@10"])


def test_relevance_level_of_binary_measures():
    assert [relevance_level(m) for m in TREC_DL_METRICS] == [None, 2, 2, None]
    assert [relevance_level(m) for m in MSMARCO_DEV_METRICS] == [None, 1, 1]
    assert [relevance_level(m) for m in NOVELEVAL_METRICS] == [None, None, None, 1]
    assert relevance_level("P(rel=3)@5") == 3 and relevance_level("AP") == 1
    # grade 1 counts for RR@10, not for RR(rel=2)@10: the only relevant document is grade 1, second
    ev = evaluate_run({"q": {"x": 2.0, "y": 1.0}}, {"q": {"x": 0, "y": 1}}, ["RR@10", "RR(rel=2)@10"])
    assert ev.aggregate == {"RR@10": 0.5, "RR(rel=2)@10": 0.0}


def test_default_metric_sets_parse():
    assert list(parse_metrics(BEIR_METRICS)) == list(BEIR_METRICS)
    assert list(parse_metrics(TREC_DL_METRICS)) == list(TREC_DL_METRICS)
    assert list(parse_metrics(MSMARCO_DEV_METRICS)) == list(MSMARCO_DEV_METRICS)
    assert list(parse_metrics(NOVELEVAL_METRICS)) == list(NOVELEVAL_METRICS)


@pytest.mark.parametrize("name", ["ndcg10", "foo@10", "ERR@10", "nDCG@x"])
def test_unknown_metric_lists_valid_names(name):
    with pytest.raises(UnknownNameError) as info:
        parse_metrics([name])
    assert repr(name) in str(info.value)
    assert "nDCG@10" in str(info.value) and "Judged@10" in str(info.value)
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValidationError)


def test_no_metrics_is_an_error():
    with pytest.raises(ValidationError):
        parse_metrics([])

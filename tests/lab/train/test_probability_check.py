"""The scorer's calibration check (:mod:`heedrank.lab.train.probability_check`) on tiny inline sources."""

from __future__ import annotations

import numpy as np
import pytest
from test_source_choice import _source

from heedrank.lab.train.probability_check import calibration, check, format_check, reliability
from heedrank.scorer import Scorer, SubsetModel


def test_the_calibration_error_of_known_bins() -> None:
    p = np.asarray([0.05, 0.05, 0.95, 0.95])
    assert calibration(p, np.asarray([0, 0, 1, 1])) == pytest.approx(0.05)
    assert calibration(p, np.asarray([1, 1, 0, 0])) == pytest.approx(0.95)


def test_a_scorer_shifted_down_reads_below_the_relevant_share() -> None:
    s = _source("a", 1, 2.0)
    models = (SubsetModel(("attention", "dense", "rank"), (1.0, 10.0, -0.2), -4.0),
              SubsetModel(("attention", "dense"), (1.0, 10.0), -4.5))
    low = Scorer(tuple(SubsetModel(m.uses, m.weights, m.bias - 3.0) for m in models), 0.5)
    report = check({"fit": Scorer(models, 0.5), "low": low}, [s])
    for path in ("/rerank", "/search"):
        fit, shifted = report["a"][path]["fit"], report["a"][path]["low"]
        assert fit["relevant"] == shifted["relevant"] == pytest.approx(float(s.labels().mean()))
        assert shifted["mean p"] < fit["mean p"] and shifted["top-1 relevant"] == fit["top-1 relevant"]
    text = format_check(report)
    assert "| a | /rerank | low |" in text and "| a | low | " in text  # the summary and the reliability rows


def test_reliability_bins_hold_every_candidate_and_close_the_last_bin() -> None:
    p = np.asarray([0.05, 0.15, 0.15, 0.55, 1.0])
    bins = reliability(p, np.asarray([0, 0, 1, 1, 1]))
    assert sum(b["n"] for b in bins) == 5
    assert (bins[1]["n"], bins[1]["relevant"], bins[1]["mean p"]) == (2, 0.5, pytest.approx(0.15))
    assert (bins[-1]["lo"], bins[-1]["n"], bins[-1]["relevant"]) == (0.7, 1, 1.0)
    assert bins[2]["n"] == 0 and bins[2]["relevant"] is None

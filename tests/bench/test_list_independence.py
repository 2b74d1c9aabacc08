"""The metric helpers of ``bench/list_independence.py`` (ROC AUC, expected calibration error,
the percentile summary, the list a document is served in, the balanced sample) on tiny inline
numbers; no LM, no index."""

from __future__ import annotations

import math
import random

import pytest



@pytest.fixture(scope="module")
def bench():
    from bench_modules import load_bench

    return load_bench("list_independence")


def test_roc_auc(bench) -> None:
    assert bench.roc_auc([0.9, 0.8, 0.2, 0.1], [1, 1, 0, 0]) == 1.0
    assert bench.roc_auc([0.1, 0.2, 0.8, 0.9], [1, 1, 0, 0]) == 0.0
    # pairs (pos, neg): (0.8, 0.6) win, (0.8, 0.9) loss, (0.4, 0.6) loss, (0.4, 0.9) loss -> 1/4
    assert bench.roc_auc([0.8, 0.4, 0.6, 0.9], [1, 1, 0, 0]) == pytest.approx(0.25)
    assert bench.roc_auc([0.5, 0.5, 0.5], [1, 0, 0]) == pytest.approx(0.5)  # ties count half
    assert math.isnan(bench.roc_auc([0.3, 0.4], [1, 1]))
    with pytest.raises(ValueError):
        bench.roc_auc([0.3], [1, 0])


def test_expected_calibration_error(bench) -> None:
    assert bench.expected_calibration_error([0.0, 1.0], [0, 1]) == 0.0
    # one bin [0.5, 0.6): mean p 0.55, half relevant -> 0.05
    assert bench.expected_calibration_error([0.55, 0.55], [1, 0]) == pytest.approx(0.05)
    # bins: {0.1, 0.1} labels 0,0 -> |0.1 - 0| = 0.1 (weight 1/2); {0.9, 0.95} labels 1,0 -> |0.925 - 0.5| (1/2)
    assert bench.expected_calibration_error([0.1, 0.1, 0.9, 0.95], [0, 0, 1, 0]) == pytest.approx(
        0.5 * 0.1 + 0.5 * 0.425)
    assert math.isnan(bench.expected_calibration_error([], []))
    with pytest.raises(ValueError):
        bench.expected_calibration_error([1.2], [1])


def test_spread(bench) -> None:
    s = bench.spread([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0])
    assert s["n"] == 11
    assert s["median"] == pytest.approx(0.5)
    assert s["p90"] == pytest.approx(0.9)
    assert s["max"] == pytest.approx(1.0)
    assert bench.spread([0.0, 1.0])["p90"] == pytest.approx(0.9)  # linear interpolation
    assert math.isnan(bench.spread([])["median"])


def test_placed(bench) -> None:
    first = ["a", "b", "c", "d", "e", "f"]
    rng = random.Random(0)
    assert bench.placed(first, "c", 4, "first-stage", rng) == ["a", "b", "c", "d"]
    assert bench.placed(first, "f", 4, "first-stage", rng) == ["a", "b", "c", "f"]  # below the list: last
    assert bench.placed(first, "x", 3, "first-stage", rng) == ["a", "b", "x"]  # not retrieved: last
    assert bench.placed(first, "a", 1, "first-stage", rng) == ["a"]
    shuffled = bench.placed(first, "e", 4, "random", random.Random(1))
    assert sorted(shuffled) == ["a", "b", "c", "e"]
    with pytest.raises(ValueError):
        bench.placed(first, "a", 3, "middle", rng)


def test_balanced_sample(bench) -> None:
    got = bench.balanced_sample(["r1", "r2", "r3"], ["n1", "n2", "n3"], 4, random.Random(0))
    assert len(got) == 4 and sum(d.startswith("r") for d in got) == 2
    short = bench.balanced_sample(["r1"], ["n1", "n2", "n3", "n4"], 4, random.Random(0))
    assert "r1" in short and len(short) == 4  # the other side fills in

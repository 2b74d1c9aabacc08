"""Paired randomization test and report comparison."""

from __future__ import annotations

import random

import pytest

from heedrank.errors import NotFoundError, ValidationError
from heedrank.eval.compare import compare_reports, format_comparison, randomization_test
from heedrank.eval.report import EvalReport, save_report


def make_report(name: str, per_query: dict[str, dict[str, float]], rerank: str = "none") -> EvalReport:
    metrics = sorted({m for v in per_query.values() for m in v})
    agg = {m: sum(v[m] for v in per_query.values()) / len(per_query) for m in metrics}
    return EvalReport(
        name=name, dataset="toy", split="test", first_stage="bm25", rerank=rerank,
        candidates=None if rerank == "none" else 20, top_k=100, query_ids=sorted(per_query),
        metrics=agg, per_query=per_query,
    )


def _scores(n: int, seed: int) -> dict[str, dict[str, float]]:
    rng = random.Random(seed)
    return {f"q{i:03d}": {"nDCG@10": rng.uniform(0.1, 0.7), "RR@10": rng.uniform(0.1, 0.7)} for i in range(n)}


def test_identical_reports_p_is_one(tmp_path):
    pq = _scores(40, 1)
    a = save_report(make_report("a", pq), tmp_path / "a.json")
    b = save_report(make_report("b", pq), tmp_path / "b.json")
    comp = compare_reports(a, b, trials=2000)
    assert [d.metric for d in comp.deltas] == ["RR@10", "nDCG@10"]
    for d in comp.deltas:
        assert d.p_value == 1.0
        assert d.delta == 0.0
        assert (d.wins, d.losses, d.ties) == (0, 0, 40)


def test_large_consistent_improvement_is_significant(tmp_path):
    pa = _scores(30, 2)
    pb = {q: {m: v + 0.2 for m, v in ms.items()} for q, ms in pa.items()}
    comp = compare_reports(make_report("a", pa), make_report("b", pb, rerank="icr"), trials=10_000, seed=0)
    for d in comp.deltas:
        assert d.delta == pytest.approx(0.2)
        assert d.p_value < 0.01
        assert d.wins == 30
    assert comp.trials == 10_000


def test_small_noisy_difference_is_not_significant():
    rng = random.Random(3)
    diffs = [rng.gauss(0.0, 0.2) for _ in range(50)]
    diffs = [d - sum(diffs) / len(diffs) + 0.001 for d in diffs]  # mean 0.001, sd 0.2
    assert randomization_test(diffs, trials=5000) > 0.5


def test_exact_p_values():
    assert randomization_test([1.0, 1.0, 1.0]) == pytest.approx(2 / 8)  # only all-+ and all-- reach |mean| 1
    assert randomization_test([1.0, -1.0]) == 1.0
    assert randomization_test([0.1] * 10) == pytest.approx(2 / 1024)
    assert randomization_test([]) == 1.0


def test_monte_carlo_matches_exact_on_a_small_case():
    diffs = [0.3, 0.1, -0.05, 0.2, 0.25, -0.1, 0.15, 0.05, 0.2, 0.1, -0.02, 0.3, 0.12, 0.07, 0.01, 0.2]
    exact = randomization_test(diffs)
    approx = randomization_test(diffs + [0.0], trials=40_000, seed=1)  # 17 values: Monte Carlo path
    assert approx == pytest.approx(exact, abs=0.01)


def test_deterministic_given_seed():
    diffs = [random.Random(5).uniform(-0.1, 0.15) for _ in range(25)]
    assert randomization_test(diffs, 3000, seed=7) == randomization_test(diffs, 3000, seed=7)


def test_only_shared_queries_are_compared():
    pa = _scores(20, 4)
    pb = dict(_scores(20, 4))
    pb["extra"] = {"nDCG@10": 1.0, "RR@10": 1.0}
    del pb["q000"]
    comp = compare_reports(make_report("a", pa), make_report("b", pb))
    assert len(comp.query_ids) == 19 and comp.only_a == 1 and comp.only_b == 1
    assert all(d.delta == 0.0 and d.p_value == 1.0 for d in comp.deltas)


def test_errors(tmp_path):
    with pytest.raises(NotFoundError):
        compare_reports(tmp_path / "nope.json", tmp_path / "nope2.json")
    a = make_report("a", {"q1": {"nDCG@10": 0.5}})
    with pytest.raises(ValidationError, match="share no evaluated query"):
        compare_reports(a, make_report("b", {"q2": {"nDCG@10": 0.5}}))
    with pytest.raises(ValidationError, match="share no metric"):
        compare_reports(a, make_report("b", {"q1": {"RR@10": 0.5}}))
    with pytest.raises(ValidationError, match="trials"):
        randomization_test([0.1] * 20, trials=0)


def test_format_comparison():
    pa = _scores(30, 2)
    pb = {q: {m: v + 0.2 for m, v in ms.items()} for q, ms in pa.items()}
    text = format_comparison(compare_reports(make_report("a", pa), make_report("b", pb, rerank="icr"), trials=1000))
    assert "A: bm25" in text and "B: bm25>icr@20" in text
    assert "nDCG@10" in text and "+20.0" in text and "30/0/0" in text
    assert "*" in text

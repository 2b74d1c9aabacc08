"""Fitting the relevance cut-off on study dumps (:mod:`heedrank.lab.train.cutoff_fit`): the fit
finds a real signal and its cut-off holds up on held-out queries against a fixed top-k."""

from __future__ import annotations

from heedrank.lab.cutoff_eval import evaluate_cutoff, per_query, served
from heedrank.lab.train.cutoff_fit import fit_calibration
from study_items import cutoff_items as _items


def test_fit_finds_the_signal_and_beats_a_fixed_cut_on_held_out_queries() -> None:
    cal_items, cal_qrels, card = _items(150, seed=1)
    dev, dev_qrels, _ = _items(60, seed=2)
    test, test_qrels, _ = _items(60, seed=3)
    calibration, report = fit_calibration(cal_items, cal_qrels, dev, dev_qrels, card, counts=(6, 12),
                                          show_progress=False)
    assert set(calibration.maps) == {"score", "rank", "none"} and calibration.alpha == 0.6
    assert calibration.maps["none"].coef[0] > 0.5  # P(relevant) rises with the served score
    assert 0 < report["none"]["dev_brier"] < report["none"]["dev_brier_base_rate"]
    r = evaluate_cutoff(test, test_qrels, card, calibration, "none", 12, report["none"]["top_k"])
    assert r["queries"] == 60 and 0 < r["auto"][3] < 12  # it returns fewer than all candidates, more than none
    assert r["auto"][2] > r["fixed"][2] - 0.02
    rows = served(test, test_qrels, {"kind": "linear", "spec": "heads", "weights": list(card.weights)}, 0.6, "none", 12)
    assert per_query(rows, lambda row: 12)[:, 3].tolist() == [12.0] * 60


def test_a_card_without_a_fusion_weight_is_refused() -> None:
    """The fused modes' maps hold only at the card's ``fusion.alpha``: a card without one is an
    error, not a fit at a weight the card does not serve."""
    import pytest

    from heedrank.errors import ValidationError
    from heedrank.reranker.cards import WeightsCard

    cal_items, cal_qrels, card = _items(20, seed=1)
    bare = WeightsCard.from_json({k: v for k, v in card.data.items() if k != "fusion"}, "bare card")
    with pytest.raises(ValidationError, match="fusion.alpha"):
        fit_calibration(cal_items, cal_qrels, cal_items, cal_qrels, bare, counts=(6,), show_progress=False)


def test_the_map_keeps_its_signs_so_distinct_scores_get_distinct_probabilities() -> None:
    """Relevance made to rise with the rank at a given score (as collinear score and rank do
    in real dumps): the free fit gives ``log(1 + i)`` a positive weight, whose running minimum
    then shows a run of hits with one probability; the fit holds it at 0 instead."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    from heedrank.calibration import PlattMap, features
    from heedrank.lab.cutoff_eval import Served
    from heedrank.lab.train.cutoff_fit import fit_map

    rng = np.random.default_rng(0)
    rows = []
    for q in range(300):
        s = np.sort(rng.normal(size=20))[::-1]
        x = np.array(features(list(s)))
        y = (rng.random(20) < 1 / (1 + np.exp(-(2.0 * s + 0.8 * x[:, 1] - 2.0)))).astype(float)
        rows.append(Served(f"q{q}", x, s, y, int(y.sum())))
    xs, ys = np.concatenate([r.x for r in rows]), np.concatenate([r.labels for r in rows])
    assert LogisticRegression(max_iter=2000).fit(xs, ys).coef_[0][1] > 0.3  # free: rank weighs up
    coef, intercept = fit_map(rows)
    assert coef[0] > 1.0 and coef[1] == 0.0
    served = [1.0, 0.9, 0.8, 0.7, 0.6, 0.5]
    probs = PlattMap(coef, intercept, 0.5).probabilities(served)
    assert all(a > b for a, b in zip(probs, probs[1:]))  # one probability per score, falling

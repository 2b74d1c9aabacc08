"""Fitting the relevance cut-off on study dumps (:mod:`heedrank.eval.calibration`): the scores it
fits on are the ones the service serves, the fit finds a real signal, and the figures are
precision, recall and F1 of the returned prefix."""

from __future__ import annotations

import numpy as np
import pytest

from heedrank.calibration import PlattMap
from heedrank.eval.calibration import evaluate_cutoff, fit_calibration, per_query, prf, served, subset
from heedrank.eval.study import QueryItem, variant_scores
from heedrank.serving import ServePolicy
from heedrank.types import Ranking, ScoredDoc

L, H = 2, 3


def _items(n_queries: int, n: int = 12, seed: int = 0) -> tuple[list[QueryItem], dict, dict]:
    """Synthetic dump items: head 0 of layer 0 carries the relevance signal, the first stage a weaker one."""
    rng = np.random.default_rng(seed)
    items, qrels = [], {}
    for q in range(n_queries):
        rel = rng.random(n) < 0.25
        cal = rng.normal(size=(n, L, H)).astype(np.float32)
        cal[:, 0, 0] += 2.0 * rel
        first = np.sort(rng.normal(size=n) + 0.5 * rel)[::-1].copy()  # first-stage order (descending)
        ids = [f"q{q}d{i}" for i in range(n)]
        items.append(QueryItem(f"q{q}", ids, first, rel.astype(np.float64), {"calibrated": cal}))
        qrels[f"q{q}"] = {d: 1 for d, r in zip(ids, rel) if r} | {f"q{q}-unretrieved": 1}
    card = {"layer": L - 1, "weights": [1.0] + [0.0] * (L * H - 1), "fusion": {"alpha": 0.6}}
    return items, qrels, card


def test_served_scores_are_the_services() -> None:
    items, qrels, card = _items(3)
    variant = {"kind": "linear", "spec": "heads", "weights": card["weights"], "layers": [0, 1]}
    it = items[0]
    rows = served([it], qrels, variant, 0.6, "score", None)
    reranked = Ranking.from_hits("q", (ScoredDoc(d, float(s)) for d, s in zip(it.doc_ids, variant_scores(it, variant))))
    first = Ranking.from_hits("q", (ScoredDoc(d, float(s)) for d, s in zip(it.doc_ids, it.first_stage)))
    fused = ServePolicy(0.6).apply(first, reranked).ranking
    assert rows[0].scores == pytest.approx([h.score for h in fused.hits])
    assert list(rows[0].labels) == [float(it.labels[it.doc_ids.index(h.doc_id)]) for h in fused.hits]
    assert rows[0].n_relevant == int(it.labels.sum()) + 1  # the unretrieved relevant document counts for recall
    plat = PlattMap((1.0, -0.2, 0.1, 0.0), 0.0, 0.4)
    probs = ServePolicy(0.6, plat=plat).apply(first, reranked).probabilities
    assert probs is not None and [probs[h.doc_id] for h in fused.hits] == pytest.approx(plat.probabilities(list(rows[0].scores)))
    pure = served([it], qrels, variant, 0.6, "none", None)[0]
    probs = ServePolicy(None, plat=plat).apply(first, reranked).probabilities
    assert probs is not None and [probs[h.doc_id] for h in reranked.hits] == pytest.approx(plat.probabilities(list(pure.scores)))
    # a count re-scores the first stage's top n as the service would (features z-scored over those n)
    top = subset(it, 5)
    assert top.doc_ids == it.doc_ids[:5] and top.features["calibrated"].shape == (5, L, H)
    assert len(served([it], qrels, variant, 0.6, "rank", 5)[0].scores) == 5


def test_prf_counts_the_returned_prefix() -> None:
    labels = np.array([1.0, 0.0, 1.0, 0.0])
    assert prf(labels, 2, 4) == pytest.approx((0.5, 0.25, 2 * 0.5 * 0.25 / 0.75))
    assert prf(labels, 0, 4) == (1.0, 0.0, 0.0)  # nothing returned


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
    rows = served(test, test_qrels, {"kind": "linear", "spec": "heads", "weights": card["weights"]}, 0.6, "none", 12)
    assert per_query(rows, lambda row: 12)[:, 3].tolist() == [12.0] * 60

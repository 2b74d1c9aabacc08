"""Evaluating the relevance cut-off on study dumps (:mod:`heedrank.lab.cutoff_eval`): the
scores a map is fitted on and measured with are the ones the service serves, and the figures
are precision, recall and F1 of the returned prefix (the fit: tests/lab/train/test_cutoff_fit.py)."""

from __future__ import annotations

import numpy as np
import pytest

from heedrank.calibration import Calibration, PlattMap
from heedrank.lab.cutoff_eval import evaluate_cutoff, prf, served, subset
from heedrank.lab.study import variant_scores
from heedrank.serving import ZFusion
from heedrank.types import Ranking, ScoredDoc
from study_items import CUTOFF_H as H, CUTOFF_L as L, cutoff_items as _items

def test_served_scores_are_the_services() -> None:
    items, qrels, card = _items(3)
    variant = {"kind": "linear", "spec": "heads", "weights": list(card.weights), "layers": [0, 1]}
    it = items[0]
    rows = served([it], qrels, variant, 0.6, "score", None)
    reranked = Ranking.from_hits("q", (ScoredDoc(d, float(s)) for d, s in zip(it.doc_ids, variant_scores(it, variant))))
    first = Ranking.from_hits("q", (ScoredDoc(d, float(s)) for d, s in zip(it.doc_ids, it.first_stage)))
    fused = ZFusion(alpha=0.6).apply(first, reranked).ranking
    assert rows[0].scores == pytest.approx([h.score for h in fused.hits])
    assert list(rows[0].labels) == [float(it.labels[it.doc_ids.index(h.doc_id)]) for h in fused.hits]
    assert rows[0].n_relevant == int(it.labels.sum()) + 1  # the unretrieved relevant document counts for recall
    plat = PlattMap((1.0, -0.2, 0.1, 0.0), 0.0, 0.4)
    probs = ZFusion(alpha=0.6, plat=plat).apply(first, reranked).probabilities
    assert probs is not None and [probs[h.doc_id] for h in fused.hits] == pytest.approx(plat.probabilities(list(rows[0].scores)))
    pure = served([it], qrels, variant, 0.6, "none", None)[0]
    probs = ZFusion(alpha=None, plat=plat).apply(first, reranked).probabilities
    assert probs is not None and [probs[h.doc_id] for h in reranked.hits] == pytest.approx(plat.probabilities(list(pure.scores)))
    # a count re-scores the first stage's top n as the service would (features z-scored over those n)
    top = subset(it, 5)
    assert top.doc_ids == it.doc_ids[:5] and top.features["calibrated"].shape == (5, L, H)
    assert len(served([it], qrels, variant, 0.6, "rank", 5)[0].scores) == 5


def test_prf_counts_the_returned_prefix() -> None:
    labels = np.array([1.0, 0.0, 1.0, 0.0])
    assert prf(labels, 2, 4) == pytest.approx((0.5, 0.25, 2 * 0.5 * 0.25 / 0.75))
    assert prf(labels, 0, 4) == (1.0, 0.0, 0.0)  # nothing returned


def test_evaluate_cutoff_counts_what_the_map_keeps() -> None:
    items, qrels, card = _items(20, seed=5)
    keep_all = Calibration(0.6, {"none": PlattMap((0.0, 0.0, 0.0, 0.0), 10.0, 0.5)}, {})  # P ~ 1 for every candidate
    r = evaluate_cutoff(items, qrels, card, keep_all, "none", 12, 12)
    assert r["queries"] == 20 and r["auto"] == pytest.approx(r["fixed"]) and r["delta_f1"] == pytest.approx(0.0)
    assert r["auto"][3] == 12.0  # every candidate returned
    keep_none = Calibration(0.6, {"none": PlattMap((0.0, 0.0, 0.0, 0.0), -10.0, 0.5)}, {})
    r = evaluate_cutoff(items, qrels, card, keep_none, "none", 12, 3)
    assert r["auto"][3] == 0.0 and r["auto"][0] == 1.0 and r["auto"][2] == 0.0  # nothing returned: P 1, F1 0

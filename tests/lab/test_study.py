"""The training and fusion study's evaluation part: dump round trip, design matrices, the
variants' scores and runs (synthetic features with a known informative head; the fits are
tests/lab/train/test_head_fit.py)."""

from __future__ import annotations

import numpy as np

from heedrank.lab.study import design, load_items, save_items, variant_run, variant_scores
from study_items import study_items


def test_dump_round_trip(tmp_path) -> None:
    items, qrels = study_items(3, seed=1)
    save_items(tmp_path / "d.npz", items, {"qrels": qrels, "layer": 3})
    meta, back = load_items(tmp_path / "d.npz")
    assert meta["layer"] == 3 and meta["qrels"] == qrels
    assert [b.query_id for b in back] == [i.query_id for i in items]
    for a, b in zip(items, back):
        assert a.doc_ids == b.doc_ids and np.array_equal(a.labels, b.labels)
        assert np.array_equal(a.features["calibrated"], b.features["calibrated"])


def test_design_is_standardised_per_query() -> None:
    items, _ = study_items(1, seed=2)
    X = design(items[0], "heads+first")
    assert X.shape == (12, 4 * 3 + 2)
    assert np.allclose(X.mean(axis=0), 0.0, atol=1e-5)


def test_a_head_variant_scores_its_weighted_heads() -> None:
    items, _ = study_items(5, seed=3)
    onehot = [0.0] * 12
    onehot[2 * 3 + 1] = 1.0  # the informative head alone: (layer 2, head 1)
    variant = {"kind": "linear", "spec": "heads", "weights": onehot}
    for it in items:
        s = variant_scores(it, variant)
        assert s.shape == (12,) and np.argmax(s) in np.flatnonzero(it.labels > 0)
    run = variant_run(items, variant)
    assert set(run) == {it.query_id for it in items} and all(len(v) == 12 for v in run.values())
    first = variant_run(items, {"kind": "first"})
    assert first[items[0].query_id] == dict(zip(items[0].doc_ids, items[0].first_stage.tolist()))

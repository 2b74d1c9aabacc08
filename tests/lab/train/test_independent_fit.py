"""The list-independent scorer's fit (:mod:`heedrank.lab.train.independent_fit`): on synthetic
dumps where one (layer, head, group) feature carries relevance in absolute terms, the fit finds
it, its probability is calibrated (ECE) and separates (AUC), the folded weights reproduce the
standardised model, and the card entry is what the reranker reads."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("sklearn")
pytest.importorskip("torch")

from heedrank.lab.study import QueryItem, save_items  # noqa: E402
from heedrank.lab.train.independent_fit import auc, ece, fit_independent, format_fit  # noqa: E402
from heedrank.reranker.cached.independent import GROUPS, IndependentWeights  # noqa: E402

L, H, G = 2, 3, len(GROUPS)
SIGNAL = (1, 2, 1)  # (layer, head, group) that carries relevance


def _dump(path, queries: int, seed: int):
    rng = np.random.default_rng(seed)
    items, qrels = [], {}
    for q in range(queries):
        n = 12
        labels = (rng.random(n) < 0.25).astype(np.int64)
        f = rng.normal(size=(n, L, H, G)).astype(np.float32)
        f[:, SIGNAL[0], SIGNAL[1], SIGNAL[2]] += 2.5 * labels - 1.0  # absolute: the same in any list
        first = rng.normal(size=n) + labels
        qid = f"q{seed}-{q}"
        docs = [f"d{q}-{i}" for i in range(n)]
        items.append(QueryItem(qid, docs, first, labels, {"independent": f}))
        qrels[qid] = {d: int(g) for d, g in zip(docs, labels) if g}
    save_items(path, items, {"qrels": qrels})
    return path


def test_fit_finds_the_feature_and_gives_calibrated_probabilities(tmp_path) -> None:
    train = [(_dump(tmp_path / "train.npz", 60, 1), 1)]
    dev = _dump(tmp_path / "dev.npz", 30, 2)
    test = _dump(tmp_path / "test.npz", 30, 3)
    fit = fit_independent(train, dev, {"test": (test, 1)}, cs=(0.01, 1.0))
    entry = fit.entry
    w = np.asarray(entry["weights"]).reshape(L, H, G)
    assert np.unravel_index(np.abs(w).argmax(), w.shape) == SIGNAL
    r = fit.report["test"]
    assert r["auc"] > 0.9 and r["ece"] < 0.08
    assert r["independent"] > r["first stage"]
    assert 0.0 <= entry["fusion_alpha"] <= 1.0 and entry["groups"] == list(GROUPS)
    read = IndependentWeights.from_card({"independent": entry})
    assert read.layers == L and read.heads == H and read.tensor().shape == (L, H, G)
    assert "| test |" in format_fit(fit)


def test_auc_and_ece_on_known_values() -> None:
    y = np.array([0, 0, 1, 1])
    assert auc(np.array([0.1, 0.2, 0.8, 0.9]), y) == 1.0
    assert np.isnan(auc(np.array([0.1, 0.2]), np.array([1, 1])))
    assert ece(np.array([0.05, 0.05, 0.95, 0.95]), y) == pytest.approx(0.05)


def test_card_entry_errors_say_what_to_do() -> None:
    from heedrank.errors import ValidationError

    with pytest.raises(ValidationError, match="fit-independent"):
        IndependentWeights.from_card({})
    with pytest.raises(ValidationError, match="refit"):
        IndependentWeights.from_card({"independent": {"layers": 1, "heads": 1, "groups": ["x"], "weights": [0.0],
                                                      "bias": 0.0, "threshold": 0.5}})
    with pytest.raises(ValidationError, match="not"):
        IndependentWeights.from_card({"independent": {"layers": 1, "heads": 1, "groups": list(GROUPS),
                                                      "weights": [0.0], "bias": 0.0, "threshold": 0.5}})

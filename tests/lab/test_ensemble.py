"""The two-model ensemble study (heedrank.lab.ensemble) on synthetic dumps: model A reads the
informative head, model B is noise, so dev gives A the weight and B at most one step of the grid."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from study_items import study_items

from typer.testing import CliRunner

from heedrank.cli import app
from heedrank.lab.ensemble import load_pair
from heedrank.lab.study import save_items

L, H = 4, 3


def _write(root, items, qrels, weights, alpha) -> None:
    root.mkdir()
    for name in ("dev", "test"):
        save_items(root / f"{name}.npz", items[name], {"qrels": qrels[name]})
    (root / "card.json").write_text(json.dumps({"weights": weights, "fusion": {"alpha": alpha}}))


def test_dev_weights_the_informative_model_and_reports_paired_deltas(tmp_path) -> None:
    items, qrels = {}, {}
    for name, seed in (("dev", 1), ("test", 2)):
        items[name], qrels[name] = study_items(30, seed, L=L, H=H)
    informative = np.zeros((L, H))
    informative[2, 1] = 1.0
    rng = np.random.default_rng(0)
    noise = {name: [replace(it, features={**it.features, "calibrated": rng.normal(size=(len(it.doc_ids), L, H))
                                          .astype(np.float32)}) for it in items[name]] for name in items}
    _write(tmp_path / "a", items, qrels, informative.tolist(), 0.5)
    _write(tmp_path / "b", noise, qrels, informative.tolist(), 0.5)
    result = CliRunner().invoke(app, ["lab", "ensemble", "--a", str(tmp_path / "a" / "card.json"), str(tmp_path / "a"),
                                      "--b", str(tmp_path / "b" / "card.json"), str(tmp_path / "b"),
                                      "--dev", "dev", "--test", "test"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    _, wa, wb = out["weights (first, A, B)"]
    assert wb <= 0.1 < wa  # B is noise (dev's 30 queries may give it a step of the grid)
    test = out["test"]
    assert test["queries"] == 30 and test["A default"] > test["B default"]
    assert test["ensemble"] >= test["A default"] - 2.0
    assert set(test["ensemble - B default"]) == {"delta", "p"}


def test_dumps_of_other_candidates_are_refused(tmp_path) -> None:
    items, qrels = study_items(3, 1, L=L, H=H)
    other = [replace(it, doc_ids=list(reversed(it.doc_ids))) for it in items]
    save_items(tmp_path / "a.npz", items, {"qrels": qrels})
    save_items(tmp_path / "b.npz", other, {"qrels": qrels})
    w = np.ones((L, H)).tolist()
    with pytest.raises(ValueError, match="other candidates"):
        load_pair(tmp_path / "a.npz", tmp_path / "b.npz", w, w)

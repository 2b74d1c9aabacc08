"""recipes/default: its helper steps on tiny inline inputs, and (slow) that the recipe's fit
step gives the packaged card's head weights to 1e-6 from the recipe's own dumps."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "recipes" / "default"
CARD = ROOT / "reranker" / "data" / "smollm2-135m-instruct.blockrank-cached.json"


def _steps():
    spec = importlib.util.spec_from_file_location("recipe_default_steps", RECIPE / "steps.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _fusion_report() -> dict:
    pure, fused = "default (pure reranker)", "interpolation: first stage + default (fused)"
    rows = {"first stage": {"ndcg@10": 35.0, "p": None}, pure: {"ndcg@10": 33.0, "p": 0.01},
            fused: {"ndcg@10": 36.5, "p": 0.02}}
    return {"chosen_on_dev": {fused: {"alpha": 0.6000000000000001, "dev": 34.4}},
            "dev": {"first stage": 32.8, pure: 30.5, fused: 34.4}, "tests": {"t": rows}}


def test_calibration_ids_leave_out_the_training_queries(tmp_path, monkeypatch) -> None:
    steps = _steps()
    monkeypatch.setattr("heedrank.data.load_beir_qrels", lambda data, split: {f"q{i}": {"d": 1} for i in range(6)})
    monkeypatch.setattr("heedrank.lab.dumps.read_query_ids", lambda paths: {"q1", "q4"})
    out = tmp_path / "ids.txt"
    steps.main(["calibration-ids", "--data", "x", "--exclude", "train.npz", "--out", str(out)])
    assert out.read_text().split() == ["q0", "q2", "q3", "q5"]
    steps.main(["calibration-ids", "--data", "x", "--exclude", "train.npz", "--limit", "2", "--out", str(out)])
    picked = out.read_text().split()
    assert len(picked) == 2 and set(picked) <= {"q0", "q2", "q3", "q5"} and picked == sorted(picked)


def test_fused_card_and_assemble_name_only_the_recipe(tmp_path) -> None:
    steps = _steps()
    work = tmp_path / "w"
    (work / "out").mkdir(parents=True)
    (work / "reports").mkdir()
    (work / "dumps").mkdir()
    (work / "dumps" / "nf-train-hybrid50.npz").write_bytes(b"dump")
    (work / "reports" / "fusion.json").write_text(json.dumps(_fusion_report()))
    fit = {"weights": [0.5, -0.25], "train": {"dumps": ["/abs/runs/x/dumps/nf-train-hybrid50.npz"], "queries": 3},
           "command": "heedrank lab fit --train /abs/runs/x/dumps/nf-train-hybrid50.npz"}
    (work / "out" / "card.fit.json").write_text(json.dumps(fit))
    steps.main(["fused-card", "--card", str(work / "out" / "card.fit.json"), "--fusion",
                str(work / "reports" / "fusion.json"), "--out", str(work / "out" / "card.fused.json")])
    fused = json.loads((work / "out" / "card.fused.json").read_text())
    assert fused["fusion"]["alpha"] == 0.6 and fused["fusion"]["test_ndcg@10"]["t"]["fused"] == 36.5
    adapter = work / "adapter" / "best"
    adapter.mkdir(parents=True)
    (adapter / "adapter.safetensors").write_bytes(b"tensors")
    (adapter / "adapter.json").write_text(json.dumps({"model": {"name": "m", "path": "/abs/model.gguf"},
                                                      "config": {"out_dir": "/abs/runs/x/adapter"}}))
    from heedrank.files import file_sha256

    calibrated = {**fused, "calibration": {"command": "heedrank lab calibrate --card /abs/x",
                                           "query_adapter_sha256": file_sha256(adapter / "adapter.safetensors")}}
    (work / "out" / "card.calibrated.json").write_text(json.dumps(calibrated))
    steps.main(["assemble", "--work", str(work), "--model", "m"])
    card = json.loads((work / "out" / "m.blockrank-cached.json").read_text())
    meta = json.loads((work / "out" / "m.query-adapter" / "adapter.json").read_text())
    text = json.dumps(card) + json.dumps(meta)
    assert "/abs" not in text  # no path of the machine that ran the recipe
    assert card["command"] == "bash recipes/default/run.sh fit"
    assert card["calibration"]["command"] == "bash recipes/default/run.sh calibrate"
    assert card["train"] == {"dumps": ["nf-train-hybrid50"], "queries": 3}
    assert card["recipe"]["dumps_sha256"] == {"nf-train-hybrid50": file_sha256(work / "dumps" / "nf-train-hybrid50.npz")}
    assert card["configuration"]["fusion"] == 0.6 and card["configuration"]["test_ndcg@10"]["t"]["default"] == 36.5
    assert card["test_ndcg@10"]["t"] == {"first stage": 35.0, "learned": 33.0, "p": 0.01}
    assert meta["command"] == "bash recipes/default/run.sh adapter"
    assert (work / "out" / "m.query-adapter" / "adapter.safetensors").read_bytes() == b"tensors"


def test_assemble_refuses_a_calibration_of_another_adapter(tmp_path) -> None:
    steps = _steps()
    work = tmp_path / "w"
    for d in ("out", "reports", "dumps", "adapter/best"):
        (work / d).mkdir(parents=True)
    (work / "reports" / "fusion.json").write_text(json.dumps(_fusion_report()))
    (work / "adapter" / "best" / "adapter.safetensors").write_bytes(b"new")
    (work / "adapter" / "best" / "adapter.json").write_text("{}")
    (work / "out" / "card.calibrated.json").write_text(json.dumps(
        {"weights": [1.0], "calibration": {"query_adapter_sha256": "0" * 64}}))
    with pytest.raises(SystemExit, match="another adapter"):
        steps.main(["assemble", "--work", str(work), "--model", "m"])


def test_assemble_packages_the_adapter_the_scorer_was_chosen_with(tmp_path) -> None:
    """`assemble --adapter mixed-adapter/best --tag mixed`: that adapter is packaged and the scorer entry
    names it; the learned path's record, measured with the adapter step's, names that one by sha256
    (its calibration then serves no cut-off maps, and assemble does not refuse it)."""
    from heedrank.files import file_sha256

    steps = _steps()
    work = tmp_path / "w"
    for d in ("out", "reports", "dumps", "adapter/best", "mixed-adapter/best"):
        (work / d).mkdir(parents=True)
    (work / "reports" / "fusion.json").write_text(json.dumps(_fusion_report()))
    for name, data in (("adapter", b"qa"), ("mixed-adapter", b"mixed")):
        (work / name / "best" / "adapter.safetensors").write_bytes(data)
        (work / name / "best" / "adapter.json").write_text(json.dumps({"config": {"init": "/abs/adapter/best"}}))
    (work / "dumps" / "mixed-dl21-bm25-30.npz").write_bytes(b"d")
    (work / "dumps" / "qa-dl21-bm25-30.npz").write_bytes(b"q")
    scorer = {"models": [], "threshold": 0.1, "command": "x", "train": {"dumps": ["/abs/w/dumps/mixed-dl21-bm25-30.npz"]}}
    (work / "out" / "card.scorer.json").write_text(json.dumps(
        {"weights": [1.0], "scorer": scorer,
         "calibration": {"query_adapter_sha256": file_sha256(work / "adapter" / "best" / "adapter.safetensors")}}))
    steps.main(["assemble", "--work", str(work), "--model", "m", "--adapter", str(work / "mixed-adapter" / "best"),
                "--tag", "mixed"])
    card = json.loads((work / "out" / "m.blockrank-cached.json").read_text())
    packaged = work / "out" / "m.query-adapter"
    assert (packaged / "adapter.safetensors").read_bytes() == b"mixed"
    assert card["scorer"]["query_adapter_sha256"] == file_sha256(packaged / "adapter.safetensors")
    assert list(card["scorer"]["dumps_sha256"]) == ["mixed-dl21-bm25-30"]
    assert card["configuration"]["query_adapter"] == (
        f"the adapter step's adapter, sha256 {file_sha256(work / 'adapter' / 'best' / 'adapter.safetensors')}")
    meta = json.loads((packaged / "adapter.json").read_text())
    assert meta["command"] == "bash recipes/default/run.sh mixed-adapter" and "/abs" not in json.dumps(meta)


def _recipe_dumps() -> Path | None:
    """The recipe's dumps folder when it holds every dump the packaged card names, unchanged."""
    work = Path(os.environ.get("RECIPE_WORK", ROOT / "runs" / "recipe" / "default-smollm2-135m-instruct"))
    want = (json.loads(CARD.read_text()).get("recipe") or {}).get("dumps_sha256") or {}
    if not want:
        return None
    from heedrank.files import file_sha256

    for name, sha in want.items():
        path = work / "dumps" / f"{name}.npz"
        if not path.is_file() or file_sha256(path) != sha:
            return None
    return work / "dumps"


@pytest.mark.slow
def test_the_fit_step_gives_the_packaged_weights(tmp_path) -> None:
    """The recipe's `fit` step, rerun on the recipe's dumps, writes the packaged head weights
    (to 1e-6) and the same L2 choice."""
    dumps = _recipe_dumps()
    if dumps is None:
        pytest.skip("the recipe's dumps are not here: run `bash recipes/default/run.sh index dumps` "
                    "(RECIPE_WORK names another work folder)")
    import numpy as np
    from typer.testing import CliRunner

    from heedrank.cli import app

    packaged = json.loads(CARD.read_text())
    out = tmp_path / "card.json"
    train = [a for name in packaged["train"]["dumps"] for a in ("--train", str(dumps / f"{name}.npz"))]
    dev = dumps / "nf-dev-hybrid50.npz"
    res = CliRunner().invoke(app, ["lab", "fit", *train, "--dev", str(dev), "--test", f"nfcorpus-dev-hybrid50={dev}",
                                   "--loss", packaged["fit"]["loss"], "--temperature",
                                   str(packaged["fit"]["temperature"]), "--export", str(out)])
    assert res.exit_code == 0, res.output
    refit = json.loads(out.read_text())
    assert refit["l2"] == packaged["l2"]
    np.testing.assert_allclose(refit["weights"], packaged["weights"], rtol=0, atol=1e-6)


@pytest.mark.parametrize("recipe", ["default", "heads"])
def test_every_step_of_a_recipe_is_defined(recipe) -> None:
    """`bash -n` accepts the script, and each step it runs (or `install`) has its function."""
    import re
    import subprocess

    script = ROOT / "recipes" / recipe / "run.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text()
    listed = re.search(r"^STEPS=\(([^)]*)\)", text, re.M)
    steps = listed.group(1).split() if listed else re.search(r"for s in ([a-z -]+); do", text).group(1).split()
    for step in [*steps, "install"]:
        assert re.search(rf"^step_{step.replace('-', '_')}\(\) \{{", text, re.M), step
    assert (ROOT / "recipes" / recipe / "README.md").is_file()


def test_seed_starts_a_work_folder_from_the_installed_card_and_adapter(tmp_path, monkeypatch) -> None:
    """`seed`: the installed card and adapter stand in for the fit and adapter steps, and the
    seeded train queries (never calibrated on) are those of the `dumps` step (seed 0, 400)."""
    steps = _steps()
    from heedrank.types import Query

    queries = {f"q{i}": Query(f"q{i}", "t") for i in range(10)}
    monkeypatch.setattr("heedrank.data.load_beir_queries", lambda data: queries)
    monkeypatch.setattr("heedrank.data.load_beir_qrels", lambda data, split: {f"q{i}": {"d": 1} for i in range(8)})
    work = tmp_path / "w"
    steps.main(["seed", "--work", str(work), "--model", "smollm2-135m-instruct", "--data", "nf", "--train-queries", "3"])
    assert json.loads((work / "out" / "card.fit.json").read_text()) == json.loads(CARD.read_text())
    adapter = ROOT / "reranker" / "data" / "smollm2-135m-instruct.query-adapter"
    assert (work / "adapter" / "best" / "adapter.safetensors").read_bytes() == (adapter / "adapter.safetensors").read_bytes()
    ids = (work / "train-queries.txt").read_text().split()
    from heedrank.eval.harness import select_queries

    assert ids == [q.query_id for q in select_queries(queries, {f"q{i}": {"d": 1} for i in range(8)}, 3, 0)[0]]
    assert len(ids) == 3 and (work / "done" / "fit").exists() and (work / "done" / "adapter").exists()


def test_web_folds_split_the_train_fold_into_disjoint_seeded_parts(tmp_path, dev600_dir) -> None:
    """MS MARCO dev-600's train fold: 150 scorer queries and 50 dev queries the web adapter never
    trains on, the other 190 lists with a relevant passage train it; none is in the test fold;
    the same files on a second run."""
    from heedrank.eval.sets import load_candidate_set

    steps = _steps()
    steps.main(["web-folds", "--data", str(dev600_dir), "--out-dir", str(tmp_path)])
    folds = {n: (tmp_path / f"web-{n}-queries.txt").read_text().split() for n in ("scorer", "dev", "train")}
    assert {n: len(v) for n, v in folds.items()} == {"scorer": 150, "dev": 50, "train": 190}
    every = [q for v in folds.values() for q in v]
    assert len(set(every)) == 390
    test = set(load_candidate_set(dev600_dir, "BM25", split="test").queries)
    assert not test & set(every)
    first = {n: list(v) for n, v in folds.items()}
    steps.main(["web-folds", "--data", str(dev600_dir), "--out-dir", str(tmp_path)])
    assert {n: (tmp_path / f"web-{n}-queries.txt").read_text().split() for n in folds} == first


def test_install_served_installs_the_scorer_with_the_adapter_it_was_chosen_with(tmp_path, monkeypatch) -> None:
    """`install-served`: the scorer entry records its adapter's sha256 and its dumps; a new adapter
    replaces the installed one (its metadata naming the recipe, not this machine), and the learned
    record names the adapter it was measured with; the rest of the card is untouched."""
    steps = _steps()
    from heedrank.files import file_sha256

    target, work = tmp_path / "data", tmp_path / "w"
    monkeypatch.setattr(steps, "install_dir", lambda model: target)
    installed = target / "smollm2-135m-instruct.query-adapter"
    installed.mkdir(parents=True)
    (installed / "adapter.safetensors").write_bytes(b"old")
    old_sha = file_sha256(installed / "adapter.safetensors")
    card = {"layer": 15, "configuration": {"query_adapter": "packaged"}, "scorer": {"old": True}, "independent": {"w": 1}}
    (target / "smollm2-135m-instruct.blockrank-cached.json").write_text(json.dumps(card))
    new = work / "mixed-adapter" / "best"
    new.mkdir(parents=True)
    (new / "adapter.safetensors").write_bytes(b"new")
    (new / "adapter.json").write_text(json.dumps({"model": {"name": "m", "path": "/here"}, "config": {"out_dir": "/x", "init": "/w/adapter/best"}}))
    (work / "out").mkdir()
    (work / "out" / "card.scorer.json").write_text(json.dumps({"scorer": {"features": ["attention"], "train": {
        "dumps": [str(work / "dumps" / "mixed-dl21.npz")]}}}))
    (work / "dumps").mkdir()
    (work / "dumps" / "mixed-dl21.npz").write_bytes(b"d")
    (work / "dumps" / "qa-dl21.npz").write_bytes(b"e")
    steps.main(["install-served", "--work", str(work), "--model", "smollm2-135m-instruct", "--adapter", str(new),
                "--tag", "mixed"])
    got = json.loads((target / "smollm2-135m-instruct.blockrank-cached.json").read_text())
    assert got["scorer"]["query_adapter_sha256"] == file_sha256(new / "adapter.safetensors")
    assert got["scorer"]["train"]["dumps"] == ["mixed-dl21"] and list(got["scorer"]["dumps_sha256"]) == ["mixed-dl21"]
    assert got["scorer"]["command"] == "bash recipes/default/run.sh scorer"
    assert got["independent"] == {"w": 1} and got["layer"] == 15
    assert got["configuration"]["query_adapter"] == f"the adapter packaged before, sha256 {old_sha}"
    assert (installed / "adapter.safetensors").read_bytes() == b"new"
    meta = json.loads((installed / "adapter.json").read_text())
    assert "path" not in meta["model"] and "out_dir" not in meta["config"] and "/w" not in meta["config"]["init"]
    assert meta["command"] == "bash recipes/default/run.sh mixed-adapter"

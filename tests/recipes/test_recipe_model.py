"""The recipes take the model and the device (``RECIPE_MODEL``, ``RECIPE_DEVICE``): every
command that loads the LM gets them, ``l*`` and the head counts scale with the model's config,
the work folder and the artefacts are named by the model, and a model that ships nothing is
installed into the user card folder, never into the package. ``heedrank`` is a fake that logs
its arguments; the model is a folder with a config and a few bytes of "weights"."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _steps():
    spec = importlib.util.spec_from_file_location("recipe_default_steps_model", ROOT / "recipes" / "default" / "steps.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def model_dir(tmp_path) -> Path:
    """A 12-layer, 6-head model folder (config and weight bytes only: it is never loaded)."""
    path = tmp_path / "Tiny LM"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"num_hidden_layers": 12, "num_attention_heads": 6}))
    (path / "model.safetensors").write_bytes(b"weights")
    return path


def _run(recipe: str, steps: list[str], tmp_path: Path, env: dict[str, str]) -> list[list[str]]:
    """Run ``recipes/<recipe>/run.sh STEPS`` with a fake ``heedrank``; its calls, one argv each."""
    log = tmp_path / "calls.jsonl"
    fake = tmp_path / "heedrank"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\n"
                    f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n")
    fake.chmod(0o755)
    full = {**os.environ, "HEEDRANK": str(fake), "PYTHON": sys.executable, "RECIPE_DATA": str(tmp_path / "data"),
            "HEEDRANK_CARD_DIR": str(tmp_path / "cards"), **env}
    res = subprocess.run(["bash", str(ROOT / "recipes" / recipe / "run.sh"), *steps], env=full, capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    return [json.loads(line) for line in log.read_text().splitlines()]


def test_model_settings_come_from_the_config(model_dir) -> None:
    steps = _steps()
    got = steps.model_settings(str(model_dir))
    assert got["layers"] == 12 and got["heads"] == 6 and got["layer"] == 6
    assert got["heads_max_layer"] == 9 and got["heads_top_k"] == 4
    assert got["name"].startswith("tiny-lm-") and len(got["name"]) == len("tiny-lm-") + 12


def test_the_default_recipe_passes_the_model_and_device_to_every_lm_command(model_dir, tmp_path) -> None:
    work = tmp_path / "work"
    calls = _run("default", ["index", "dumps", "adapter", "eval-dumps"], tmp_path,
                 {"RECIPE_MODEL": str(model_dir), "RECIPE_DEVICE": "cuda:1", "RECIPE_WORK": str(work)})
    loading = [c for c in calls if c[:2] in (["lab", "dump"], ["index", "kv"], ["lab", "train"])]
    assert len(loading) == 1 + 4 + 1 + 6  # kv build, 4 dumps, the adapter, 6 dumps with it
    for argv in loading:
        text = " ".join(argv)
        assert f"--model {model_dir} --device cuda:1 --layer 6" in text, argv  # l* = round(0.5 * 12)
    assert not any("smollm2" in " ".join(c) or "--layer 15" in " ".join(c) for c in calls)
    assert [c[:2] for c in calls if c[:2] == ["index", "build"]]  # the first stage: no LM


def test_the_default_work_folders_name_the_model() -> None:
    """Two models never share a work folder (the scripts are not run: they would create it)."""
    default = (ROOT / "recipes" / "default" / "run.sh").read_text()
    heads = (ROOT / "recipes" / "heads" / "run.sh").read_text()
    assert "W=${RECIPE_WORK:-runs/recipe/default-$MODEL_NAME}" in default
    assert "W=${RECIPE_WORK:-runs/recipe/heads-$MODEL_NAME}" in heads
    assert "OUT=$W/out/$MODEL_NAME.heads.json" in heads


def test_the_heads_recipe_passes_the_model_and_scales_its_counts(model_dir, tmp_path) -> None:
    calls = _run("heads", ["detect"], tmp_path,
                 {"RECIPE_MODEL": str(model_dir), "RECIPE_DEVICE": "cuda", "RECIPE_WORK": str(tmp_path / "w")})
    (detect,) = calls
    text = " ".join(detect)
    assert detect[:3] == ["lab", "heads", "detect"] and "--top-k 4" in text
    assert f"--model {model_dir} --device cuda" in text


def test_a_local_model_is_assembled_under_its_name_and_installed_outside_the_package(model_dir, tmp_path,
                                                                                   monkeypatch) -> None:
    steps = _steps()
    monkeypatch.setenv("HEEDRANK_CARD_DIR", str(tmp_path / "cards"))
    name = steps.model_name(str(model_dir))
    work = tmp_path / "w"
    (work / "out" / f"{name}.query-adapter").mkdir(parents=True)
    (work / "out" / f"{name}.blockrank-cached.json").write_text("{}")
    for f in ("adapter.json", "adapter.safetensors"):
        (work / "out" / f"{name}.query-adapter" / f).write_text("{}")
    before = sorted(p.name for p in steps.DATA.iterdir())
    steps.main(["install", "--work", str(work), "--model", str(model_dir)])
    assert (tmp_path / "cards" / f"{name}.blockrank-cached.json").is_file()
    assert (tmp_path / "cards" / f"{name}.query-adapter" / "adapter.safetensors").is_file()
    assert sorted(p.name for p in steps.DATA.iterdir()) == before  # nothing written into the package
    assert steps.install_dir("smollm2-135m-instruct") == steps.DATA

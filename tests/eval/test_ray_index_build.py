"""``heedrank index build --engine ray`` (``build_index(..., engine=RayEngine(...))``): the dense
chunks are encoded on an actor pool into the build's checkpoint, and the index equals the one the
local build writes, byte for byte with the hashing encoder, to float32 rounding with the packaged
embedder; a worker whose embedder differs from the driver's fails the build, typed. One local Ray
instance for the session (``ray_fakes.ray_local``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from heedrank.engine import EngineOptions
from heedrank.errors import ValidationError
from heedrank.index.builder import VectorJob, build_index, encoder_identity
from heedrank.index.hashing import HashingEncoder
from ray_fakes import ray_local  # noqa: F401 - a fixture

N = 2600  # three chunks of 1,000 documents


def _corpus(path: Path, n: int) -> Path:
    words = ["vitamin", "statin", "fish", "oil", "bone", "milk", "colon", "heart", "risk", "diet"]
    rng = np.random.default_rng(0)
    rows = [{"_id": f"d{i}", "title": "", "text": " ".join(rng.choice(words, 8))} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _ray(actors: int = 2):
    from heedrank.engine.ray import RayEngine

    return RayEngine(EngineOptions(engine="ray", actors=actors))


@pytest.mark.usefixtures("ray_local")
def test_a_ray_build_writes_the_local_build_s_index(tmp_path: Path) -> None:
    corpus = _corpus(tmp_path / "corpus.jsonl", N)
    local = build_index(corpus, tmp_path / "local", encoder=HashingEncoder(64), show_progress=False)
    ray = build_index(corpus, tmp_path / "ray", encoder=HashingEncoder(64), show_progress=False, engine=_ray())
    assert (tmp_path / "ray" / "vectors.faiss").read_bytes() == (tmp_path / "local" / "vectors.faiss").read_bytes()
    assert ray["num_docs"] == local["num_docs"] == N and ray["dense"] == local["dense"]
    assert not list(tmp_path.glob(".ray.*"))  # the checkpoint is removed once the index is written


@pytest.mark.usefixtures("ray_local")
def test_a_ray_build_with_the_packaged_embedder_gives_its_vectors(tmp_path: Path) -> None:
    """The actors load the packaged all-MiniLM-L6-v2 themselves (1 torch thread each) and
    their vectors equal the local build's to float32 rounding."""
    from heedrank.index.store import Index

    rows = ["Vitamin D supplementation and bone mineral density in older women",
            "Statins lower LDL cholesterol and the risk of cardiovascular events.",
            "The Eiffel Tower is in Paris.", "Green tea extract and weight loss in obese adults."]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "title": "", "text": t}) + "\n" for i, t in enumerate(rows)))
    build_index(corpus, tmp_path / "local", show_progress=False)
    params = build_index(corpus, tmp_path / "ray", show_progress=False, engine=_ray(1))
    assert params["dense"]["embedder"]["name"] == "all-MiniLM-L6-v2"
    a, b = Index.open(tmp_path / "local"), Index.open(tmp_path / "ray")
    try:
        labels = np.asarray(a.dense.labels())
        np.testing.assert_array_equal(labels, np.asarray(b.dense.labels()))
        np.testing.assert_allclose(a.dense.vectors(labels), b.dense.vectors(labels), atol=1e-5)
    finally:
        a.close(), b.close()


def test_a_worker_with_another_embedder_fails_typed(tmp_path: Path) -> None:
    """The actor compares its embedder's identity with the driver's before encoding anything
    (checked here in-process: the actor class, called as Ray Data calls it)."""
    from heedrank.engine.ray import _VectorEncoder

    job = VectorJob(tmp_path / "corpus.jsonl", 4, (0,), tmp_path, HashingEncoder, {**encoder_identity(HashingEncoder(64)),
                                                                                  "dim": 32})
    actor = _VectorEncoder(job)
    out = actor({"seq": [0], "payload": [json.dumps({"chunk": 0, "docs": []})]})
    record = json.loads(out["result"][0])
    assert record["error"]["type"] == ValidationError.__name__ and "another embedder" in record["error"]["message"]

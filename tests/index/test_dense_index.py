"""index.dense (faiss) against brute force, padding, persistence; index.hashing; encoder resolution."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from attnrank.errors import ModelLoadError, NotFoundError, ValidationError
from attnrank.protocols import Encoder
from index.dense import DenseIndex
from index.encoder import SentenceTransformerEncoder, file_sha256, model_sha256, packaged_model_dir, resolve_model_dir
from index.hashing import HashingEncoder


def _unit(rng: np.random.Generator, n: int, d: int) -> np.ndarray:
    x = rng.standard_normal((n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_search_matches_brute_force() -> None:
    rng = np.random.default_rng(0)
    x, q = _unit(rng, 50, 16), _unit(rng, 4, 16)
    ids = np.arange(100, 150, dtype=np.int64)
    idx = DenseIndex(16)
    idx.add(x, ids)
    scores, got = idx.search(q, 5)
    assert scores.shape == got.shape == (4, 5)
    assert scores.dtype == np.float32 and got.dtype == np.int64
    exact = q @ x.T
    for i in range(4):
        order = np.argsort(-exact[i])[:5]
        assert got[i].tolist() == ids[order].tolist()
        np.testing.assert_allclose(scores[i], exact[i, order], rtol=1e-5)


def test_k_larger_than_index_never_leaks_padding() -> None:
    rng = np.random.default_rng(1)
    idx = DenseIndex(8)
    idx.add(_unit(rng, 3, 8), np.array([7, 8, 9]))
    scores, ids = idx.search(_unit(rng, 2, 8), 10)
    assert ids.shape == (2, 3) and (ids >= 0).all() and np.isfinite(scores).all()
    assert sorted(ids[0].tolist()) == [7, 8, 9]
    empty = DenseIndex(8)
    s, i = empty.search(_unit(rng, 2, 8), 10)
    assert s.shape == i.shape == (2, 0)


def test_validation_and_persistence(tmp_path: Path) -> None:
    idx = DenseIndex(4)
    with pytest.raises(ValidationError):
        idx.add(np.ones((2, 3), dtype=np.float32), np.array([0, 1]))
    with pytest.raises(ValidationError):
        idx.add(np.ones((1, 4), dtype=np.float32), np.array([-1]))
    idx.add(np.eye(4, dtype=np.float32), np.array([3, 2, 1, 0]))
    idx.save(tmp_path / "vectors.faiss")
    loaded = DenseIndex.load(tmp_path / "vectors.faiss")
    assert len(loaded) == 4 and loaded.dim == 4
    np.testing.assert_array_equal(loaded.reconstruct(2), [0, 1, 0, 0])
    scores, ids = loaded.search(np.array([0, 0, 1, 0], dtype=np.float32), 1)
    assert ids.tolist() == [[1]] and scores.tolist() == [[1.0]]
    with pytest.raises(NotFoundError):
        DenseIndex.load(tmp_path / "missing.faiss")
    (tmp_path / "bad.faiss").write_bytes(b"garbage")
    with pytest.raises(NotFoundError):
        DenseIndex.load(tmp_path / "bad.faiss")


def test_hashing_encoder_is_deterministic_and_normalised() -> None:
    enc = HashingEncoder(32)
    assert isinstance(enc, Encoder)
    a = enc.encode_documents(["apple pie recipe", "car engine", ""])
    b = enc.encode_queries(["apple pie recipe"])
    assert a.shape == (3, 32) and a.dtype == np.float32
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_allclose(np.linalg.norm(a[:2], axis=1), 1.0, rtol=1e-6)
    assert not a[2].any()


def test_encoder_resolution_without_loading(tmp_path: Path) -> None:
    pkg = packaged_model_dir()
    assert (pkg / "model.safetensors").is_file()
    assert resolve_model_dir(None) == pkg == resolve_model_dir("all-MiniLM-L6-v2")
    with pytest.raises(ModelLoadError, match="not a local directory"):
        resolve_model_dir("sentence-transformers/some-hub-model")
    empty = tmp_path / "empty-model"
    empty.mkdir()
    with pytest.raises(ModelLoadError, match="no weights"):
        SentenceTransformerEncoder(empty)
    (empty / "model.safetensors").write_bytes(b"abc")
    assert model_sha256(empty) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    assert file_sha256(empty / "model.safetensors") == model_sha256(empty)
    enc = SentenceTransformerEncoder()  # constructing does not load the model
    assert enc._model is None and enc.name == "all-MiniLM-L6-v2"

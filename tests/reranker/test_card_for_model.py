"""A local model (``--model DIR``) is served with the card installed for it in the user card
folder, matched by sha256; without one (or with one for another model) it is served with the
calibrated scorer and says so (a tiny random-weight Llama of test_architectures, no download)."""

from __future__ import annotations

import json
import logging

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from test_architectures import LAYER, MAX_DOC_TOKENS, _build, _configs, tokenizer_dir  # noqa: E402,F401

from heedrank.config import RerankerConfig  # noqa: E402
from heedrank.reranker.cached import CachedBlockRankReranker  # noqa: E402
from heedrank.reranker.cards import model_card_name  # noqa: E402
from heedrank.reranker.doccache import CACHE_TEMPLATE_VERSION  # noqa: E402


@pytest.fixture(scope="module")
def lm(tokenizer_dir, tmp_path_factory):  # noqa: F811
    cls_name, kw = _configs()["llama-gqa-tied"]
    return _build("llama-gqa-tied", cls_name, kw, tokenizer_dir, tmp_path_factory.mktemp("My-LM"))


def _auto(lm) -> CachedBlockRankReranker:
    opts = {"query_adapter": "auto", "layer": LAYER, "scoring": "auto", "chat_template": False}
    return CachedBlockRankReranker(RerankerConfig(method="blockrank-cached", max_doc_tokens=MAX_DOC_TOKENS,
                                                  options=opts), lm=lm)


def _install(folder, lm, sha: str):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{model_card_name(lm.identity)}.blockrank-cached.json"
    n = (LAYER + 1) * lm.num_heads
    path.write_text(json.dumps({"model": lm.identity["name"], "model_sha256": sha, "layer": LAYER,
                                "max_doc_tokens": MAX_DOC_TOKENS, "template": CACHE_TEMPLATE_VERSION,
                                "spec": "heads", "weights": [0.1 * (i % 5) for i in range(n)]}))
    return path


def test_a_model_without_a_card_is_served_calibrated_and_says_so(lm, tmp_path, monkeypatch, caplog) -> None:
    from heedrank.api.routes.info import served_card

    monkeypatch.setenv("HEEDRANK_CARD_DIR", str(tmp_path / "cards"))
    with caplog.at_level(logging.WARNING, logger="heedrank.reranker.cached.state"):
        r = _auto(lm)
        assert r.scoring == "calibrated" and r.card is None
    assert "no weights card" in caplog.text
    assert served_card(r) == (None, "calibrated")


def test_the_card_installed_for_the_model_serves_it(lm, tmp_path, monkeypatch) -> None:
    from heedrank.api.routes.info import served_card

    monkeypatch.setenv("HEEDRANK_CARD_DIR", str(tmp_path / "cards"))
    path = _install(tmp_path / "cards", lm, lm.identity["sha256"])
    r = _auto(lm)
    assert r.scoring == "learned" and r.card is not None and r.card.path == str(path)
    card, scoring = served_card(r)
    assert scoring == "learned" and card == {"path": path.name, "packaged": False, "model": lm.identity["name"],
                                             "model_sha256": lm.identity["sha256"], "layer": LAYER}


def test_a_card_for_another_models_sha_is_not_used(lm, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HEEDRANK_CARD_DIR", str(tmp_path / "cards"))
    _install(tmp_path / "cards", lm, "0" * 64)
    r = _auto(lm)
    assert r.scoring == "calibrated" and r.card is None

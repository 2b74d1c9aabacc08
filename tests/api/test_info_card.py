"""``GET /info`` says which weights card answered for the served model (path, model and sha256
it was fitted for) and the scorer in use; ``null`` and the scorer when none did (fakes, no LM)."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

from heedrank.api.costs import MethodCosts
from typing import Any

from heedrank.api.routes.info import _info
from heedrank.reranker.cards import WeightsCard, read_card
from heedrank.reranker.options import DEFAULT_METHOD
from heedrank.settings import Settings
from serving_fakes import AttributeServing  # noqa: E402


class Served(AttributeServing):
    """Stands for a built cached BlockRank reranker: its card and scorer, no LM."""

    def __init__(self, card: WeightsCard | None, scoring: str) -> None:
        self.card, self.scoring = card, scoring

    def describe(self) -> dict[str, Any]:
        return {"method": DEFAULT_METHOD, "scoring": self.scoring}


def _runtime(reranker: Any) -> Any:
    return SimpleNamespace(status="ok", started=time.time(), describe=lambda: {}, costs=MethodCosts(),
                           rerankers=SimpleNamespace(loaded=lambda: {DEFAULT_METHOD: reranker}))


def test_info_names_the_card_that_answered(tmp_path) -> None:
    path = tmp_path / "my-lm-abababababab.blockrank-cached.json"
    path.write_text(json.dumps({"model": "My LM", "model_sha256": "ab" * 32, "layer": 2, "weights": [1.0]}))
    info = _info(_runtime(Served(read_card(path), "learned")), Settings(index="unused"))
    assert info.reranker.card == {"path": path.name, "packaged": False, "model": "My LM",
                                  "model_sha256": "ab" * 32, "layer": 2}  # the server's folders are not shown
    assert info.reranker.scoring == "learned"
    assert json.loads(info.model_dump_json())["reranker"]["card"]["model_sha256"] == "ab" * 32


def test_info_says_null_and_the_scorer_without_a_card() -> None:
    info = _info(_runtime(Served(None, "calibrated")), Settings(index="unused"))
    assert info.reranker.card is None and info.reranker.scoring == "calibrated"
    body = json.loads(info.model_dump_json())["reranker"]
    assert body["card"] is None and body["scoring"] == "calibrated"


def test_info_before_loading_has_neither() -> None:
    runtime = SimpleNamespace(status="loading", started=time.time(), describe=lambda: {}, rerankers=None,
                              costs=MethodCosts())
    info = _info(runtime, Settings(index="unused"))
    assert info.reranker.card is None and info.reranker.scoring is None

"""``GET /info``'s per-method limits: built once per LM, never per call (building cached
BlockRank around the LM copies it for its query adapter, about a second on 2 cores), and a
method built under an alias answers itself (fakes, no LM)."""

from __future__ import annotations

from typing import Any

from heedrank import registry
from heedrank.api.routes.info import method_limits
from heedrank.config import RerankerConfig
from heedrank.settings import Settings


class LM:
    """Stands for a loaded LM (weak-referenceable, as the real one)."""


class Limited:
    """A reranker whose construction is counted (stands for an expensive build)."""

    builds = 0

    def __init__(self, config: RerankerConfig, lm: Any = None) -> None:
        Limited.builds += 1
        self.config, self.loaded_lm = config, lm

    def limits(self) -> dict[str, Any]:
        return {"context": 8192, "max_query_tokens": 128, "max_candidates": None, "method": self.config.method}


def test_limits_of_methods_not_built_are_computed_once_per_lm(monkeypatch) -> None:
    monkeypatch.setitem(registry._RERANKERS, "limited", Limited)
    monkeypatch.setitem(registry._RERANKERS, "limited-too", Limited)
    Limited.builds = 0
    lm = LM()
    base = Limited(RerankerConfig(method="limited"), lm)
    settings = Settings(index="unused", rerank_method="limited", max_candidates=50, max_documents=40)
    for _ in range(5):
        out = method_limits({"limited": base}, settings, ["limited", "limited-too"])
    assert Limited.builds == 2  # the loaded one, then limited-too once
    assert out["limited-too"]["method"] == "limited-too" and out["limited"]["method"] == "limited"
    assert out["limited-too"]["max_candidates"] == 50 and out["limited-too"]["max_documents"] == 40
    method_limits({"limited": base}, settings, ["limited-too"])
    other = LM()  # another LM (a restart with another model): computed again
    method_limits({"limited": Limited(RerankerConfig(method="limited"), other)}, settings, ["limited-too"])
    assert Limited.builds == 4


def test_a_method_built_under_its_alias_answers_itself(monkeypatch) -> None:
    from heedrank.reranker.options import DEFAULT_METHOD

    monkeypatch.setitem(registry._RERANKERS, DEFAULT_METHOD, Limited)
    Limited.builds = 0
    served = Limited(RerankerConfig(method="default"), LM())
    settings = Settings(index="unused", rerank_method="default")
    out = method_limits({"default": served}, settings, ["default", DEFAULT_METHOD])
    assert Limited.builds == 1  # the served one: no second reranker built for the method's own name
    assert out[DEFAULT_METHOD] == out["default"]

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


def test_a_measured_method_states_what_fits_the_request_budget(monkeypatch) -> None:
    """Once a method was measured on the service (:class:`heedrank.api.costs.MethodCosts`), its
    limits say how many candidates fit the per-request budget: what ``/search`` then accepts."""
    from heedrank.api.costs import MethodCosts

    monkeypatch.setitem(registry._RERANKERS, "limited", Limited)
    base = Limited(RerankerConfig(method="limited"), LM())
    settings = Settings(index="unused", rerank_method="limited", max_candidates=100, request_budget_s=20)
    costs = MethodCosts()
    assert "max_candidates_in_budget" not in method_limits({"limited": base}, settings, ["limited"], costs)["limited"]
    costs.stopped("limited", 20.0, 100)  # 100 candidates stopped by the 20 s budget: >= 0.2 s each
    out = method_limits({"limited": base}, settings, ["limited"], costs)["limited"]
    assert out["seconds_per_candidate"] == 0.2 and out["max_candidates_in_budget"] == 90
    assert out["max_candidates"] == 100  # what the model holds is still said apart
    costs.observe("limited", 0.5, 10)  # a fast completion pulls the running mean down
    assert method_limits({"limited": base}, settings, ["limited"], costs)["limited"]["max_candidates_in_budget"] > 90

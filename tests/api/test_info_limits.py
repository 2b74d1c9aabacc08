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
    """Each method's limits say what fits the per-request budget, warm and cold
    (:class:`heedrank.api.costs.MethodCosts`): null before it was measured, then the figures
    ``/search`` (warm) and ``/rerank`` (cold) refuse past, capped by the service's limits."""
    from heedrank.api.costs import MethodCosts

    monkeypatch.setitem(registry._RERANKERS, "limited", Limited)
    base = Limited(RerankerConfig(method="limited"), LM())
    settings = Settings(index="unused", rerank_method="limited", max_candidates=100, max_documents=50,
                        request_budget_s=20)
    costs = MethodCosts()
    out = method_limits({"limited": base}, settings, ["limited"], costs)["limited"]
    assert out["seconds_per_candidate"] == {"warm": None, "cold": None}
    assert out["max_candidates_in_budget"] == {"warm": None, "cold": None}
    assert out["max_documents_in_budget"] == {"warm": None, "cold": None}
    costs.stopped("limited", 20.0, 100)  # 100 candidates stopped by the 20 s budget: >= 0.2 s each (no blocks: both)
    out = method_limits({"limited": base}, settings, ["limited"], costs)["limited"]
    assert out["seconds_per_candidate"] == {"warm": 0.2, "cold": 0.2}
    assert out["max_candidates_in_budget"] == {"warm": 90, "cold": 90}
    assert out["max_documents_in_budget"] == {"warm": 50, "cold": 50}  # capped by max_documents
    assert out["max_candidates"] == 100  # what the model holds is still said apart
    costs.observe("limited", 0.5, 10)  # a fast completion pulls the running mean down
    assert method_limits({"limited": base}, settings, ["limited"], costs)["limited"]["max_candidates_in_budget"]["warm"] > 90


def test_a_seeded_method_states_warm_and_cold_apart(monkeypatch) -> None:
    """A method that reads stored blocks is timed warm and cold (the start-up warm-up's seed):
    the two figures differ, requests refine each from their own kind, and without a budget no
    count fits (null)."""
    from heedrank.api.costs import MethodCosts

    monkeypatch.setitem(registry._RERANKERS, "limited", Limited)
    base = Limited(RerankerConfig(method="limited"), LM())
    settings = Settings(index="unused", rerank_method="limited", max_candidates=100, max_documents=100,
                        request_budget_s=10)
    costs = MethodCosts()
    costs.seed("limited", 0.05, 0.3)
    out = method_limits({"limited": base}, settings, ["limited"], costs)["limited"]
    assert out["seconds_per_candidate"] == {"warm": 0.05, "cold": 0.3}
    assert out["max_candidates_in_budget"] == {"warm": 100, "cold": 30}  # 9 s / 0.05 = 180, capped at 100
    assert out["max_documents_in_budget"] == {"warm": 100, "cold": 30}
    costs.seed("limited", 1.0, 1.0)  # a seed is a prior: it never replaces a figure
    costs.observe("limited", 6.0, 10, cold=10)  # all cold: only the cold figure moves
    costs.observe("limited", 6.0, 10, cold=4)  # a mix: neither
    assert costs.seconds_per_candidate("limited", "warm") == 0.05
    assert abs(costs.seconds_per_candidate("limited", "cold") - (0.7 * 0.3 + 0.3 * 0.6)) < 1e-9
    costs.stopped("limited", 9.0, 10, cold=10)  # stopped with cold candidates: bounds the cold figure only
    assert costs.seconds_per_candidate("limited", "cold") == 0.9 and costs.seconds_per_candidate("limited") == 0.05
    unbudgeted = settings.model_copy(update={"request_budget_s": None})
    out = method_limits({"limited": base}, unbudgeted, ["limited"], costs)["limited"]
    assert out["max_candidates_in_budget"] == {"warm": None, "cold": None} and out["seconds_per_candidate"]["warm"] == 0.05

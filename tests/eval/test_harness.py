"""Report names of the evaluation harness (:mod:`heedrank.eval.harness`)."""

from __future__ import annotations

from heedrank.config import RerankerConfig
from heedrank.eval.harness import config_suffix


def test_a_null_option_reads_null() -> None:
    config = RerankerConfig(method="blockrank-cached",
                            options={"query_adapter": None, "scoring": "calibrated", "layer": 12})
    suffix = config_suffix(config, reranking=True)
    assert suffix is not None and suffix.startswith("t128-")
    parts = dict(p.split("=", 1) for p in suffix.split("-")[1:])
    assert parts["query_adapter"] == "null" and parts["scoring"] == "calibrated"
    assert parts["layer"] == "12"
    assert config_suffix(config, reranking=False) is None

"""The embedder alone as a method (``dense``, :class:`heedrank.reranker.dense.DenseReranker`): it is
registered, served by the packaged card's model of the cosine alone, and orders by the cosine."""

from __future__ import annotations

import json
from pathlib import Path

from heedrank import registry
from heedrank.config import RerankerConfig
from heedrank.reranker.dense import DenseReranker

CARD = Path(__file__).resolve().parents[2] / "reranker" / "data" / "smollm2-135m-instruct.blockrank-cached.json"


def test_dense_is_a_method_served_by_the_cards_cosine_model() -> None:
    assert "dense" in registry.reranker_names()
    r = registry.build_reranker(RerankerConfig(method="dense"))
    assert isinstance(r, DenseReranker)
    traits = r.serving()
    alone = next(m for m in json.loads(CARD.read_text())["scorer"]["models"] if m["uses"] == ["dense"])
    assert traits.signal == "dense" and traits.scorer is not None
    assert [(m.uses, m.weights, m.bias) for m in traits.scorer.models] == [(("dense",), tuple(alone["weights"]),
                                                                             alone["bias"])]
    assert alone["weights"][0] > 0  # a higher cosine, a higher probability

"""``scoring='independent'`` with the packaged LM and the packaged card's ``independent`` entry: on
obvious cases the relevant document's probability is the same alone and in any list or position,
it is far above the off-topic documents', and empty or junk text gets almost nothing."""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torch")

from heedrank.config import RerankerConfig  # noqa: E402
from heedrank.registry import build_reranker  # noqa: E402
from heedrank.types import Document, Query  # noqa: E402

QUERY = "Which vitamin deficiency causes scurvy?"
RELEVANT = "Scurvy is caused by a lack of vitamin C in the diet; it was common among sailors."
OFF_TOPIC = [
    "Tide tables list the times of high and low tide for coastal towns.",
    "The stock market closed higher on Friday after strong earnings reports.",
    "The violin has four strings tuned in perfect fifths.",
    "Chess is played on a board of sixty-four squares.",
]


@pytest.fixture(scope="module")
def reranker():
    return build_reranker(RerankerConfig(method="default", options={"scoring": "independent"})).load()


def _p(result, doc_id: str) -> float:
    score = {h.doc_id: h.score for h in result.ranking.hits}[doc_id]
    return 1.0 / (1.0 + math.exp(-score))


def test_the_relevant_document_has_one_probability_wherever_it_is_sent(reranker) -> None:
    traits = reranker.serving()  # served by the default scorer when the card holds one, else on its own
    assert reranker.scoring == "independent" and (traits.scorer is not None or traits.independent is not None)
    alone = _p(reranker.rerank(Query("q", QUERY), [Document("r", RELEVANT)]), "r")
    for position in range(len(OFF_TOPIC) + 1):
        docs = [Document(f"o{i}", t) for i, t in enumerate(OFF_TOPIC)]
        docs.insert(position, Document("r", RELEVANT))
        result = reranker.rerank(Query("q", QUERY), docs)
        assert result.ranking.hits[0].doc_id == "r"
        assert abs(_p(result, "r") - alone) < 1e-4
        assert all(_p(result, f"o{i}") < alone / 3 for i in range(len(OFF_TOPIC)))


@pytest.mark.parametrize("text", ["", "   ", "qzx vbnm plok wert yuio asdf ghjk"])
def test_junk_alone_gets_almost_nothing(reranker, text) -> None:
    assert _p(reranker.rerank(Query("q", QUERY), [Document("j", text)]), "j") < 0.1

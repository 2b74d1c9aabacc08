"""The embedder alone as a reranker (method ``dense``): candidates ordered by the cosine of their
embedding with the query's, no LM. It is the default's ``dense`` signal on its own
(:mod:`heedrank.scorer`), so that what the LM adds is one product command away
(``--rerank dense`` beside ``--rerank default``).

Embeddings: the packaged embedder (all-MiniLM-L6-v2, the default index's), through
:func:`heedrank.registry.dense_signal` (texts encoded once and cached by their hash). Its
``relevance`` is the default card's calibrated probability of the cosine alone (the card's
``scorer`` model over ``dense``); without that card, the cosine itself (uncalibrated).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from heedrank import registry
from heedrank.config import RerankerConfig
from heedrank.protocols import RerankResult
from heedrank.seam import RerankerServing
from heedrank.types import Document, Query, Ranking


class DenseReranker:
    """Cosine of the embedder's query and document vectors (unitless, in [-1, 1]); see the module docstring."""

    name = "dense"

    def __init__(self, config: RerankerConfig | None = None) -> None:
        self.config = config or RerankerConfig(method="dense")

    @classmethod
    def from_config(cls, config: RerankerConfig) -> DenseReranker:
        return cls(config)

    def rerank(self, query: Query, candidates: Sequence[Document], *, block_store: Any = None) -> RerankResult:
        t0 = time.perf_counter()
        cos = registry.dense_signal().cosines(query.text, list(candidates), stored=False)
        return RerankResult(Ranking.from_scores(query.query_id, cos), seconds=time.perf_counter() - t0)

    def rerank_batch(self, queries: Sequence[Query], candidates: Sequence[Sequence[Document]]) -> list[RerankResult]:
        return [self.rerank(q, c) for q, c in zip(queries, candidates)]

    def describe(self) -> dict[str, Any]:
        return {"method": self.name, "embedder": registry.dense_signal().describe().get("embedder")}

    def serving(self) -> RerankerServing:
        """Served by the default card's model of the cosine alone (a calibrated probability), when
        the card holds one; else ``relevance`` is the cosine."""
        from heedrank.reranker.cards import packaged_card

        card = packaged_card(None)
        alone = card.scorer.only(["dense"]) if card is not None and card.scorer is not None else None
        if alone is None:
            return RerankerServing(score_scale=None)
        return RerankerServing(alone, alone.threshold, signal="dense")

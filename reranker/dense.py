"""The embedder alone as a reranker (method ``dense``): candidates ordered by the cosine of their
embedding with the query's, no LM. It is the default's ``dense`` signal
(:mod:`heedrank.signals.dense`) served by itself, so that what the LM adds is one product command
away (``--rerank dense`` beside ``--rerank default``).

Embeddings: the packaged embedder (all-MiniLM-L6-v2, the default index's), through
:func:`heedrank.registry.dense_signal` (texts encoded once and cached by their hash). Its
``relevance`` is the default card's calibrated probability of the cosine alone (the card's
``scorer`` model over ``dense``, :func:`heedrank.reranker.cards.signal_scorer`); without that
card, the cosine itself (uncalibrated). Served through the pipeline, the rerank stage gathers the
signal itself (the index's stored vectors on ``/search``) and runs no pass of this class
(:attr:`heedrank.seam.RerankerServing.signal`); :meth:`DenseReranker.rerank` is the same signal
for a caller without a stage, or an index without vectors.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from heedrank import registry
from heedrank.config import RerankerConfig
from heedrank.protocols import Reranker, RerankResult
from heedrank.reranker.cards import signal_scorer
from heedrank.seam import RerankerServing
from heedrank.signals import SignalInputs, dense
from heedrank.types import Document, Query, Ranking, ScoredDoc


class DenseReranker(Reranker):
    """Cosine of the embedder's query and document vectors (unitless, in [-1, 1]); see the module docstring."""

    name = "dense"

    def __init__(self, config: RerankerConfig | None = None) -> None:
        self.config = config or RerankerConfig(method="dense")

    @classmethod
    def from_config(cls, config: RerankerConfig) -> DenseReranker:
        return cls(config)

    def rerank(self, query: Query, candidates: Sequence[Document], *, block_store: Any = None) -> RerankResult:
        """The candidates by the ``dense`` signal of their texts (the packaged embedder, no stored vectors)."""
        t0 = time.perf_counter()
        given = Ranking(query.query_id, tuple(ScoredDoc(d.doc_id, 0.0, d) for d in candidates))
        cosines = dense.SIGNAL.values(SignalInputs(query, given, dense=registry.dense_signal(), stored=False))
        ranking = Ranking.from_scores(query.query_id, {d.doc_id: float(c) for d, c in zip(candidates, cosines)})
        return RerankResult(ranking, seconds=time.perf_counter() - t0)

    def rerank_batch(self, queries: Sequence[Query], candidates: Sequence[Sequence[Document]]) -> list[RerankResult]:
        return [self.rerank(q, c) for q, c in zip(queries, candidates)]

    def describe(self) -> dict[str, Any]:
        return {"method": self.name, "embedder": registry.dense_signal().describe().get("embedder")}

    def serving(self) -> RerankerServing:
        """Its own scores are the ``dense`` signal, served by the default card's model of the cosine
        alone (a calibrated probability) when the card holds one; else ``relevance`` is the cosine."""
        alone = signal_scorer(dense.NAME)
        if alone is None:
            return RerankerServing(signal=dense.NAME)
        return RerankerServing(alone, alone.threshold, signal=dense.NAME)

"""A FAKE reranker for evaluation tests (no language model is loaded)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from heedrank.config import RerankerConfig
from heedrank.protocols import RerankResult
from heedrank.types import Document, Query, Ranking


class FakeReranker:
    """Scores candidates by ``1 / len(content)`` (shorter first); documents longer than 300
    characters are reported as truncated."""

    name = "fake"

    def __init__(self, config: RerankerConfig) -> None:
        self.config = config

    @classmethod
    def from_config(cls, config: RerankerConfig) -> FakeReranker:
        return cls(config)

    def rerank(self, query: Query, candidates: Sequence[Document]) -> RerankResult:
        return RerankResult(
            ranking=Ranking.from_scores(query.query_id, {d.doc_id: 1.0 / (1 + len(d.content)) for d in candidates}),
            truncated=tuple(d.doc_id for d in candidates if len(d.content) > 300),
            prompt_tokens=sum(len(d.content.split()) for d in candidates),
        )

    def rerank_batch(self, queries, candidates):
        return [self.rerank(q, c) for q, c in zip(queries, candidates)]

    def describe(self) -> dict[str, Any]:
        return {"method": "fake", "model": "none", "max_doc_tokens": self.config.max_doc_tokens}

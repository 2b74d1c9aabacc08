"""Shared plumbing of the attention rerankers."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from attnrank.config import RerankerConfig
from attnrank.errors import ValidationError
from attnrank.protocols import RerankResult
from attnrank.types import Document, Query


class AttentionReranker:
    """Base class: holds the config and the lazily loaded LM; subclasses implement ``rerank``."""

    name = "attention"
    template_version = "v1"

    def __init__(self, config: RerankerConfig, lm: Any = None) -> None:
        if config.max_doc_tokens < 1:
            raise ValidationError(f"max_doc_tokens must be >= 1, got {config.max_doc_tokens}")
        self.config = config
        self._lm = lm

    @classmethod
    def from_config(cls, config: RerankerConfig) -> AttentionReranker:
        return cls(config)

    @property
    def lm(self):
        """The loaded LM (:class:`reranker.lm.LoadedLM`), loaded on first use."""
        if self._lm is None:
            from reranker.lm import load_lm

            self._lm = load_lm(
                self.config.model, device=self.config.device, dtype=self.config.dtype, cache_dir=self.config.cache_dir
            )
        return self._lm

    def load(self) -> AttentionReranker:
        """Load the model now (the API does this at start-up)."""
        _ = self.lm
        return self

    def option(self, key: str, default: Any) -> Any:
        return self.config.options.get(key, default)

    def rerank(self, query: Query, candidates: Sequence[Document]) -> RerankResult:  # pragma: no cover
        raise NotImplementedError

    def rerank_batch(self, queries: Sequence[Query], candidates: Sequence[Sequence[Document]]) -> list[RerankResult]:
        """One :class:`RerankResult` per query (queries run one after another)."""
        if len(queries) != len(candidates):
            raise ValidationError(f"{len(queries)} queries but {len(candidates)} candidate lists")
        return [self.rerank(q, c) for q, c in zip(queries, candidates)]

    def describe(self) -> dict[str, Any]:
        return {
            "method": self.name,
            "template_version": f"{self.name}-{self.template_version}",
            "model": self.lm.identity,
            "max_doc_tokens": self.config.max_doc_tokens,
            "device": self.config.device,
            "dtype": self.config.dtype,
            "options": dict(self.config.options),
        }

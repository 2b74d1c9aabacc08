"""Request and response bodies of the REST API (pydantic v2)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_QUERY_CHARS = 4096
"""Longest accepted query text, in characters."""


class RerankRequest(BaseModel):
    """Second-stage options of a search."""

    model_config = ConfigDict(extra="forbid")

    method: str | None = Field(
        None,
        description="Reranker name (e.g. 'icr'), or 'none' for first-stage order; "
        "default: the service's reranker (ATTNRANK_RERANK_METHOD).",
        examples=["icr"],
    )
    candidates: int | None = Field(
        None, ge=1,
        description="First-stage hits reranked (at most the service's max_candidates); "
        "default: ATTNRANK_DEFAULT_CANDIDATES.",
    )


class SearchRequest(BaseModel):
    """Body of ``POST /search``."""

    model_config = ConfigDict(extra="forbid")

    query: str = Field(..., max_length=MAX_QUERY_CHARS, description="Query text (non-empty).")
    top_k: int = Field(10, ge=1, description="Number of results (at most the service's max_top_k).")
    retriever: str = Field("bm25", description="First-stage retriever: bm25, dense or hybrid (as indexed).")
    rerank: RerankRequest | None = Field(
        None, description="Reranking options; omitted or null = first-stage order only."
    )

    @field_validator("query")
    @classmethod
    def _non_empty(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("query must not be empty or only whitespace")
        return value


class Hit(BaseModel):
    """One result."""

    doc_id: str
    score: float = Field(
        description="Reranker score for reranked hits, first-stage score otherwise (shifted below the "
        "reranked ones); higher = more relevant, comparable only within one response."
    )
    rank: int = Field(description="1-based position.")
    title: str
    text: str


class Timings(BaseModel):
    """Seconds spent per pipeline stage."""

    retrieve: float
    hydrate: float
    rerank: float
    total: float


class RerankInfo(BaseModel):
    """What the reranker did."""

    method: str
    candidates: int = Field(description="First-stage hits reranked (fewer than requested when the first stage found fewer).")
    truncated: list[str] = Field(description="Doc ids whose content was cut to the per-document token budget.")
    prompt_tokens: int = Field(description="LM tokens processed for this query.")


class SearchResponse(BaseModel):
    """Body of a successful ``POST /search``; ``results`` are sorted by descending score."""

    results: list[Hit]
    timings: Timings
    rerank: RerankInfo | None = None


class HealthResponse(BaseModel):
    """Body of ``GET /health``."""

    status: Literal["ok"] = "ok"


class ErrorBody(BaseModel):
    """The body of every error response."""

    error: str = Field(description="What went wrong and what to do.")
    error_type: str = Field(description="validation, not_found, model_unavailable, internal, ...")

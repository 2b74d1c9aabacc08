"""One interface per stage. Implementations live in ``retriever/``, ``reranker/`` and
``index/``; the pipeline and the API are written against these protocols only."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from attnrank.types import Document, Query, Ranking

Filter = Mapping[str, Any]
"""A metadata filter (Qdrant-style JSON: ``must`` / ``should`` / ``must_not``); ``None`` = no filter."""


@runtime_checkable
class Retriever(Protocol):
    """First stage: finds the top-``k`` documents of each query.

    ``retrieve`` is batch-first: one :class:`Ranking` per query, in query order, each
    sorted by ``(-score, doc_id)`` with at most ``k`` hits (fewer when the corpus, or the
    set of documents matching ``filter``, is smaller). Scores are the retriever's own
    (BM25 score, cosine similarity, fused RRF score) and comparable only within a query.
    """

    name: str

    def retrieve(self, queries: Sequence[Query], k: int, *, filter: Filter | None = None) -> list[Ranking]: ...


@runtime_checkable
class DocStore(Protocol):
    """Documents by id."""

    def get_many(self, doc_ids: Sequence[str]) -> dict[str, Document]:
        """The documents that exist among ``doc_ids`` (missing ids are absent from the result)."""
        ...

    def __len__(self) -> int: ...


@dataclass(frozen=True)
class RerankResult:
    """What a reranker returns for one query.

    Attributes:
        ranking: The candidates re-sorted by the reranker's score (higher = more relevant;
            unitless; see each reranker's docstring for its meaning).
        truncated: Doc ids whose content was cut to ``max_doc_tokens`` LM tokens.
        prompt_tokens: LM tokens processed for this query (all passes).
        seconds: Wall-clock time of the reranking, in seconds.
        details: Method-specific diagnostics (e.g. per-document token spans).
    """

    ranking: Ranking
    truncated: tuple[str, ...] = ()
    prompt_tokens: int = 0
    seconds: float = 0.0
    details: Mapping[str, Any] = field(default_factory=dict)


@runtime_checkable
class Reranker(Protocol):
    """Second stage: reorders a query's candidates.

    ``candidates`` come in first-stage order (best first). ``rerank_batch`` is the
    batch-first call; ``rerank`` is one query.
    """

    name: str

    def rerank(self, query: Query, candidates: Sequence[Document]) -> RerankResult: ...

    def rerank_batch(
        self, queries: Sequence[Query], candidates: Sequence[Sequence[Document]]
    ) -> list[RerankResult]: ...

    def describe(self) -> Mapping[str, Any]:
        """Identity for reports: model name and file hash, prompt template version, options."""
        ...


@runtime_checkable
class Encoder(Protocol):
    """Dense text encoder: ``encode`` returns float32 ``(n, dim)`` L2-normalised rows."""

    dim: int

    def encode_queries(self, texts: Sequence[str], *, show_progress: bool = False): ...

    def encode_documents(self, texts: Iterable[str], *, show_progress: bool = False): ...

    def describe(self) -> Mapping[str, Any]: ...

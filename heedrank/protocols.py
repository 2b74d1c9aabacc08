"""One interface per stage. Implementations live in ``retriever/``, ``reranker/`` and
``index/``; the pipeline and the API are written against these protocols only.

The block protocols of cached BlockRank (:class:`BlockStore`, :class:`BlockCachingReranker`,
:class:`BlockStoreOwner`) live with the header and the block key in :mod:`heedrank.blocks`;
they are re-exported here."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, Union, runtime_checkable

from heedrank.blocks import BlockCachingReranker, BlockStore, BlockStoreOwner
from heedrank.seam import RerankerServing
from heedrank.types import Document, EvidenceSpan, Query, Ranking

if TYPE_CHECKING:  # type-only: the core never imports the index layer
    import numpy as np

    from heedrank.index.filters import BoolFilter

__all__ = [
    "BlockCachingReranker",
    "BlockStore",
    "BlockStoreOwner",
    "DocStore",
    "Encoder",
    "ExplainingReranker",
    "Filter",
    "FilterArg",
    "Preloadable",
    "Reranked",
    "Reranker",
    "RerankResult",
    "Retriever",
    "SupportsClose",
    "WritableDocStore",
]

Filter = Mapping[str, Any]
"""A metadata filter (Qdrant-style JSON: ``must`` / ``should`` / ``must_not``); ``None`` = no filter."""

FilterArg = Union[Filter, "BoolFilter"]
"""What ``filter=`` accepts along a search: the JSON form, or the filter already parsed
(:class:`heedrank.index.filters.BoolFilter`). :meth:`heedrank.pipeline.Pipeline.validate`
parses the JSON once; retrievers, the index and the document store pass the parsed object
on and never parse it again (:func:`heedrank.index.filters.as_filter`)."""


@runtime_checkable
class Retriever(Protocol):
    """First stage: finds the top-``k`` documents of each query.

    ``retrieve`` is batch-first: one :class:`Ranking` per query, in query order, each
    sorted by ``(-score, doc_id)`` with at most ``k`` hits (fewer when the corpus, or the
    set of documents matching ``filter``, is smaller). Scores are the retriever's own
    (BM25 score, cosine similarity, fused RRF score) and comparable only within a query.
    """

    name: str

    def retrieve(self, queries: Sequence[Query], k: int, *, filter: FilterArg | None = None) -> list[Ranking]: ...


@runtime_checkable
class SupportsClose(Protocol):
    """Something holding resources (files, connections) released by ``close()``."""

    def close(self) -> None: ...


@runtime_checkable
class DocStore(Protocol):
    """Documents by id (what the pipeline hydrates hits from)."""

    def get_many(self, doc_ids: Sequence[str]) -> dict[str, Document]:
        """The documents that exist among ``doc_ids`` (missing ids are absent from the result)."""
        ...

    def __len__(self) -> int: ...


@runtime_checkable
class WritableDocStore(DocStore, Protocol):
    """The document store an :class:`heedrank.index.store.Index` is built over: the source of
    truth of the index, every method the index and its maintenance
    (:mod:`heedrank.index.maintenance`) call.

    Every stored document *version* has a ``vid``: an int64 that only grows (:attr:`next_vid`)
    and is never reused, also after deletes; replacing a document gives it a new vid. The
    BM25 rows and the vector labels of the index map to vids. Implementations:
    :class:`heedrank.index.docstore.SQLiteDocStore` (durable) and
    :class:`heedrank.index.memory.InMemoryDocStore`.

    Writes (:meth:`upsert`, :meth:`delete`) are atomic: when they return, the change is
    durable (for a durable store) and every later read sees it; when they raise, nothing
    was written. Reads may run from several threads at once.
    """

    @property
    def next_vid(self) -> int:
        """The vid the next added document version gets (above every vid ever given)."""
        ...

    def upsert(
        self, docs: Sequence[Document], vectors: Sequence[np.ndarray | None] | None = None
    ) -> list[tuple[str, int, int | None]]:
        """Add or replace documents in one atomic write; each gets a new vid, in order.

        ``vectors[i]`` (float32 ``(p, d)`` or ``None``), when given, is kept with document
        ``i`` until :meth:`discard_vectors`, so that a vector file written earlier can be
        caught up after a crash without re-encoding.

        Returns:
            ``(doc_id, new_vid, old_vid or None)`` per document, in order.

        Raises:
            ValidationError: a repeated or empty doc id, invalid metadata; nothing is written.
        """
        ...

    def delete(self, doc_ids: Sequence[str]) -> list[tuple[str, int]]:
        """Delete documents in one atomic write; unknown ids are ignored.

        Returns:
            ``(doc_id, vid)`` of each deleted document.
        """
        ...

    def vids_of(self, doc_ids: Sequence[str]) -> dict[str, int]:
        """``{doc_id: vid}`` of the live documents among ``doc_ids`` (the others left out)."""
        ...

    def vid_doc_pairs(self) -> tuple[np.ndarray, list[str]]:
        """``(vids int64 (n,), doc_ids)`` of every live document, ordered by vid."""
        ...

    def get_by_vids(self, vids: Sequence[int] | np.ndarray) -> list[tuple[int, Document]]:
        """``(vid, Document)`` of the given vids that are live, in vid order."""
        ...

    def iter_documents(self, batch_size: int = 1000) -> Iterator[Document]:
        """Every live document, in vid order, read ``batch_size`` at a time (the KV store
        build and the block filler walk the corpus with it)."""
        ...

    def filter_vids(self, flt: BoolFilter | None = None) -> np.ndarray:
        """Sorted int64 vids of the live documents matching a parsed metadata filter
        (``None``: every document). The filter is not parsed again."""
        ...

    def pending_vectors(self, vids: Sequence[int] | np.ndarray) -> dict[int, np.ndarray]:
        """The float32 ``(p, d)`` vectors stored by :meth:`upsert` for those of ``vids`` that
        still have them (a store that keeps none returns ``{}``)."""
        ...

    def discard_vectors(self, max_vid: int) -> int:
        """Forget the vectors kept for vids ``<= max_vid`` (the vector file now holds them).
        Returns how many were dropped."""
        ...

    def close(self) -> None:
        """Release files and connections (a no-op for an in-memory store)."""
        ...


@dataclass(frozen=True)
class RerankResult:
    """What a reranker returns for one query.

    Attributes:
        ranking: The candidates re-sorted by the reranker's score (higher = more relevant;
            unitless; see each reranker's docstring for its meaning).
        truncated: Doc ids whose content was cut to ``max_doc_tokens`` LM tokens.
        prompt_tokens: LM tokens processed for this query (all passes).
        seconds: Wall-clock time of the reranking, in seconds.
        details: Method-specific diagnostics nobody downstream depends on (``timings`` in
            seconds, per-document token spans, ICR's ``attention`` dumps).
        warnings: What a caller should know about how the ranking was made (a query cut
            to its token budget, candidates scored in several windows, duplicate texts
            sharing one score); the API adds them to its response's warnings.
        evidence: With ``explain`` (:class:`ExplainingReranker`): ``{doc_id: [EvidenceSpan,
            ...]}`` (:class:`heedrank.types.EvidenceSpan`, best first) of every candidate;
            ``None`` otherwise.
        cache: For a reranker reading stored blocks (cached BlockRank): ``{"hits": n,
            "misses": m}``, candidate blocks read from the document KV store or the RAM
            tier and blocks computed now; ``None`` for other rerankers.
    """

    ranking: Ranking
    truncated: tuple[str, ...] = ()
    prompt_tokens: int = 0
    seconds: float = 0.0
    details: Mapping[str, Any] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    evidence: Mapping[str, Sequence[EvidenceSpan]] | None = None
    cache: Mapping[str, int] | None = None


@runtime_checkable
class Reranker(Protocol):
    """Second stage: reorders a query's candidates.

    ``candidates`` come in first-stage order (best first). ``rerank_batch`` is the
    batch-first call; ``rerank`` is one query. ``block_store``: a collection's document KV
    store (:class:`BlockStore`) for a reranker that reads stored candidate blocks (cached
    BlockRank); the pipeline passes it only to such a reranker (:func:`heedrank.blocks.block_store_for`),
    so others may leave the keyword out.
    """

    name: str

    def rerank(self, query: Query, candidates: Sequence[Document], *, block_store: Any = None) -> RerankResult: ...

    def rerank_batch(
        self, queries: Sequence[Query], candidates: Sequence[Sequence[Document]]
    ) -> list[RerankResult]: ...

    def describe(self) -> Mapping[str, Any]:
        """Identity for reports: model name and file hash, prompt template version, options."""
        ...

    def serving(self) -> RerankerServing:
        """What the server reads of this reranker (:class:`heedrank.seam.RerankerServing`: its
        scorer, calibration, fusion weight, admission). This default, inherited by a class that
        subclasses the protocol, declares none of them: its own scores, served as they are, one
        call at a time. The server reads it through :func:`heedrank.seam.serving_of`, which gives
        the same defaults to a plug-in that implements the protocol without subclassing it."""
        return RerankerServing()


@dataclass(frozen=True)
class Reranked:
    """One query's reranking as :meth:`heedrank.pipeline.RerankerCache.rerank` ran it.

    Attributes:
        reranker: The reranker that ran (looked up once for the request).
        result: Its result over the candidates it reranked.
        skipped: Doc ids of the candidates left out by the recompute budget (cold blocks,
            :attr:`heedrank.pipeline.SearchOptions.cold_budget`), in the given order; they
            keep their given positions (:func:`heedrank.serving.place_skipped`).
    """

    reranker: Reranker
    result: RerankResult
    skipped: tuple[str, ...] = ()

    @property
    def cache(self) -> Mapping[str, int] | None:
        """:attr:`RerankResult.cache`: block hits and misses, or ``None``."""
        return self.result.cache


@runtime_checkable
class ExplainingReranker(Protocol):
    """A reranker that can also say why: ``rerank_with_evidence`` returns the same ranking
    with :attr:`RerankResult.evidence` ``= {doc_id: [span, ...]}`` (ICR and cached BlockRank do).
    ``block_store``: as :meth:`Reranker.rerank`'s, for a reranker that reads stored blocks."""

    def rerank_with_evidence(
        self, query: Query, candidates: Sequence[Document], *, max_spans: int = 3, block_store: Any = None
    ) -> RerankResult: ...


@runtime_checkable
class Preloadable(Protocol):
    """A stage whose model loads lazily and can be loaded ahead with ``load()``."""

    def load(self) -> Any: ...


@runtime_checkable
class Encoder(Protocol):
    """Dense text encoder: ``encode`` returns float32 ``(n, dim)`` L2-normalised rows."""

    dim: int

    def encode_queries(self, texts: Sequence[str], *, show_progress: bool = False): ...

    def encode_documents(self, texts: Iterable[str], *, show_progress: bool = False): ...

    def describe(self) -> Mapping[str, Any]: ...

"""The one search pipeline used by the API, the batch command and the evaluator:

    retrieve top-k1 -> hydrate from the document store -> rerank the top N -> cut to k

with per-stage timings in seconds.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from attnrank.config import PipelineConfig
from attnrank.errors import UnknownNameError, ValidationError
from attnrank.protocols import DocStore, Filter, RerankResult, Reranker, Retriever
from attnrank.types import Query, Ranking, ScoredDoc

logger = logging.getLogger(__name__)

NO_RERANK = "none"


@dataclass(frozen=True)
class SearchOptions:
    """Options of one search.

    Attributes:
        top_k: Number of results returned (1..``max_top_k``).
        retriever: First-stage retriever name.
        rerank: Reranker name, or ``"none"`` for first-stage order.
        candidates: How many first-stage hits the reranker reorders (1..``max_candidates``).
            Results beyond the reranked candidates keep first-stage order below them.
        filter: Metadata filter applied by the first stage.
    """

    top_k: int = 10
    retriever: str = "bm25"
    rerank: str = NO_RERANK
    candidates: int = 20
    filter: Filter | None = None


@dataclass(frozen=True)
class SearchResult:
    """Result of one search.

    Attributes:
        query: The query.
        ranking: Final top-``k`` hits, hydrated (each ``ScoredDoc.document`` set). Scores
            are the reranker's for reranked hits; hits below the candidates keep first-stage
            scores shifted below the lowest reranked score so the order stays consistent.
        first_stage: The first-stage ranking (top ``max(k, candidates)``), not hydrated.
        timings: Seconds per stage: ``retrieve``, ``hydrate``, ``rerank``, ``total``.
        rerank: The reranker's result, or ``None`` without reranking.
    """

    query: Query
    ranking: Ranking
    first_stage: Ranking
    timings: Mapping[str, float]
    rerank: RerankResult | None = None


@dataclass
class Pipeline:
    """Retrieve -> hydrate -> rerank -> cut.

    Args:
        retrievers: Retrievers by name.
        docstore: Document store used to hydrate hits.
        reranker_factory: Builds a reranker by name on first use (models load once and are
            cached in this object); ``None`` disables reranking.
        max_top_k: Largest accepted ``top_k``.
        max_candidates: Largest accepted candidate count.
    """

    retrievers: Mapping[str, Retriever]
    docstore: DocStore
    reranker_factory: Callable[[str], Reranker] | None = None
    max_top_k: int = 100
    max_candidates: int = 100
    describe_index: Mapping[str, Any] = field(default_factory=dict)
    _rerankers: dict[str, Reranker] = field(default_factory=dict, init=False, repr=False)
    _locks: dict[str, threading.Lock] = field(default_factory=dict, init=False, repr=False)
    _guard: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    @classmethod
    def from_config(cls, config: PipelineConfig) -> Pipeline:
        """Open the index and build every retriever; rerankers load lazily by name."""
        from attnrank import registry

        index = registry.open_index(config.index_dir, show_progress=config.show_progress)
        retrievers = {}
        for name in index.available_retrievers():
            retrievers[name] = registry.build_retriever(name, index)

        def factory(method: str) -> Reranker:
            return registry.build_reranker(replace(config.reranker, method=method))

        return cls(
            retrievers=retrievers,
            docstore=index.docstore,
            reranker_factory=factory,
            max_top_k=config.max_top_k,
            max_candidates=config.max_candidates,
            describe_index=index.describe(),
        )

    # -- rerankers -------------------------------------------------------------------
    def reranker(self, method: str) -> Reranker:
        """The reranker ``method``, built on first use. Raises UnknownNameError, ValidationError."""
        if self.reranker_factory is None:
            raise ValidationError("reranking is disabled in this pipeline; use rerank='none'")
        with self._guard:
            if method not in self._rerankers:
                self._rerankers[method] = self.reranker_factory(method)
                self._locks[method] = threading.Lock()
            return self._rerankers[method]

    def loaded_rerankers(self) -> dict[str, Reranker]:
        with self._guard:
            return dict(self._rerankers)

    # -- validation ------------------------------------------------------------------
    def validate(self, options: SearchOptions) -> None:
        """Check options against this pipeline's limits. Raises ValidationError/UnknownNameError."""
        if not 1 <= options.top_k <= self.max_top_k:
            raise ValidationError(f"top_k must be between 1 and {self.max_top_k}, got {options.top_k}")
        if options.retriever not in self.retrievers:
            raise UnknownNameError(
                f"unknown retriever {options.retriever!r}; choose one of {sorted(self.retrievers)}"
            )
        if options.rerank != NO_RERANK and not 1 <= options.candidates <= self.max_candidates:
            raise ValidationError(
                f"candidates must be between 1 and {self.max_candidates}, got {options.candidates}"
            )

    # -- search ----------------------------------------------------------------------
    def search(self, query: Query | str, options: SearchOptions = SearchOptions()) -> SearchResult:
        """Search one query. See :meth:`search_batch`."""
        q = query if isinstance(query, Query) else Query("q", query)
        return self.search_batch([q], options)[0]

    def search_batch(
        self, queries: Sequence[Query], options: SearchOptions = SearchOptions(), *, show_progress: bool = False
    ) -> list[SearchResult]:
        """Search a batch of queries with the same options.

        Raises:
            ValidationError: empty query text, ``top_k``/``candidates`` out of range.
            UnknownNameError: unknown retriever or reranker.
            ContextOverflowError: the reranking prompt does not fit the model's context.
        """
        self.validate(options)
        for q in queries:
            if not q.text or not q.text.strip():
                raise ValidationError(f"query {q.query_id!r} is empty; send a non-empty query text")
        rerank = options.rerank != NO_RERANK
        reranker = self.reranker(options.rerank) if rerank else None
        k1 = max(options.top_k, options.candidates) if rerank else options.top_k

        t0 = time.perf_counter()
        first = self.retrievers[options.retriever].retrieve(queries, k1, filter=options.filter)
        t_retrieve = (time.perf_counter() - t0) / max(1, len(queries))

        results = []
        iterator: Any = zip(queries, first)
        if show_progress:
            from tqdm.auto import tqdm

            iterator = tqdm(iterator, total=len(queries), desc=f"search ({options.rerank})", unit="query")
        for q, ranking in iterator:
            t1 = time.perf_counter()
            keep = ranking.top(k1)
            docs = self.docstore.get_many(keep.doc_ids)
            hydrated = keep.with_documents(docs)
            if len(hydrated) < len(keep):
                logger.warning("query %s: %d hits missing from the document store", q.query_id,
                               len(keep) - len(hydrated))
            t_hydrate = time.perf_counter() - t1
            rr: RerankResult | None = None
            t_rerank = 0.0
            final = hydrated.top(options.top_k)
            if reranker is not None and len(hydrated):
                cands = hydrated.top(options.candidates)
                t2 = time.perf_counter()
                with self._locks[options.rerank]:
                    rr = reranker.rerank(q, [h.document for h in cands.hits])
                t_rerank = time.perf_counter() - t2
                final = merge_reranked(hydrated, rr.ranking, options.top_k)
            timings = {
                "retrieve": t_retrieve,
                "hydrate": t_hydrate,
                "rerank": t_rerank,
                "total": t_retrieve + t_hydrate + t_rerank,
            }
            results.append(SearchResult(q, final, ranking, timings, rr))
        return results


def merge_reranked(first_stage: Ranking, reranked: Ranking, k: int) -> Ranking:
    """Reranked candidates first, then the rest of the first stage in its order, cut to ``k``.

    Hits below the candidates get scores strictly below the lowest reranked score
    (``min_reranked - 1 - position``) so that the ``(-score, doc_id)`` order holds.
    Documents are taken from ``first_stage`` hits.
    """
    docs = {h.doc_id: h.document for h in first_stage.hits}
    hits = [replace(h, document=h.document or docs.get(h.doc_id)) for h in reranked.hits]
    if len(hits) < k:
        seen = {h.doc_id for h in hits}
        floor = min((h.score for h in hits), default=0.0)
        rest = [h for h in first_stage.hits if h.doc_id not in seen][: k - len(hits)]
        hits += [ScoredDoc(h.doc_id, floor - 1.0 - i, h.document) for i, h in enumerate(rest)]
    return Ranking(first_stage.query_id, tuple(hits[:k]))

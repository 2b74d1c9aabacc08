"""The records of a search: its options (:class:`SearchOptions`), what it returns
(:class:`SearchResult`, one query; :class:`RerankedQuery`, one query's reranking), the first stage it starts from
(:class:`FirstStageRow`), and their JSON codec (:meth:`SearchResult.to_json` /
:meth:`SearchResult.from_json`, :func:`rerank_result_to_json` / :func:`rerank_result_from_json`),
with which the Ray engine ships results from its actors (:mod:`heedrank.engine.ray`) so that
nothing is dropped on the way.

The JSON form is plain: rankings as ``[[doc_id, score], ...]`` in order (documents are not
shipped: :meth:`SearchResult.from_json` takes them from the caller's document map), evidence
spans as ``[field, start, end, text, score]``, ``details`` through :func:`heedrank.jsonable.jsonable`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from heedrank.jsonable import jsonable
from heedrank.protocols import FilterArg, Reranked, RerankResult
from heedrank.serving import Served, ServePolicy
from heedrank.types import Document, EvidenceSpan, Query, Ranking, ScoredDoc

NO_RERANK = "none"
"""``SearchOptions.rerank`` value: no reranking (first-stage order)."""


def _ranking_json(ranking: Ranking) -> list[list[Any]]:
    return [[h.doc_id, float(h.score)] for h in ranking.hits]


def _ranking(query_id: str, rows: Sequence[Sequence[Any]], documents: Mapping[str, Document] | None = None) -> Ranking:
    docs = documents or {}
    return Ranking(query_id, tuple(ScoredDoc(str(d), float(s), docs.get(str(d))) for d, s in rows))


def _floats(values: Mapping[str, float] | None) -> dict[str, float] | None:
    return None if values is None else {str(k): float(v) for k, v in values.items()}


def rerank_result_to_json(rr: RerankResult) -> dict[str, Any]:
    """A :class:`~heedrank.protocols.RerankResult` as JSON values (``details`` made JSON-safe)."""
    return {
        "ranking": _ranking_json(rr.ranking), "truncated": list(rr.truncated), "prompt_tokens": int(rr.prompt_tokens),
        "seconds": float(rr.seconds), "details": jsonable(rr.details), "warnings": list(rr.warnings),
        "evidence": None if rr.evidence is None else {
            d: [[s.field, int(s.start), int(s.end), s.text, float(s.score)] for s in spans]
            for d, spans in rr.evidence.items()},
        "cache": None if rr.cache is None else {k: int(v) for k, v in rr.cache.items()},
    }


def rerank_result_from_json(data: Mapping[str, Any], query_id: str,
                            documents: Mapping[str, Document] | None = None) -> RerankResult:
    """The inverse of :func:`rerank_result_to_json`; ``documents`` (by id) hydrate the hits."""
    evidence = data.get("evidence")
    return RerankResult(
        ranking=_ranking(query_id, data["ranking"], documents), truncated=tuple(data.get("truncated", ())),
        prompt_tokens=int(data.get("prompt_tokens", 0)), seconds=float(data.get("seconds", 0.0)),
        details=dict(data.get("details") or {}), warnings=tuple(data.get("warnings", ())),
        evidence=None if evidence is None else {
            d: [EvidenceSpan(field=f, start=a, end=b, text=t, score=sc) for f, a, b, t, sc in spans]
            for d, spans in evidence.items()},
        cache=data.get("cache"),
    )


@dataclass(frozen=True)
class SearchOptions:
    """Options of one search.

    Attributes:
        top_k: Number of results returned (1..``max_top_k``).
        retriever: First-stage retriever name.
        rerank: Reranker name, or ``"none"`` for first-stage order.
        candidates: How many first-stage hits the reranker reorders (1..``max_candidates``).
            Results beyond the reranked candidates keep first-stage order below them.
        filter: Metadata filter applied by the first stage: the JSON form, or the parsed
            :class:`heedrank.index.filters.BoolFilter` that :meth:`Pipeline.validate` puts in
            the options it returns (parsed once; never parsed again below).
        rerank_options: Reranker options (``RerankerConfig.options`` keys, e.g. ICR's
            ``heads`` and ``reattn``) merged over the configured ones; each distinct set
            builds its own reranker (cached, the model shared).
        explain: Ask the reranker for evidence spans (:attr:`RerankResult.evidence`);
            only rerankers with ``rerank_with_evidence`` (ICR) can.
        evidence_spans: Most evidence spans per document with ``explain``.
        fusion: ``None`` (the reranker's order), ``alpha`` in [0, 1]: the candidates are
            ordered by ``alpha * z(first-stage score) + (1 - alpha) * z(reranker score)``,
            each z-scored over the query's candidates (:func:`heedrank.fusion.fuse`; the study's
            fused variant, docs/results/training.md, "The training and fusion study on cached BlockRank"), or ``"default"``: the reranker's
            recorded weight (cached BlockRank: its weights card's ``fusion.alpha``, chosen on
            NFCorpus dev; none for ICR and uncached BlockRank).
        cutoff: ``None`` (return ``top_k`` hits), a probability in [0, 1], or ``"auto"``:
            return only the reranked hits whose calibrated probability of relevance is at
            least that (``"auto"``: the threshold chosen on dev), at most ``top_k``, possibly
            none (:mod:`heedrank.calibration`). Needs a reranker with a calibration for the
            fusion weight used (the default configuration: fusion ``"default"`` or none).
        cold_budget: The recompute budget: at most this many candidates whose blocks are in
            neither the document KV store nor the RAM tier are encoded inline (cached
            BlockRank); the other cold ones are not reranked and keep their first-stage
            positions (:func:`heedrank.serving.place_skipped`), and are handed to the
            pipeline's :attr:`RerankerCache.cold_listener` (the service's background fill).
            ``None``: no budget (every candidate is reranked). Ignored with a cut-off (a
            cut-off needs every candidate judged) and by rerankers without stored blocks.
    """

    top_k: int = 10
    retriever: str = "bm25"
    rerank: str = NO_RERANK
    candidates: int = 20
    filter: FilterArg | None = None
    rerank_options: Mapping[str, Any] | None = None
    explain: bool = False
    evidence_spans: int = 3
    fusion: float | str | None = None
    cutoff: float | str | None = None
    cold_budget: int | None = None
    checked: str = field(default="", compare=False, repr=False)
    """What has checked these options: ``"search"`` (:meth:`heedrank.pipeline.Pipeline.validate`),
    ``"rerank"`` (:meth:`~heedrank.pipeline.Pipeline.check_rerank`, the reranking part) or
    ``""``; checking them again to that extent is a no-op."""


@dataclass(frozen=True)
class RerankedQuery:
    """One query's candidates reranked and served (:meth:`heedrank.pipeline.Pipeline.rerank_documents`).

    Attributes:
        reranked: What the reranker did (:class:`~heedrank.protocols.Reranked`).
        served: The candidates as served (:class:`heedrank.serving.Served`): skipped cold
            ones placed, identical texts sharing a score where asked.
        policy: The :class:`~heedrank.serving.ServePolicy` that served them.
        seconds: Wall-clock seconds of the reranking (queue for the reranker's lock included).
    """

    reranked: Reranked
    served: Served
    policy: ServePolicy
    seconds: float = 0.0


@dataclass(frozen=True)
class SearchResult:
    """Result of one search.

    Attributes:
        query: The query.
        ranking: Final top-``k`` hits, hydrated (each ``ScoredDoc.document`` set). Scores
            are the served scores for reranked hits (the reranker's, or fused); hits below
            the candidates keep first-stage scores shifted below the lowest reranked score so
            the order stays consistent.
        first_stage: The first-stage ranking (top ``max(k, candidates)``), not hydrated.
        timings: Seconds per stage: ``retrieve``, ``hydrate``, ``rerank``, ``total``.
        rerank: The reranker's result, or ``None`` without reranking.
        fusion: The fusion weight used (:class:`heedrank.serving.ServePolicy`), or ``None``.
        probabilities: Calibrated probability of relevance of each reranked candidate, by doc
            id, when the reranker has a calibration for the scores served (else ``None``).
        cutoff: The probability threshold applied (``SearchOptions.cutoff``), or ``None``.
        missing: First-stage hits (of the top ``max(k, candidates)``) missing from the document
            store, so neither reranked nor returned.
        relevance: The score a user reads, in [0, 1], of each reranked candidate, by doc id
            (:attr:`heedrank.serving.Served.relevance`: the calibrated probability where there
            is a calibration), non-increasing down :attr:`ranking`'s reranked hits; ``None``
            without reranking.
        skipped: Candidates not reranked because their blocks were cold and over the
            recompute budget (``SearchOptions.cold_budget``); they keep first-stage positions.
        doc_tokens: LM tokens of each document the reranker read (its ``max_doc_tokens``),
            or ``None`` without reranking or when the reranker does not say.
        warnings: How the candidates were served, beside the reranker's own warnings
            (:attr:`heedrank.serving.Served.warnings`: how many the scorer served without the
            reranker's attention).
    """

    query: Query
    ranking: Ranking
    first_stage: Ranking
    timings: Mapping[str, float]
    rerank: RerankResult | None = None
    fusion: float | None = None
    probabilities: Mapping[str, float] | None = None
    cutoff: float | None = None
    missing: tuple[str, ...] = ()
    relevance: Mapping[str, float] | None = None
    skipped: tuple[str, ...] = ()
    doc_tokens: int | None = None
    warnings: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """This result as JSON values (documents left out; see the module docstring)."""
        return {
            "query": [self.query.query_id, self.query.text], "ranking": _ranking_json(self.ranking),
            "first_stage": _ranking_json(self.first_stage), "timings": {k: float(v) for k, v in self.timings.items()},
            "rerank": None if self.rerank is None else rerank_result_to_json(self.rerank),
            "fusion": self.fusion, "probabilities": _floats(self.probabilities), "cutoff": self.cutoff,
            "missing": list(self.missing), "relevance": _floats(self.relevance), "skipped": list(self.skipped),
            "doc_tokens": self.doc_tokens, "warnings": list(self.warnings),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any], documents: Mapping[str, Document] | None = None) -> SearchResult:
        """The inverse of :meth:`to_json`; ``documents`` (by id) hydrate the hits of :attr:`ranking`
        and of the reranker's ranking (:attr:`first_stage` stays without documents).

        Raises:
            KeyError: a field :meth:`to_json` always writes is missing.
        """
        query = Query(str(data["query"][0]), str(data["query"][1]))
        rerank = data.get("rerank")
        return cls(
            query=query, ranking=_ranking(query.query_id, data["ranking"], documents),
            first_stage=_ranking(query.query_id, data["first_stage"]),
            timings={k: float(v) for k, v in data["timings"].items()},
            rerank=None if rerank is None else rerank_result_from_json(rerank, query.query_id, documents),
            fusion=data.get("fusion"), probabilities=_floats(data.get("probabilities")), cutoff=data.get("cutoff"),
            missing=tuple(data.get("missing", ())), relevance=_floats(data.get("relevance")),
            skipped=tuple(data.get("skipped", ())), doc_tokens=data.get("doc_tokens"),
            warnings=tuple(data.get("warnings", ())),
        )


@dataclass(frozen=True)
class FirstStageRow:
    """One query's first stage, hydrated: what reranking starts from
    (:meth:`heedrank.pipeline.Pipeline.first_stage_rows`, shared by
    :meth:`~heedrank.pipeline.Pipeline.search_batch` and the engines in :mod:`heedrank.engine`).

    Attributes:
        query: The query.
        ranking: The retriever's ranking (``SearchResult.first_stage``), not hydrated.
        top: Its top ``k1`` hits (``k1 = max(top_k, candidates)`` when reranking, else ``top_k``).
        docs: The documents of ``top`` found in the document store, by id.
        hydrated: ``top`` with documents; hits missing from the store are dropped (logged).
        retrieve_seconds: The batch's retrieval time divided by its number of queries.
        hydrate_seconds: Seconds spent hydrating this query.
    """

    query: Query
    ranking: Ranking
    top: Ranking
    docs: Mapping[str, Document]
    hydrated: Ranking
    retrieve_seconds: float
    hydrate_seconds: float

    @property
    def missing(self) -> tuple[str, ...]:
        """Ids of ``top``'s hits missing from the document store, in first-stage order."""
        return tuple(d for d in self.top.doc_ids if d not in self.docs)


def merge_served(first_stage: Ranking, served: Served, top_k: int) -> Ranking:
    """:func:`merge_reranked` of a served query: with a cut-off (``served.threshold``), only the
    reranked hits that passed it (at most ``top_k``), else the reranked hits then the rest of
    the first stage, cut to ``top_k``."""
    k = top_k if served.threshold is None else min(top_k, len(served.ranking))
    return merge_reranked(first_stage, served.ranking, k)


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

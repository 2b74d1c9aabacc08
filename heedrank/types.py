"""Core records shared by every stage: documents, queries, scored documents and rankings.

The exchange format with evaluators is the *run* mapping ``{query_id: {doc_id: score}}``
(as in TREC run files, ``pytrec_eval`` and ``ir_measures``); every :class:`Ranking`
converts to it with :meth:`Ranking.to_dict` / :func:`rankings_to_run`.

Order is deterministic everywhere: hits are sorted by ``(-score, doc_id)``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any, Literal

Run = dict[str, dict[str, float]]
"""A run: ``{query_id: {doc_id: score}}``; higher score = more relevant."""

Qrels = dict[str, dict[str, int]]
"""Relevance judgements: ``{query_id: {doc_id: grade}}``; grade 0 = judged non-relevant."""


def _freeze(mapping: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True, slots=True)
class Document:
    """A document (or passage) of a corpus.

    Attributes:
        doc_id: Corpus-unique identifier.
        text: Body text.
        title: Title; empty when the corpus has none.
        metadata: Read-only metadata fields (used by filters).
    """

    doc_id: str
    text: str
    title: str = ""
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.metadata, MappingProxyType):
            object.__setattr__(self, "metadata", _freeze(self.metadata))

    @property
    def content(self) -> str:
        """``title + " " + text`` (just ``text`` when there is no title): what models read."""
        return f"{self.title} {self.text}" if self.title else self.text


@dataclass(frozen=True, slots=True)
class Query:
    """A query: identifier and text."""

    query_id: str
    text: str


@dataclass(frozen=True, slots=True)
class ScoredDoc:
    """One hit of a ranking.

    Attributes:
        doc_id: Document identifier.
        score: Relevance score of the stage that produced it (higher = more relevant;
            unitless, comparable only within one query and one stage).
        document: The hydrated document, or ``None`` before hydration.
    """

    doc_id: str
    score: float
    document: Document | None = None


@dataclass(frozen=True, slots=True)
class EvidenceSpan:
    """A span of a document that drew query attention (``explain``;
    :attr:`heedrank.protocols.RerankResult.evidence`).

    Attributes:
        field: ``"text"`` or ``"title"``: the document field the offsets index.
        start: First character, 0-based, into that field.
        end: One past the last character (``field_value[start:end] == text``).
        text: The span's characters.
        score: Sum of its tokens' scores (the method's token attention: unitless, higher =
            more attended, comparable within one response).
    """

    field: Literal["text", "title"]
    start: int
    end: int
    text: str
    score: float


def sort_key(hit: ScoredDoc) -> tuple[float, str]:
    """Deterministic order: descending score, then ascending ``doc_id``; NaN sorts last."""
    score = hit.score
    return (math.inf if math.isnan(score) else -score, hit.doc_id)


@dataclass(frozen=True, slots=True)
class Ranking:
    """The ranked hits of one query, sorted by ``(-score, doc_id)``, doc ids unique.

    Build with :meth:`from_scores` or :meth:`from_hits`, which sort and deduplicate;
    the plain constructor trusts its input and only checks it.

    Raises:
        ValueError: (plain constructor) if hits are unsorted or a doc id repeats.
    """

    query_id: str
    hits: tuple[ScoredDoc, ...] = ()

    def __post_init__(self) -> None:
        seen: set[str] = set()
        prev: tuple[float, str] | None = None
        for hit in self.hits:
            if hit.doc_id in seen:
                raise ValueError(f"duplicate doc_id {hit.doc_id!r} in ranking of query {self.query_id!r}")
            seen.add(hit.doc_id)
            key = sort_key(hit)
            if prev is not None and key < prev:
                raise ValueError(
                    f"hits of query {self.query_id!r} are not sorted by (-score, doc_id); use Ranking.from_hits"
                )
            prev = key

    @classmethod
    def from_hits(cls, query_id: str, hits: Iterable[ScoredDoc], k: int | None = None) -> Ranking:
        """Sort hits by ``(-score, doc_id)``, keep the best-scored hit per doc id, cut to ``k``."""
        best: dict[str, ScoredDoc] = {}
        for hit in hits:
            cur = best.get(hit.doc_id)
            if cur is None or sort_key(hit) < sort_key(cur):
                best[hit.doc_id] = hit
        ordered = sorted(best.values(), key=sort_key)
        return cls(query_id, tuple(ordered if k is None else ordered[:k]))

    @classmethod
    def from_scores(cls, query_id: str, scores: Mapping[str, float], k: int | None = None) -> Ranking:
        """Ranking from a ``{doc_id: score}`` mapping, cut to the top ``k``."""
        return cls.from_hits(query_id, (ScoredDoc(d, float(s)) for d, s in scores.items()), k)

    def top(self, k: int) -> Ranking:
        """The first ``k`` hits (all of them when fewer)."""
        return Ranking(self.query_id, self.hits[:k])

    @property
    def doc_ids(self) -> list[str]:
        return [h.doc_id for h in self.hits]

    def to_dict(self) -> dict[str, float]:
        """``{doc_id: score}`` of this query."""
        return {h.doc_id: h.score for h in self.hits}

    def with_documents(self, documents: Mapping[str, Document]) -> Ranking:
        """Copy whose hits carry their :class:`Document` (hits missing from ``documents`` are dropped)."""
        return Ranking(
            self.query_id,
            tuple(replace(h, document=documents[h.doc_id]) for h in self.hits if h.doc_id in documents),
        )

    def __len__(self) -> int:
        return len(self.hits)


def rankings_to_run(rankings: Iterable[Ranking]) -> Run:
    """``{query_id: {doc_id: score}}`` from rankings."""
    return {r.query_id: r.to_dict() for r in rankings}


def run_to_rankings(run: Mapping[str, Mapping[str, float]], k: int | None = None) -> list[Ranking]:
    """Rankings from a run mapping, in query-id order."""
    return [Ranking.from_scores(qid, run[qid], k) for qid in sorted(run)]


def ranks_from_scores(ids: Sequence[str], scores: Sequence[float]) -> dict[str, int]:
    """1-based rank of each id under the ``(-score, id)`` order."""
    order = sorted(range(len(ids)), key=lambda i: (-scores[i], ids[i]))
    return {ids[i]: r + 1 for r, i in enumerate(order)}

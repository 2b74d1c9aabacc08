"""Fusion of first-stage and reranker scores (``SearchOptions.fusion``)."""

from __future__ import annotations

import statistics

import pytest

from heedrank.errors import ValidationError
from heedrank.pipeline import Pipeline, SearchOptions
from heedrank.serving import ZFusion
from heedrank.types import Document, Query, Ranking, ScoredDoc


def _ranking(scores: dict[str, float]) -> Ranking:
    return Ranking.from_hits("q", (ScoredDoc(d, s) for d, s in scores.items()))


def test_the_policy_fuses_z_scores() -> None:
    first = _ranking({"a": 3.0, "b": 2.0, "c": 1.0})
    rer = _ranking({"a": 0.1, "b": 0.1, "c": 0.7})
    fused = ZFusion(alpha=0.5).apply(first, rer).ranking

    def z(xs):
        mu, sd = statistics.fmean(xs), statistics.pstdev(xs)
        return [(x - mu) / sd for x in xs]

    zf, zr = z([3.0, 2.0, 1.0]), z([0.1, 0.1, 0.7])
    want = {d: 0.5 * f + 0.5 * r for d, f, r in zip("abc", zf, zr)}
    assert {h.doc_id: h.score for h in fused.hits} == pytest.approx(want)
    assert [h.doc_id for h in fused.hits] == sorted(want, key=lambda d: (-want[d], d))
    assert [h.doc_id for h in ZFusion(alpha=1.0).apply(first, rer).ranking.hits] == ["a", "b", "c"]  # first stage only
    assert [h.doc_id for h in ZFusion(alpha=0.0).apply(first, rer).ranking.hits][0] == "c"  # reranker only


class _Reverse:
    """A reranker that puts the first stage's last candidate first."""

    name = "reverse"

    def rerank(self, query, candidates):
        from heedrank.protocols import RerankResult

        return RerankResult(Ranking.from_hits(query.query_id, (ScoredDoc(d.doc_id, float(i), d)
                                                                for i, d in enumerate(candidates))))

    def rerank_batch(self, queries, candidates):
        return [self.rerank(q, c) for q, c in zip(queries, candidates)]

    def describe(self):
        return {"method": self.name}


def test_the_pipeline_applies_fusion_and_validates_it() -> None:
    from heedrank.index.store import Index
    from heedrank.retriever.bm25 import BM25Retriever

    docs = [Document(f"d{i}", "apple " * (5 - i) + "pear") for i in range(5)]
    ix = Index.from_documents(docs)
    pipe = Pipeline({"bm25": BM25Retriever.from_index(ix)}, ix.docstore, reranker_factory=lambda method: _Reverse())
    plain = pipe.search(Query("q", "apple"), SearchOptions(rerank="reverse", candidates=5, top_k=5))
    fused = pipe.search(Query("q", "apple"), SearchOptions(rerank="reverse", candidates=5, top_k=5, fusion=1.0))
    assert [h.doc_id for h in fused.ranking.hits] == [h.doc_id for h in plain.first_stage.top(5).hits]
    assert [h.doc_id for h in plain.ranking.hits] != [h.doc_id for h in fused.ranking.hits]
    with pytest.raises(ValidationError, match="fusion needs reranking"):
        pipe.search(Query("q", "apple"), SearchOptions(fusion=0.5))

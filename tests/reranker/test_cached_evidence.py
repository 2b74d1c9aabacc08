"""Evidence from the method that ranks: the default configuration (cached
BlockRank read list-independently, the packaged query adapter) explains its ranking with spans
whose character offsets slice the text they claim, on real NFCorpus documents."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from heedrank.config import RerankerConfig  # noqa: E402
from heedrank.types import Document, Query  # noqa: E402


@pytest.fixture(scope="module")
def default_reranker(default_lm):
    from heedrank.reranker.cached import CachedBlockRankReranker

    r = CachedBlockRankReranker(RerankerConfig(method="default"), lm=default_lm)
    assert r.scoring == "independent" and r.layer == 15 and r.config.max_doc_tokens == 128  # the default
    return r


def test_default_evidence_spans_slice_their_text_and_keep_the_ranking(default_reranker, nfcorpus_head) -> None:
    docs = list(nfcorpus_head[:6]) + [Document("t1", "  Vitamin D3 and calcium lowered hip fractures.  ",
                                               title="Vitamin D  trial")]
    q = Query("q", "vitamin d and hip fractures")
    plain = default_reranker.rerank(q, docs)
    explained = default_reranker.rerank_with_evidence(q, docs, max_spans=3)
    assert explained.ranking.doc_ids == plain.ranking.doc_ids
    assert [h.score for h in explained.ranking.hits] == pytest.approx([h.score for h in plain.ranking.hits])
    evidence = explained.evidence
    assert set(evidence) == {d.doc_id for d in docs}
    by_id = {d.doc_id: d for d in docs}
    n_spans = 0
    for doc_id, spans in evidence.items():
        assert len(spans) <= 3
        assert [s.score for s in spans] == sorted((s.score for s in spans), reverse=True)
        for s in spans:
            value = by_id[doc_id].title if s.field == "title" else by_id[doc_id].text
            assert value[s.start:s.end] == s.text and s.text.strip() == s.text and s.score > 0
            n_spans += 1
    assert n_spans >= len(docs)  # every candidate draws some positive evidence
    assert any(s.field == "title" for s in evidence["t1"]) or any("Vitamin" in s.text or "fracture" in s.text
                                                                   for s in evidence["t1"])

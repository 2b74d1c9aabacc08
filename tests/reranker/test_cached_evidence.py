"""Evidence from the method that ranks: the default configuration (cached
BlockRank, learned head weights, the packaged query adapter) explains its ranking with spans
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
    assert r.scoring == "learned" and r.layer == 15 and r.config.max_doc_tokens == 128
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


def test_with_kept_positions_evidence_comes_from_the_kept_tokens(default_lm, nfcorpus_head) -> None:
    from heedrank.reranker.cached import CachedBlockRankReranker
    from heedrank.reranker.scoring import content_offsets

    R = 24
    r = CachedBlockRankReranker(RerankerConfig(method="default", options={"block_positions": R}), lm=default_lm)
    docs = list(nfcorpus_head[:4])
    explained = r.rerank_with_evidence(Query("q", "statins and breast cancer"), docs, max_spans=3)
    kept = R - len(r.layout.open_ids)
    for d in docs:
        _, offsets = content_offsets(default_lm.tokenizer, d, r.config.max_doc_tokens, strip=True)
        last = {f: max((e for g, _, e in offsets[:kept] if g == f), default=0) for f in ("title", "text")}
        spans = explained.evidence[d.doc_id]
        assert spans  # aligned with the cut block
        assert all(s.end <= last[s.field] for s in spans)  # nothing past the kept positions

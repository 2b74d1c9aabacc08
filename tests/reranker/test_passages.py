"""Passage blocks (``passages > 1``): a document's passages on real NFCorpus documents with the
default LM's tokenizer, and the reranker's scores as the best of its passages' (oracle: the
same passages reranked as documents of their own)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from heedrank.config import RerankerConfig  # noqa: E402
from heedrank.reranker.cached import CachedBlockRankReranker  # noqa: E402
from heedrank.reranker.cached.passages import SEP, expand, passage_texts, pool_max  # noqa: E402
from heedrank.reranker.doccache import build_layout, document_block  # noqa: E402
from heedrank.types import Document, Query  # noqa: E402

MAX = 48


def test_passages_cover_the_document_in_blocks_that_fit(default_lm, nfcorpus_head):
    tok = default_lm.tokenizer
    long_docs = [d for d in nfcorpus_head if len(tok(" " + d.content).input_ids) > 3 * MAX][:5]
    assert long_docs, "NFCorpus's head has long abstracts"
    layout = build_layout(tok, MAX)
    for doc in long_docs:
        texts = passage_texts(tok, doc, MAX, 4)
        assert len(texts) == 4 and texts[0] == doc.content  # passage 0 is the document's usual block
        assert all(t.startswith(doc.title + " ") for t in texts[1:])  # the title repeated
        # every passage fits its block, and the passages follow one another through the text
        for t in texts[1:]:
            assert len(tok(" " + t, add_special_tokens=False).input_ids) <= MAX
        ids0, cut0 = document_block(tok, layout, texts[0])
        assert cut0
        first_body = tok.decode(ids0[len(layout.open_ids):len(ids0) - len(layout.close_ids)]).strip()
        second = texts[1][len(doc.title) + 1:]
        assert doc.text.find(second[:30]) > doc.text.find(first_body[-20:]) >= 0
        assert passage_texts(tok, doc, MAX, 1) == [doc.content]
    short = Document("s", "Vitamin D and bone health.", "Short")
    assert passage_texts(tok, short, MAX, 4) == [short.content]


def test_expand_and_pool():
    class Tok:  # one token per character, offsets included
        def __call__(self, text, **kw):
            if isinstance(text, list):
                return type("Enc", (), {"input_ids": [list(range(len(t))) for t in text]})()
            out = {"input_ids": list(range(len(text))), "offset_mapping": [(i, i + 1) for i in range(len(text))]}
            return type("Enc", (), {**out, "__getitem__": lambda self, k: out[k]})()

    docs = [Document("a", " ".join(["xxxx"] * 6)), Document("b", "short")]  # 29 characters: 3 passages of 12
    passages, owner = expand(Tok(), docs, 12, 3)
    assert [p.doc_id for p in passages] == ["a", f"a{SEP}1", f"a{SEP}2", "b"] and owner == [0, 0, 0, 1]
    assert passages[0] is docs[0]
    assert pool_max([0.1, 0.7, -2.0, 0.3], owner, 2) == [0.7, 0.3]


def test_a_document_scores_its_best_passage(default_lm, nfcorpus_head):
    tok = default_lm.tokenizer
    docs = [d for d in nfcorpus_head if len(tok(" " + d.content).input_ids) > 2 * MAX][:4]
    opts = {"scoring": "calibrated", "query_adapter": None, "layer": 6}

    def reranker(**extra):
        return CachedBlockRankReranker(RerankerConfig(method="blockrank-cached", max_doc_tokens=MAX,
                                                      options={**opts, **extra}), lm=default_lm)

    query = Query("q", "vitamin D deficiency and cancer risk")
    pooled = reranker(passages=3).rerank(query, docs)
    passages, owner = expand(tok, docs, MAX, 3)
    assert len(passages) == 3 * len(docs)
    alone = reranker().rerank(query, passages)  # the same blocks, each a candidate of its own
    by_id = {h.doc_id: h.score for h in alone.ranking.hits}
    expect = pool_max([by_id[p.doc_id] for p in passages], owner, len(docs))
    got = {h.doc_id: h.score for h in pooled.ranking.hits}
    assert [got[d.doc_id] for d in docs] == pytest.approx(expect, abs=1e-5)
    one = reranker(passages=1).rerank(query, docs)
    assert {h.doc_id: h.score for h in one.ranking.hits} == {
        h.doc_id: h.score for h in reranker().rerank(query, docs).ranking.hits}

"""Regression: BM25 nDCG@10 on the full NFCorpus test split (BM25 only, no model; ~5 s)."""

from __future__ import annotations

from pathlib import Path

import pytest

from heedrank.data import iter_beir_documents, load_beir_qrels, load_beir_queries
from heedrank.types import rankings_to_run
from heedrank.index.store import Index
from heedrank.retriever.bm25 import BM25Retriever

NFCORPUS = Path("/work/shared/data/beir-nfcorpus")


@pytest.mark.skipif(not NFCORPUS.is_dir(), reason="NFCorpus not available")
def test_bm25_ndcg10_nfcorpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ir_measures = pytest.importorskip("ir_measures")
    monkeypatch.setenv("HEEDRANK_CACHE_DIR", str(tmp_path))
    index = Index.from_documents(iter_beir_documents(NFCORPUS))
    qrels = load_beir_qrels(NFCORPUS, "test")
    queries = load_beir_queries(NFCORPUS)
    rankings = BM25Retriever.from_index(index).retrieve([queries[q] for q in sorted(qrels)], 100)
    assert len(rankings) == 323 and all(len(r) <= 100 for r in rankings)
    ndcg = ir_measures.calc_aggregate([ir_measures.nDCG @ 10], qrels, rankings_to_run(rankings))[ir_measures.nDCG @ 10]
    # pyserini's BEIR flat BM25: 32.2; ours (bm25s Lucene k1=0.9 b=0.4, see index.bm25): 32.04
    assert 100 * ndcg == pytest.approx(32.04, abs=0.01)

"""BM25 parity with rank-bm25 on real NFCorpus documents and queries, same tokens.

rank-bm25 has no Lucene variant, so the comparison runs on the variants both implement
(the shipped default stays ``method="lucene"``, checked against the formula in
``test_index_bm25.py`` and against pyserini's figure in ``tests/retriever``):

* bm25s ``"robertson"`` vs ``BM25Okapi``: bm25s leaves out the constant ``(k1 + 1)``
  factor (a uniform rescaling) and floors negative IDFs (terms in more than half of the
  documents) at 0; rank-bm25 replaces them by ``epsilon * mean IDF``. With
  ``epsilon=0`` the scores agree to 1e-5 after the factor; with rank-bm25's default
  ``epsilon=0.25`` they differ exactly on documents holding such a term.
* bm25s ``"bm25+"`` vs ``BM25Plus`` with the same ``delta``: equal as they are.
"""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from heedrank.index.bm25 import Analyzer, BM25Builder, BM25Params

NFCORPUS = Path("/work/shared/data/beir-nfcorpus")
pytestmark = pytest.mark.skipif(not NFCORPUS.is_dir(), reason="NFCorpus not available")
N_DOCS, N_QUERIES, K1, B = 3633, 40, 0.9, 0.4  # the whole corpus


@pytest.fixture(scope="module")
def corpus() -> tuple[list[str], list[str]]:
    with gzip.open(NFCORPUS / "corpus.jsonl.gz", "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in itertools.islice(f, N_DOCS)]
    texts = [f"{r['title']} {r['text']}" if r.get("title") else r["text"] for r in rows]
    with gzip.open(NFCORPUS / "queries.jsonl.gz", "rt", encoding="utf-8") as f:
        queries = [json.loads(line)["text"] for line in itertools.islice(f, 0, 4000, 100)][:N_QUERIES]
    return texts, queries


def _bm25s(texts: list[str], params: BM25Params):
    b = BM25Builder(params)
    b.add(texts)
    return b.build()


def _top10(scores: np.ndarray) -> list[int]:
    # rank by score rounded to float32 precision, ties by position (both sides alike)
    return sorted(range(len(scores)), key=lambda i: (-round(float(scores[i]), 4), i))[:10]


def test_robertson_equals_bm25okapi(corpus) -> None:
    rank_bm25 = pytest.importorskip("rank_bm25")
    texts, queries = corpus
    analyzer = Analyzer(BM25Params())
    tokens = analyzer(texts)
    ours = _bm25s(texts, BM25Params(k1=K1, b=B, method="robertson"))
    okapi = rank_bm25.BM25Okapi(tokens, k1=K1, b=B, epsilon=0.0)
    okapi_default = rank_bm25.BM25Okapi(tokens, k1=K1, b=B)  # epsilon = 0.25
    negative = {t for t, idf in okapi_default.idf.items() if idf == okapi_default.epsilon * okapi_default.average_idf}
    assert negative  # NFCorpus has terms in more than half the documents (e.g. "studi")
    for q in queries:
        q_tokens = analyzer([q])[0]
        got = ours.scores(q) * (1 + K1)  # bm25s robertson omits the (k1 + 1) factor
        want = okapi.get_scores(q_tokens)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        assert _top10(got) == _top10(want)
        # the negative-IDF floor is the only difference with rank-bm25's default epsilon
        diff = np.abs(okapi_default.get_scores(q_tokens) - want) > 1e-9
        has_negative = np.array([any(t in negative for t in set(d) & set(q_tokens)) for d in tokens])
        assert not (diff & ~has_negative).any()


def test_bm25plus_equals_rank_bm25(corpus) -> None:
    rank_bm25 = pytest.importorskip("rank_bm25")
    texts, queries = corpus
    analyzer = Analyzer(BM25Params())
    ours = _bm25s(texts, BM25Params(k1=K1, b=B, method="bm25+", delta=0.5))
    plus = rank_bm25.BM25Plus(analyzer(texts), k1=K1, b=B, delta=0.5)
    for q in queries:
        got, want = ours.scores(q), plus.get_scores(analyzer([q])[0])
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        assert _top10(got) == _top10(want)

"""heedrank.index.bm25: tokenisation, Lucene BM25 scores against a hand-written oracle, top-k."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from heedrank.errors import NotFoundError, ValidationError
from heedrank.index.bm25 import Analyzer, BM25Builder, BM25Index, BM25Params, topk_indices

TEXTS = [
    "Vitamin D and bone health in older adults",
    "Statins and the risk of breast cancer",
    "Breast cancer survival with statin use: a cohort study",
    "Diet, vitamins and running shoes",
    "The the the and of",  # only stop words
    "",
    "Vitamin D and bone health in older adults",  # duplicate of row 0
]


@pytest.fixture(scope="module")
def bm25() -> BM25Index:
    b = BM25Builder()
    b.add(TEXTS[:3])
    b.add(TEXTS[3:])
    return b.build()


def test_analyzer() -> None:
    a = Analyzer()
    assert a(["The Statins, RUNNING shoes of a 5 km race! Vitamin D"]) == [
        ["statin", "run", "shoe", "5", "km", "race", "vitamin", "d"]
    ]
    assert a([""]) == [[]]
    assert len(a.stopwords) == 33 and "the" in a.stopwords and "not" in a.stopwords
    raw = Analyzer(BM25Params(stopwords=None, stemmer=None))
    assert raw(["The Statins"]) == [["the", "statins"]]


def _oracle(texts: list[str], query: str, k1: float = 0.9, b: float = 0.4) -> np.ndarray:
    """Lucene BM25 written out from the formula."""
    a = Analyzer()
    docs = a(texts)
    n = len(docs)
    avgdl = sum(len(d) for d in docs) / n
    scores = np.zeros(n)
    for t in a([query])[0]:
        df = sum(t in d for d in docs)
        if df == 0:
            continue
        idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
        for i, d in enumerate(docs):
            tf = d.count(t)
            if tf:
                scores[i] += idf * tf / (tf + k1 * (1 - b + b * len(d) / avgdl))
    return scores


@pytest.mark.parametrize("query", ["vitamin d bone", "breast cancer statins", "running diet vitamin", "statin statin"])
def test_scores_match_lucene_formula(bm25: BM25Index, query: str) -> None:
    np.testing.assert_allclose(bm25.scores(query), _oracle(TEXTS, query), rtol=1e-5, atol=1e-6)


def test_search_sorted_positive_and_clamped(bm25: BM25Index) -> None:
    [(vids, scores)] = bm25.search(["breast cancer statins"], k=1000)  # k > corpus: no error
    assert vids.dtype == np.int64 and scores.dtype == np.float32
    assert set(vids.tolist()) == {1, 2}  # only documents containing a query token
    assert list(scores) == sorted(scores, reverse=True) and (scores > 0).all()
    [(vids, _)] = bm25.search(["breast cancer statins"], k=1)
    assert vids.tolist() == [1]  # shorter document, same terms


def test_ties_at_k_are_all_returned(bm25: BM25Index) -> None:
    [(vids, scores)] = bm25.search(["older adults"], k=1)
    assert sorted(vids.tolist()) == [0, 6] and scores[0] == scores[1]


def test_unknown_and_stopword_queries_get_nothing(bm25: BM25Index) -> None:
    for q in ["zebra quantum", "the and of", ""]:
        [(vids, scores)] = bm25.search([q], k=5)
        assert len(vids) == 0 and len(scores) == 0


def test_save_load_round_trip(tmp_path: Path, bm25: BM25Index) -> None:
    bm25.save(tmp_path / "bm25")
    loaded = BM25Index.load(tmp_path / "bm25")
    assert loaded.num_docs == 7 and loaded.params == BM25Params()
    np.testing.assert_array_equal(loaded.scores("vitamin bone cancer"), bm25.scores("vitamin bone cancer"))
    with pytest.raises(NotFoundError):
        BM25Index.load(tmp_path / "nothing")


def test_empty_corpus_rejected() -> None:
    with pytest.raises(ValidationError):
        BM25Builder().build()


def test_topk_indices() -> None:
    s = np.array([0.0, 3.0, 1.0, 3.0, 2.0, -1.0], dtype=np.float32)
    assert sorted(topk_indices(s, 1).tolist()) == [1, 3]  # tie with the k-th kept
    assert sorted(topk_indices(s, 3).tolist()) == [1, 3, 4]
    assert sorted(topk_indices(s, 10).tolist()) == [1, 2, 3, 4]
    assert sorted(topk_indices(s, 10, positive_only=False).tolist()) == [0, 1, 2, 3, 4, 5]
    assert topk_indices(s, 0).tolist() == []


WORDS = ["vitamin", "bone", "cancer", "statin", "breast", "diet", "run", "shoe", "zebra", "the"]


@settings(max_examples=60, deadline=None)
@given(words=st.lists(st.sampled_from(WORDS), min_size=0, max_size=5), k=st.integers(1, 12))
def test_search_invariants(bm25: BM25Index, words: list[str], k: int) -> None:
    [(vids, scores)] = bm25.search([" ".join(words)], k)
    full = bm25.scores(" ".join(words))
    positive = int((full > 0).sum())
    assert len(set(vids.tolist())) == len(vids)
    assert min(k, positive) <= len(vids) <= positive
    assert np.all(np.diff(scores) <= 0)
    if len(vids):
        assert scores[-1] >= np.sort(full)[::-1][min(k, positive) - 1]  # nothing better was left out

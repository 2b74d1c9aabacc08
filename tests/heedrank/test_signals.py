"""The scorer's signals (:mod:`heedrank.signals`): each an ``(N,)`` array over one query's
candidates, NaN where it has no value, gathered into the ``(N, F)`` matrix a strategy serves; and
a new signal served as one new file (``signal_fakes.py``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from heedrank.errors import UnknownNameError, ValidationError
from heedrank.signals import BUILT_IN, SignalInputs, gather, names, register, signal
from heedrank.types import Document, Query, Ranking, ScoredDoc


def _cands(texts: dict[str, str]) -> Ranking:
    return Ranking("q", tuple(ScoredDoc(d, 1.0 / (1 + i), Document(d, t)) for i, (d, t) in enumerate(texts.items())))


class _Cosines:
    def cosines(self, query, documents, *, stored=True):  # type: ignore[no-untyped-def]
        return {d.doc_id: 0.1 * len(d.content) for d in documents if d.doc_id != "c"}


def test_the_built_in_signals_and_where_they_have_no_value() -> None:
    assert [s.name for s in BUILT_IN] == ["attention", "dense", "rank"] == list(names()[:3])
    cands = _cands({"a": "x", "b": "yy", "c": "zzz"})
    read = Ranking.from_scores("q", {"a": 2.0, "c": -1.0})  # b: its block was not read
    inputs = SignalInputs(Query("q", "t"), cands, read, dense=_Cosines())
    X = gather(["attention", "dense", "rank"], inputs)
    want = [[2.0, 0.1, 0.0], [np.nan, 0.2, math.log(2)], [-1.0, np.nan, math.log(3)]]
    np.testing.assert_allclose(X, np.asarray(want))
    # /rerank's documents: no rank (a client's order), no embedder, no pass: no attention
    bare = SignalInputs(Query("q", "t"), cands, None, dense=None, stored=False, ranked=False)
    assert np.isnan(gather(["attention", "dense", "rank"], bare)).all()
    assert gather(["rank"], SignalInputs(Query("q", "t"), Ranking("q", ()))).shape == (0, 1)
    assert signal("dense").reads_reranker is False and signal("attention").reads_reranker is True
    with pytest.raises(UnknownNameError, match="unknown signal 'nope'"):
        gather(["nope"], inputs)


def test_a_signal_with_a_wrong_shape_or_a_taken_name_is_refused() -> None:
    class Short:
        name = "short-for-test"
        reads_reranker = False

        def values(self, inputs: SignalInputs) -> np.ndarray:
            return np.zeros(1)

    register(Short())
    with pytest.raises(ValidationError, match=r"shape \(1,\) for 3 candidates"):
        gather(["short-for-test"], SignalInputs(Query("q", "t"), _cands({"a": "x", "b": "y", "c": "z"})))

    class Other:
        name = "dense"
        reads_reranker = False

        def values(self, inputs: SignalInputs) -> np.ndarray:
            return inputs.missing()

    with pytest.raises(ValidationError, match="registered already"):
        register(Other())


def test_a_new_signal_is_one_file_and_is_served() -> None:
    """``signal_fakes.py`` registers ``words``; a card whose scorer reads it is served through the
    pipeline (the stage gathers it, the strategy scores it), with no edit to the serving or the stage."""
    import signal_fakes

    from heedrank.index.store import Index
    from heedrank.pipeline import Pipeline, SearchOptions
    from heedrank.protocols import Reranker, RerankResult
    from heedrank.retriever.bm25 import BM25Retriever
    from heedrank.scorer import Scorer
    from heedrank.seam import RerankerServing

    assert signal_fakes.NAME in names()
    texts = ["apple", "apple pear plum kiwi", "apple pear", "apple pear plum kiwi fig lime", "apple pear plum"]
    ix = Index.from_documents([Document(f"d{i}", t) for i, t in enumerate(texts)])
    card = {"scorer": {"threshold": 0.5, "models": [
        {"uses": ["attention", signal_fakes.NAME], "weights": [0.0, 1.0], "bias": -3.0}]}}

    class Flat(Reranker):
        name = "flat"

        def rerank(self, query, candidates, *, block_store=None):  # type: ignore[no-untyped-def]
            return RerankResult(Ranking.from_scores(query.query_id, {d.doc_id: 0.0 for d in candidates}))

        def rerank_batch(self, queries, candidates):  # type: ignore[no-untyped-def]
            return [self.rerank(q, c) for q, c in zip(queries, candidates)]

        def describe(self) -> dict:
            return {"method": self.name}

        def serving(self) -> RerankerServing:
            return RerankerServing(Scorer.from_card(card), 0.5)

    reranker = Flat()
    pipe = Pipeline({"bm25": BM25Retriever.from_index(ix)}, ix.docstore, reranker_factory=lambda method: reranker)
    res = pipe.search(Query("q", "apple"), SearchOptions(rerank="flat", candidates=5, top_k=5))
    assert res.ranking.doc_ids == ["d3", "d1", "d4", "d2", "d0"]  # longest first: the words signal alone decides
    assert res.probabilities == pytest.approx({f"d{i}": 1 / (1 + math.exp(3.0 - len(t.split())))
                                               for i, t in enumerate(texts)})

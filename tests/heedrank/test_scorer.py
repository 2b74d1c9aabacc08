"""The default's scorer (:mod:`heedrank.scorer`) and its serving (:class:`heedrank.serving.ScorerServing`):
one model per subset of the signals, a candidate missing one scored from the rest, a lone
document's probability the same as in a list, and the order, probability and cut-off one number."""

from __future__ import annotations

import math

import numpy as np
import pytest

from heedrank.errors import ValidationError
from heedrank.scorer import Scorer
from heedrank.seam import RerankerServing, serving_of
from heedrank.serving import ScorerServing, Served, ServePolicy
from heedrank.signals import SignalInputs, gather
from heedrank.signals.rank import feature as rank_feature
from heedrank.types import Query, Ranking, ScoredDoc

ENTRY = {"scorer": {"features": ["attention", "dense", "rank"], "threshold": 0.4, "models": [
    {"uses": ["attention", "dense", "rank"], "weights": [0.5, 8.0, -0.3], "bias": -4.0},
    {"uses": ["attention", "dense"], "weights": [0.5, 9.0], "bias": -4.5},
    {"uses": ["dense", "rank"], "weights": [10.0, -0.4], "bias": -5.0},
    {"uses": ["dense"], "weights": [11.0], "bias": -5.5},
    {"uses": ["attention", "rank"], "weights": [0.9, -0.2], "bias": -1.0},
    {"uses": ["attention"], "weights": [1.0], "bias": -1.2}]}}


def sig(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


class Fake:
    def serving(self) -> RerankerServing:
        return RerankerServing(Scorer.from_card(ENTRY), 0.4)


def test_the_model_of_the_signals_a_candidate_has() -> None:
    scorer = Scorer.from_card(ENTRY)
    assert scorer is not None and Scorer.from_card({}) is None
    logit, model = scorer.logit({"attention": 2.0, "dense": 0.5, "rank": rank_feature(3)})  # type: ignore[misc]
    assert model.uses == ("attention", "dense", "rank")
    assert logit == pytest.approx(-4.0 + 1.0 + 4.0 - 0.3 * math.log(4))
    assert scorer.logit({"attention": None, "dense": 0.5, "rank": 0.0})[1].uses == ("dense", "rank")  # type: ignore[index]
    assert scorer.logit({"attention": float("nan"), "dense": 0.5})[0] == pytest.approx(-5.5 + 5.5)  # type: ignore[index]
    assert scorer.logit({"rank": 1.0}) is None  # rank alone is no model
    with pytest.raises(ValidationError, match="refit"):
        Scorer.from_card({"scorer": {"models": [{"uses": ["dense"], "weights": [1.0], "bias": 0.0}]}})
    assert serving_of(object()) == RerankerServing()


def test_attention_moves_a_candidate_from_where_the_model_without_it_puts_it() -> None:
    """With a signal the attention model does not read (``signal_fakes``' ``words``) in the model
    without attention: in a list read in part, a candidate with attention gets N(x) + A(x) - B(x),
    so the list is on one scale."""
    import signal_fakes

    words = signal_fakes.NAME
    entry = {"scorer": {"threshold": 0.4, "models": [
        {"uses": ["attention", "dense", "rank"], "weights": [0.5, 8.0, -0.3], "bias": -4.0},
        {"uses": ["dense", "rank", words], "weights": [9.0, -0.2, 0.3], "bias": -6.0},
        {"uses": ["dense", "rank"], "weights": [10.0, -0.4], "bias": -5.0}]}}
    scorer = Scorer.from_card(entry)
    assert scorer is not None
    x = {"attention": 2.0, "dense": 0.5, "rank": math.log(3), words: 4.0}
    n = -6.0 + 4.5 - 0.2 * math.log(3) + 1.2
    a = -4.0 + 1.0 + 4.0 - 0.3 * math.log(3)
    b = -5.0 + 5.0 - 0.4 * math.log(3)
    logit, model = scorer.logit(x, step=True)  # type: ignore[misc]
    assert model.uses == ("attention", "dense", "rank") and logit == pytest.approx(n + a - b)
    assert scorer.logit({**x, "attention": None}, step=True)[0] == pytest.approx(n)  # type: ignore[index]
    # without that signal: the attention model's own logit
    assert scorer.logit({**x, words: None}, step=True)[0] == pytest.approx(a)  # type: ignore[index]
    # every candidate read (no step): the attention model's own logit
    assert scorer.logit(x)[0] == pytest.approx(a)  # type: ignore[index]


def _ranking(ids: list[str], scores: list[float] | None = None) -> Ranking:
    scores = scores or [float(len(ids) - i) for i in range(len(ids))]
    return Ranking.from_hits("q", (ScoredDoc(d, s) for d, s in zip(ids, scores)))


class _Cosines:
    """The embedder's side of a path, as given cosines (``{doc_id: cosine}``)."""

    def __init__(self, cosines: dict[str, float]) -> None:
        self.given = cosines

    def cosines(self, query, documents, *, stored=True):  # type: ignore[no-untyped-def]
        return self.given


def _serve(policy: ServePolicy, cands: Ranking, attention: Ranking, dense: dict[str, float]) -> Served:
    """``cands`` served by ``policy`` from the real signals over the reranker's ``attention`` and the cosines ``dense``."""
    inputs = SignalInputs(Query("q", "text"), cands, attention, dense=_Cosines(dense), ranked=policy.ranked)
    return policy.serve(cands, gather(policy.features, inputs))


def test_the_matrix_form_is_the_one_candidate_form() -> None:
    """``Scorer.logits`` over an ``(N, F)`` matrix with NaN gives each row what ``logit`` gives it alone."""
    scorer = Scorer.from_card(ENTRY)
    assert scorer is not None and scorer.features == ("attention", "dense", "rank")
    X = np.asarray([[2.0, 0.5, 0.0], [np.nan, 0.5, 1.0], [1.0, np.nan, np.nan], [np.nan, np.nan, 0.3]])
    for step in (False, True):
        got = scorer.logits(X, scorer.features, step=step)
        for row, value in zip(X, got):
            one = scorer.logit(dict(zip(scorer.features, row)), step=step)
            assert (one is None and np.isnan(value)) or (one is not None and one[0] == value)
    assert scorer.logits(np.empty((0, 3)), scorer.features).shape == (0,)


def test_served_by_one_number_with_missing_signals() -> None:
    policy = ServePolicy.of(Fake(), fusion="default", by="score")
    assert isinstance(policy.strategy, ScorerServing) and policy.ranked
    cands = _ranking(["a", "b", "c", "d"])
    attention = _ranking(["a", "c"], [0.0, 3.0])  # b and d were not read (cold past the budget)
    dense = {"a": 0.2, "b": 0.6, "c": 0.4}  # d has no vector either
    served = _serve(policy, cands, attention, dense)
    expect = {"a": -4.0 + 1.6, "b": -5.0 + 6.0 - 0.4 * math.log(2), "c": -4.0 + 1.5 + 3.2 - 0.3 * math.log(3)}
    assert [h.doc_id for h in served.ranking.hits] == ["b", "c", "a", "d"]  # d: no signal, last
    assert {h.doc_id: h.score for h in served.ranking.hits[:3]} == pytest.approx(expect)
    assert served.probabilities == pytest.approx({d: sig(v) for d, v in expect.items()})
    assert served.relevance == served.probabilities and served.without_lm == 1
    assert "1 of 4 candidates" in served.warnings[0]
    cut = _serve(ServePolicy.of(Fake(), fusion="default", cutoff="auto"), cands, attention, dense)
    assert cut.threshold == 0.4 and [h.doc_id for h in cut.ranking.hits] == [d for d in "bca" if sig(expect[d]) >= 0.4]


def test_a_lone_document_gets_its_probability_in_any_list() -> None:
    """/rerank (by='prior'): the given order is not a signal, so a document's probability is its own."""
    policy = ServePolicy.of(Fake(), fusion="default", by="prior")
    assert isinstance(policy.strategy, ScorerServing) and not policy.ranked
    dense = {"x": 0.3, "y": 0.1, "z": 0.5}
    att = {"x": 1.0, "y": -2.0, "z": 0.5}
    alone = _serve(policy, _ranking(["x"]), _ranking(["x"], [att["x"]]), dense).probabilities
    listed = _serve(policy, _ranking(["z", "y", "x"]), _ranking(["z", "y", "x"], [att[d] for d in "zyx"]),
                    dense).probabilities
    assert alone is not None and listed is not None
    assert alone["x"] == listed["x"] == pytest.approx(sig(-4.5 + 0.5 + 2.7))
    # an explicit fusion weight serves the reranker's own way instead of the scorer
    assert not isinstance(ServePolicy.of(Fake(), fusion=0.3).strategy, ScorerServing)


def _scored_pipeline(signal: str = "attention"):  # type: ignore[no-untyped-def]
    from heedrank.index.cosines import DenseSignal
    from heedrank.index.hashing import HashingEncoder
    from heedrank.index.store import Index
    from heedrank.pipeline import Pipeline
    from heedrank.protocols import RerankResult
    from heedrank.retriever.bm25 import BM25Retriever
    from heedrank.types import Document

    texts = ["apple pear plum", "apple cold pear", "apple apple warm", "cold cold apple", "apple warm plum"]
    ix = Index.from_documents([Document(f"d{i}", t) for i, t in enumerate(texts)], encoder=HashingEncoder(64))

    class Reverse:
        name = "reverse"
        calls = 0

        def serving(self) -> RerankerServing:
            return RerankerServing(Scorer.from_card(ENTRY), 0.4, signal=signal)

        def rerank(self, query, candidates):  # type: ignore[no-untyped-def]
            Reverse.calls += 1
            return RerankResult(Ranking.from_hits(query.query_id, (ScoredDoc(d.doc_id, float(i), d)
                                                                    for i, d in enumerate(candidates))))

        def rerank_batch(self, queries, candidates):  # type: ignore[no-untyped-def]
            return [self.rerank(q, c) for q, c in zip(queries, candidates)]

        def describe(self) -> dict:
            return {"method": self.name}

    reranker = Reverse()
    pipe = Pipeline({"bm25": BM25Retriever.from_index(ix)}, ix.docstore, reranker_factory=lambda method: reranker,
                    dense=DenseSignal.of_index(ix))
    return pipe, reranker


def test_served_without_the_lm_and_the_embedder_alone_without_a_pass() -> None:
    from heedrank.pipeline import SearchOptions
    from heedrank.types import Query

    pipe, reranker = _scored_pipeline()
    res = pipe.search(Query("q", "cold apple"), SearchOptions(rerank="reverse", candidates=5, top_k=5))
    given = Ranking("q", tuple(res.ranking.hits))  # hydrated, in some given order
    no_lm = pipe.serve_without_lm(Query("q", "cold apple"), given, SearchOptions(rerank="reverse"))
    assert no_lm is not None and no_lm.without_lm == 5 and set(no_lm.probabilities or {}) == set(res.ranking.doc_ids)
    dense = pipe.dense.cosines("cold apple", [h.document for h in given.hits])  # type: ignore[union-attr]
    want = {d: sig(-5.0 + 10.0 * dense[d] - 0.4 * math.log1p(i)) for i, d in enumerate(given.doc_ids)}
    assert no_lm.probabilities == pytest.approx(want)
    # the embedder alone (signal 'dense'): the pipeline's cosines, the reranker never called
    pipe, reranker = _scored_pipeline("dense")
    before = type(reranker).calls
    res = pipe.search(Query("q", "cold apple"), SearchOptions(rerank="reverse", candidates=5, top_k=5))
    assert type(reranker).calls == before and res.probabilities is not None
    order = sorted(res.probabilities, key=lambda d: -res.probabilities[d])  # type: ignore[index]
    assert res.ranking.doc_ids == order


def test_a_search_read_in_part_says_how_many_the_scorer_served_without_attention() -> None:
    """The served warning reaches the search result (``/search``'s ``rerank.warnings``), not only
    ``/rerank``'s ``meta.warnings``."""
    from heedrank.pipeline import SearchOptions
    from heedrank.protocols import RerankResult
    from heedrank.types import Query

    pipe, reranker = _scored_pipeline()

    def read_two(query, candidates):  # type: ignore[no-untyped-def]  # the other blocks cold past the budget
        return RerankResult(Ranking.from_hits(query.query_id, (ScoredDoc(d.doc_id, 1.0, d) for d in candidates[:2])))

    reranker.rerank = read_two  # type: ignore[method-assign]
    res = pipe.search(Query("q", "cold apple"), SearchOptions(rerank="reverse", candidates=5, top_k=5))
    assert res.warnings == ("3 of 5 candidates were scored without the reranker's attention (cold past the budget or "
                            "over the request budget): from the scorer's other signals",)
    from heedrank.api.routes.search import to_response

    assert to_response(res, "reverse").rerank.warnings == list(res.warnings)  # type: ignore[union-attr]


GATED = {"scorer": {**ENTRY["scorer"], "gate": {"signal": "query_words", "limit": 10, "power": 1.0,
                                                 "toward": ["dense"]}}}


def test_the_gate_is_a_number_of_the_query_so_a_document_keeps_its_probability() -> None:
    from heedrank.signals import QUERY_WORDS

    cands = _ranking(["x", "y"])
    inputs = SignalInputs(Query("q", "one two three four"), cands, None, dense=None)
    assert QUERY_WORDS.values(inputs).tolist() == [4.0, 4.0]
    scorer = Scorer.from_card(GATED)
    assert scorer is not None
    long_query = 30.0
    alone = scorer.logits(np.asarray([[1.0, 0.3, np.nan, long_query]]), scorer.features)
    listed = scorer.logits(np.asarray([[3.0, 0.9, np.nan, long_query], [1.0, 0.3, np.nan, long_query]]),
                           scorer.features)
    assert alone[0] == listed[1]


@pytest.mark.parametrize("gate", [{"signal": "nope", "limit": 10, "toward": ["dense"]}, {"limit": 0, "toward": ["dense"]},
                                  {"limit": "x", "toward": ["dense"]}, {"limit": 10, "power": -1, "toward": ["dense"]},
                                  {"limit": 10}])
def test_a_gate_the_signals_cannot_serve_is_refused(gate) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValidationError, match="refit"):
        Scorer.from_card({"scorer": {**ENTRY["scorer"], "gate": gate}})


def test_a_gate_toward_the_embedder_leans_every_candidate_of_a_long_query_on_it() -> None:
    """``toward: ["dense"]``: ``D + g (s - D)`` for every candidate holding a cosine, read by the LM or
    not, so a list read in part stays on one scale; a short query is scored as without a gate."""
    scorer = Scorer.from_card({"scorer": {**ENTRY["scorer"], "gate": {"limit": 10, "power": 1.0, "toward": ["dense"]}}})
    assert scorer is not None and scorer.gate is not None and scorer.gate.toward == ("dense",)
    plain = Scorer.from_card(ENTRY)
    assert plain is not None
    X = np.asarray([[2.0, 0.5, math.log(3), 40.0], [np.nan, 0.4, math.log(4), 40.0], [2.0, 0.5, math.log(3), 9.0]])
    got = scorer.logits(X, scorer.features, step=True)
    before = plain.logits(X[:, :3], plain.features, step=True)
    d = np.asarray([-5.5 + 11.0 * 0.5, -5.5 + 11.0 * 0.4])
    assert got[:2] == pytest.approx(d + 0.25 * (before[:2] - d))
    assert got[2] == before[2]

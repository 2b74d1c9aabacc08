"""A reranking whose result nobody will read stops at its next layer: the
attention function every LM layer runs checks the thread's cancellation token
(:mod:`heedrank.cancel`), so ICR and BlockRank on the real small LM raise
:class:`JobCancelledError` at the layer after the token is set, and the reranker answers the
next query as if nothing had happened."""

from __future__ import annotations

import threading

import pytest

torch = pytest.importorskip("torch")

from heedrank.cancel import CancelToken, cancel_scope, check, current_token  # noqa: E402
from heedrank.config import RerankerConfig  # noqa: E402
from heedrank.errors import JobCancelledError  # noqa: E402
from heedrank.reranker import attention  # noqa: E402
from heedrank.reranker.blockrank import BlockRankReranker  # noqa: E402
from heedrank.reranker.icr import ICRReranker  # noqa: E402
from heedrank.types import Document, Query  # noqa: E402

QUERY = Query("q", "What is the boiling point of water at sea level?")
DOCS = [
    Document("d-water", "At sea level, pure water boils at 100 degrees Celsius."),
    Document("d-cat", "Cats are small domesticated carnivorous mammals kept as pets."),
    Document("d-tea", "Tea is brewed by pouring hot or boiling water over leaves."),
    Document("d-ice", "Ice melts at 0 degrees Celsius under normal pressure."),
]


def test_tokens_and_scopes():
    token = CancelToken()
    check()  # no scope: never raises
    with cancel_scope(token):
        assert current_token() is token
        check()
        token.cancel("the client closed the connection")
        token.cancel("a later reason")  # the first reason wins
        with pytest.raises(JobCancelledError, match="stopped: the client closed the connection") as err:
            check()
        assert err.value.status_code == 499 and err.value.error_type == "cancelled"
        with cancel_scope(None):  # scopes nest
            check()
    assert current_token() is None
    seen = []
    t = threading.Thread(target=lambda: seen.append(current_token()))  # per thread
    with cancel_scope(token):
        t.start()
        t.join()
    assert seen == [None]


@pytest.fixture(params=["icr", "blockrank"])
def reranker(request, default_lm):
    cls = ICRReranker if request.param == "icr" else BlockRankReranker
    return cls(RerankerConfig(method=request.param, max_doc_tokens=48), lm=default_lm)


def test_a_cancelled_reranking_stops_at_the_next_layer(reranker, monkeypatch):
    before = reranker.rerank(QUERY, DOCS).ranking.to_dict()
    calls = []
    token = CancelToken()

    def counting_check() -> None:
        calls.append(1)
        if len(calls) == 5:  # cancelled while layer 5 runs: the next layer must not start
            token.cancel("the client closed the connection")
        elif len(calls) > 5:
            check()

    monkeypatch.setattr(attention, "check_cancelled", counting_check)
    with cancel_scope(token), pytest.raises(JobCancelledError):
        reranker.rerank(QUERY, DOCS)
    assert len(calls) == 6  # stopped at the first layer boundary after the token was set
    monkeypatch.undo()
    assert reranker.rerank(QUERY, DOCS).ranking.to_dict() == pytest.approx(before, abs=1e-6)  # nothing left half-done


def test_a_token_set_before_the_start_stops_at_the_first_layer(reranker):
    token = CancelToken()
    token.cancel("its deadline passed")
    with cancel_scope(token), pytest.raises(JobCancelledError, match="its deadline passed"):
        reranker.rerank(QUERY, DOCS)

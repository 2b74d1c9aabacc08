"""POST /rerank: the Cohere v2 request and response, with the fake reranker (shorter documents
score higher: 1 / len(text))."""

from __future__ import annotations

import threading
import uuid

import pytest
from fastapi.testclient import TestClient

from heedrank.api.app import create_app
from heedrank.serving import PositionPrior
from api_fakes import FakeReranker, SlowReranker

DOCS = ["a long document about apples and orchards", "short", "a medium document", "tiny!"]
BY_LENGTH = sorted(range(len(DOCS)), key=lambda i: (len(DOCS[i]), i))  # the fake's order


def _prior(texts: list[str]) -> tuple[list[int], list[float], float]:
    """What /rerank's default (the given order as a :class:`heedrank.serving.PositionPrior`)
    serves for the fake's scores (1 / len) of ``texts`` in the given order: the order of indices,
    each one's relevance_score (the fake has no calibration and no score_scale: its own score less
    the prior in its units, ``sd * strength * log(1 + i)``, so that it follows the served order)
    and the prior's strength."""
    import math
    import statistics

    from heedrank.serving import PositionPrior

    raw = [1.0 / len(t) for t in texts]
    served = PositionPrior().scores(raw)
    strength = PositionPrior().strength(raw)
    order = sorted(range(len(texts)), key=lambda i: (-served[i], f"{i:0{len(str(len(texts) - 1))}d}"))
    sd = statistics.pstdev(raw)
    return order, [raw[i] - sd * strength * math.log1p(i) for i in order], strength


def _error(r, status: int, error_type: str) -> str:
    assert r.status_code == status, r.text
    assert set(r.json()) == {"error", "error_type"} and r.json()["error_type"] == error_type
    return r.json()["error"]


def test_cohere_v2_shape(client):
    r = client.post("/rerank", json={"model": "fake", "query": "apples", "documents": DOCS})
    assert r.status_code == 200, r.text
    body = r.json()
    assert set(body) == {"id", "results", "meta"}
    uuid.UUID(body["id"])
    assert [x["index"] for x in body["results"]] == BY_LENGTH
    assert all(set(x) == {"index", "relevance_score"} for x in body["results"])  # no document unless asked
    scores = [x["relevance_score"] for x in body["results"]]
    assert scores == sorted(scores, reverse=True)
    # the default fusion is the position prior: the given order (longest first) disagrees with the
    # fake, so it counts for nothing; relevance_score is the fake's own score (no calibration, no scale)
    order, relevance, strength = _prior(DOCS)
    assert order == BY_LENGTH and strength == 0.0
    assert scores == pytest.approx(relevance)
    assert body["meta"]["raw_scores"] == pytest.approx([1 / len(DOCS[i]) for i in BY_LENGTH])
    meta = body["meta"]
    assert meta["api_version"] == {"version": "2"}
    assert meta["billed_units"] == {"search_units": 1}
    assert meta["tokens"]["input_tokens"] > 0
    assert meta["method"] == "fake" and meta["model"] == "smollm2-135m-instruct/fake"
    assert meta["reranked"] is True and meta["deadline_exceeded"] is False
    assert meta["warnings"] == []
    assert set(meta["timings"]) == {"queue", "rerank", "total"}
    assert "fusion" not in meta and meta["order_prior"] == 0.0  # the prior, not a fusion weight
    assert meta["calibrated"] is False and "score_scale" not in meta  # the fake has no calibration, no scale
    assert meta["truncated"] == 0 and meta["doc_tokens"] == 160  # the service's budget for the fake


def test_top_n_return_documents_and_object_documents(client):
    docs = [{"text": t, "id": f"doc-{i}"} if i % 2 else t for i, t in enumerate(DOCS)]
    r = client.post("/rerank", json={"query": "apples", "documents": docs, "top_n": 2, "return_documents": True})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x["index"] for x in results] == BY_LENGTH[:2]
    assert [x["document"] for x in results] == [{"text": DOCS[i]} for i in BY_LENGTH[:2]]


def test_top_n_beyond_documents_returns_all_with_a_warning(client):
    body = client.post("/rerank", json={"query": "apples", "documents": DOCS, "top_n": 10}).json()
    assert len(body["results"]) == len(DOCS)
    assert "top_n 10" in body["meta"]["warnings"][0]


@pytest.mark.parametrize("model", ["fake", "smollm2-135m-instruct", "smollm2-135m-instruct/fake"])
def test_model_names_accepted(client, model):
    r = client.post("/rerank", json={"model": model, "query": "a", "documents": DOCS})  # several: one alone is warned of
    assert r.status_code == 200, r.text
    assert r.json()["meta"]["warnings"] == []


@pytest.mark.parametrize("model", ["rerank-v3.5", "rerank-english-v3.0", "rerank-multilingual-v3.0", "rerank-2"])
def test_model_ids_clients_send_are_served_silently(client, model):
    from heedrank.api.runtime import CLIENT_MODEL_IDS

    assert model in CLIENT_MODEL_IDS
    r = client.post("/rerank", json={"model": model, "query": "a", "documents": DOCS})
    assert r.status_code == 200, r.text
    meta = r.json()["meta"]
    assert meta["warnings"] == [] and meta["reranked"] is True
    assert meta["method"] == "fake" and meta["model"] == "smollm2-135m-instruct/fake"  # what answered
    assert [x["index"] for x in r.json()["results"]] == BY_LENGTH


def test_any_other_model_id_is_served_with_a_warning(client):
    r = client.post("/rerank", json={"model": "gpt-4o", "query": "a", "documents": DOCS})
    assert r.status_code == 200, r.text  # no longer a 422 "not served here"
    meta = r.json()["meta"]
    (warning,) = meta["warnings"]
    assert "'gpt-4o' is not a model id of this service" in warning
    assert "smollm2-135m-instruct/fake answered" in warning and "rerank-v3.5" in warning  # the ids it knows
    assert meta["method"] == "fake" and meta["model"] == "smollm2-135m-instruct/fake"
    assert meta["reranked"] is True and [x["index"] for x in r.json()["results"]] == BY_LENGTH


@pytest.mark.parametrize(
    ("payload", "needle"),
    [
        ({"query": "a", "documents": []}, "documents"),
        ({"query": " ", "documents": ["x"]}, "query must not be empty"),
        ({"documents": ["x"]}, "query"),
        ({"query": "a", "documents": [{"title": "no text"}]}, "documents"),
        ({"query": "a", "documents": ["x"], "top_n": 0}, "top_n"),
        ({"query": "a", "documents": ["x"], "max_tokens_per_doc": 0}, "max_tokens_per_doc"),
        ({"query": "a", "documents": ["x"], "deadline_ms": 0}, "deadline_ms"),
        ({"query": "a", "documents": ["x"], "rank_fields": ["title"]}, "rank_fields"),
        ({"query": "a", "documents": ["x"], "colour": "red"}, "colour"),
    ],
)
def test_422(client, payload, needle):
    assert needle in _error(client.post("/rerank", json=payload), 422, "validation")


def test_max_tokens_per_doc_builds_a_reranker_with_that_budget(client, settings, pipeline):
    r = client.post("/rerank", json={"query": "a", "documents": ["x", "y"], "max_tokens_per_doc": 7})
    assert r.status_code == 200, r.text
    built = [rr for name, rr in pipeline.loaded_rerankers().items() if "max_doc_tokens=7" in name]
    assert len(built) == 1 and built[0].config.max_doc_tokens == 7
    r = client.post("/rerank", json={"query": "a", "documents": ["x"], "max_tokens_per_doc": 100_000})
    assert f"clamped to this service's {settings.max_doc_tokens}" in r.json()["meta"]["warnings"][0]


def test_truncated_counts_the_documents_over_the_budget(client, settings):
    docs = ["x" * 80, "short", "y" * 90]  # the fake reports content over 60 characters as truncated
    meta = client.post("/rerank", json={"query": "a", "documents": docs}).json()["meta"]
    assert meta["truncated"] == 2  # a count, no longer the indices
    assert meta["doc_tokens"] == settings.max_doc_tokens  # the budget each document was read to
    meta = client.post("/rerank", json={"query": "a", "documents": docs, "max_tokens_per_doc": 7}).json()["meta"]
    assert meta["doc_tokens"] == 7


def test_no_reranker_is_503(settings, pipeline):
    settings = settings.model_copy(update={"rerank_method": "none"})
    with TestClient(create_app(settings, pipeline=pipeline)) as client:
        r = client.post("/rerank", json={"query": "a", "documents": ["x"]})
        assert "no reranker" in _error(r, 503, "model_unavailable")


# -------------------------------------------------------------------- deadline_ms
@pytest.fixture
def slow_client(settings, pipeline):
    settings = settings.model_copy(update={"rerank_method": "slow", "workers": 1, "queue_size": 4})
    with TestClient(create_app(settings, pipeline=pipeline)) as c:
        assert c.app.state.runtime.wait_ready(10)
        yield c


def _fallback(body: dict, n: int) -> None:
    assert body["meta"]["reranked"] is False and body["meta"]["deadline_exceeded"] is True
    assert "deadline_ms" in body["meta"]["warnings"][-1]
    assert [x["index"] for x in body["results"]] == list(range(n))
    assert [x["relevance_score"] for x in body["results"]] == pytest.approx([1 / (1 + i) for i in range(n)])


def test_deadline_passes_answers_in_given_order(slow_client):
    SlowReranker.delay = 0.5
    r = slow_client.post("/rerank", json={"query": "apples", "documents": DOCS, "deadline_ms": 50})
    assert r.status_code == 200, r.text
    _fallback(r.json(), len(DOCS))
    assert 'heedrank_deadline_fallbacks_total{reason="timeout"} 1.0' in slow_client.get("/metrics").text


def test_deadline_estimate_skips_reranking_at_once(slow_client):
    SlowReranker.delay = 0.2
    first = slow_client.post("/rerank", json={"query": "apples", "documents": DOCS}).json()  # teaches the estimate
    assert first["meta"]["reranked"] is True
    started = SlowReranker.started
    r = slow_client.post("/rerank", json={"query": "apples", "documents": DOCS, "deadline_ms": 20, "top_n": 2})
    _fallback(r.json(), 2)
    assert SlowReranker.started == started  # never queued
    assert 'heedrank_deadline_fallbacks_total{reason="estimate"} 1.0' in slow_client.get("/metrics").text


def test_generous_deadline_reranks(slow_client):
    body = slow_client.post("/rerank", json={"query": "apples", "documents": DOCS, "deadline_ms": 20_000}).json()
    assert body["meta"]["reranked"] is True
    assert [x["index"] for x in body["results"]] == BY_LENGTH


def test_full_queue_with_deadline_answers_in_given_order(settings, pipeline):
    SlowReranker.gate = threading.Event()
    settings = settings.model_copy(update={"rerank_method": "slow", "workers": 1, "queue_size": 0})
    with TestClient(create_app(settings, pipeline=pipeline)) as client:
        assert client.app.state.runtime.wait_ready(10)
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(1) as ex:
            busy = ex.submit(client.post, "/rerank", json={"query": "a", "documents": ["x"]})
            pool = client.app.state.runtime.pools["rerank"]
            import time

            while pool.busy < 1:
                time.sleep(0.01)
            r = client.post("/rerank", json={"query": "a", "documents": DOCS, "deadline_ms": 5000})
            _fallback(r.json(), len(DOCS))
            _error(client.post("/rerank", json={"query": "a", "documents": DOCS}), 429, "overloaded")
            SlowReranker.gate.set()
            assert busy.result(timeout=30).status_code == 200
    assert FakeReranker.loads >= 1


def test_long_document_is_cut_to_the_token_budget_and_ranked(client, settings):
    # Cohere's behaviour: a document over max_tokens_per_doc is ranked on its beginning, not refused
    long = ("apples grow in orchards " * 6000)[:125_000]
    assert len(long) == 125_000 and len(long) > settings.max_document_chars
    r = client.post("/rerank", json={"query": "apples", "documents": ["short text", long], "return_documents": True})
    assert r.status_code == 200, r.text
    body = r.json()
    bound = 8 * settings.max_doc_tokens  # CHARS_PER_TOKEN per token of the service's budget (160 -> 1280)
    assert bound == 1280
    raw = dict(zip((x["index"] for x in body["results"]), body["meta"]["raw_scores"]))
    assert raw[1] == pytest.approx(1 / bound)  # the fake scores 1/len(text): it read exactly `bound` characters
    assert raw[0] == pytest.approx(1 / len("short text"))
    assert body["meta"]["truncated"] == 1 and body["meta"]["doc_tokens"] == 160
    assert body["meta"]["warnings"] == [
        "documents 1 are longer than 1280 characters; each was ranked on its first 160 LM tokens (max_tokens_per_doc)"
    ]
    assert {x["index"]: x["document"]["text"] for x in body["results"]}[1] == long  # returned as given


def test_long_documents_follow_max_tokens_per_doc(client):
    docs = ["x" * 100, "y" * 50, "z" * 81]
    r = client.post("/rerank", json={"query": "q", "documents": docs, "max_tokens_per_doc": 10})
    assert r.status_code == 200, r.text
    meta = r.json()["meta"]
    # bound 8 * 10 = 80 characters: documents 0 and 2 are cut to 80 and then tie on 1/80 (by index)
    assert [x["index"] for x in r.json()["results"]] == [1, 0, 2]
    assert meta["raw_scores"] == pytest.approx([1 / 50, 1 / 80, 1 / 80])
    scores = [x["relevance_score"] for x in r.json()["results"]]
    assert scores[0] > scores[1] == pytest.approx(scores[2])  # the tie is kept
    assert meta["truncated"] == 2 and meta["doc_tokens"] == 10
    assert meta["warnings"] == [
        "documents 0, 2 are longer than 80 characters; each was ranked on its first 10 LM tokens (max_tokens_per_doc)"
    ]


def test_body_over_the_byte_limit_is_still_413(settings, pipeline):
    settings = settings.model_copy(update={"max_body_bytes": 100_000})
    with TestClient(create_app(settings, pipeline=pipeline)) as c:
        r = c.post("/rerank", json={"query": "q", "documents": ["w" * 125_000]})
        assert "over the limit of 100000 bytes" in _error(r, 413, "payload_too_large")


def test_fusion_with_the_given_order_is_an_extension_field(client, monkeypatch):
    """``fusion`` says how the given order counts: by default as a position prior (counted
    only when the order agrees with the reranker more than chance), a number fuses the
    reranker with the given order by reciprocal rank, ``"none"`` is the reranker's own order."""
    import math

    from heedrank.fusion import fuse, reciprocal_ranks

    pure = client.post("/rerank", json={"query": "apples", "documents": DOCS}).json()
    assert pure["meta"].get("fusion") is None and [x["index"] for x in pure["results"]] == BY_LENGTH
    assert pure["meta"]["order_prior"] == 0.0  # the given order (longest first) disagrees with the fake
    fused = client.post("/rerank", json={"query": "apples", "documents": DOCS, "fusion": 0.9}).json()
    want = fuse(reciprocal_ranks(len(DOCS)), [1.0 / len(t) for t in DOCS], 0.9)
    order = sorted(range(len(DOCS)), key=lambda i: (-want[i], f"{i}"))
    assert fused["meta"]["fusion"] == 0.9 and [x["index"] for x in fused["results"]] == order
    assert "order_prior" not in fused["meta"]
    assert [x["relevance_score"] for x in fused["results"]] == pytest.approx(
        [1 / (1 + math.exp(-want[i])) for i in order])
    assert fused["meta"]["raw_scores"] == pytest.approx([1.0 / len(DOCS[i]) for i in order])
    # a method that records a fusion weight still gets the prior by default ("none" turns both off)
    monkeypatch.setattr(FakeReranker, "default_fusion", 0.9, raising=False)
    default = client.post("/rerank", json={"query": "apples", "documents": DOCS}).json()
    assert default["meta"].get("fusion") is None and default["meta"]["order_prior"] == 0.0
    assert [x["index"] for x in default["results"]] == BY_LENGTH
    off = client.post("/rerank", json={"query": "apples", "documents": DOCS, "fusion": "none"}).json()
    assert off["meta"].get("fusion") is None and [x["index"] for x in off["results"]] == BY_LENGTH
    assert "order_prior" not in off["meta"]
    # "none": the reranker's own scores (the fake has no score_scale: relevance_score is the raw score)
    assert [x["relevance_score"] for x in off["results"]] == pytest.approx([1.0 / len(DOCS[i]) for i in BY_LENGTH])
    null = client.post("/rerank", json={"query": "apples", "documents": DOCS, "fusion": None}).json()
    assert null["results"] == off["results"]
    assert _error(client.post("/rerank", json={"query": "apples", "documents": DOCS, "fusion": 1.5}),
                  422, "validation").startswith("fusion must be")


def test_the_default_prior_counts_an_order_that_agrees_with_the_reranker():
    """:class:`heedrank.serving.PositionPrior` itself: an order that agrees with the reranker (a
    first stage's) is worth up to ``weight``; a reversed or shuffled one nothing."""
    from heedrank.serving import PositionPrior

    prior = PositionPrior()
    agreeing = [1.0 / (1 + i) for i in range(10)]  # the reranker agrees with the given order
    assert prior.strength(agreeing) == pytest.approx(prior.weight)
    assert prior.strength(agreeing[::-1]) == 0.0
    assert prior.strength([0.3, 0.9, 0.1, 0.5, 0.7, 0.2, 0.8, 0.4, 0.6, 0.0]) == 0.0
    assert prior.strength([1.0]) == 0.0  # one document: no order


def test_rerank_default_prior_keeps_an_agreeing_order_but_not_over_a_confident_reranker(client):
    # documents sent about shortest first (the fake's own order): the order agrees, so it counts
    given = sorted(DOCS * 3, key=len)
    given = [f"{t} {i}" for i, t in enumerate(given)]  # distinct texts (identical ones would share a score)
    given[9], given[10] = given[10], given[9]  # 44 then 43 characters: a near tie the reranker reverses
    order, relevance, strength = _prior(given)
    assert strength == pytest.approx(PositionPrior().weight)
    body = client.post("/rerank", json={"query": "apples", "documents": given}).json()
    assert body["meta"]["order_prior"] == pytest.approx(strength) and body["meta"].get("fusion") is None
    assert [x["index"] for x in body["results"]] == order == list(range(len(given)))  # the prior breaks the near tie
    scores = [x["relevance_score"] for x in body["results"]]
    assert scores == pytest.approx(relevance) and scores == sorted(scores, reverse=True)  # the prior inside the score
    own = client.post("/rerank", json={"query": "apples", "documents": given, "fusion": "none"}).json()
    assert [x["index"] for x in own["results"]][9:11] == [10, 9]  # the reranker alone
    # a document the reranker is confident about ranks first although sent fourth
    confident = given[:3] + ["ok"] + given[3:]
    order, _, strength = _prior(confident)
    body = client.post("/rerank", json={"query": "apples", "documents": confident}).json()
    assert strength > 0 and body["meta"]["order_prior"] == pytest.approx(strength)
    assert [x["index"] for x in body["results"]] == order and order[0] == 3
    # the same documents reversed: the order disagrees and is ignored, the fake's order is served
    reverse = given[::-1]
    body = client.post("/rerank", json={"query": "apples", "documents": reverse}).json()
    assert body["meta"]["order_prior"] == 0.0
    raw = body["meta"]["raw_scores"]
    assert raw == sorted(raw, reverse=True)
    assert [x["index"] for x in body["results"]] == _prior(reverse)[0]


def test_identical_texts_share_one_score(client):
    docs = ["a medium document", "short", "a medium document", "tiny!", "a medium document"]
    for fusion in ("default", "none", 0.5):
        body = client.post("/rerank", json={"query": "apples", "documents": docs, "fusion": fusion}).json()
        scores = {}
        for x in body["results"]:
            scores.setdefault(docs[x["index"]], set()).add(round(x["relevance_score"], 12))
        assert all(len(v) == 1 for v in scores.values()), (fusion, body["results"])
        indices = [x["index"] for x in body["results"]]
        copies = [indices.index(i) for i in (0, 2, 4)]
        assert copies == list(range(min(copies), min(copies) + 3)), fusion  # together, in index order
        assert [x["index"] for x in body["results"] if x["index"] in (0, 2, 4)] == [0, 2, 4]


def test_cutoff_returns_the_documents_above_the_calibrated_probability(client, monkeypatch):
    """``cutoff`` (heedrank extension): only documents whose calibrated probability is at least
    the threshold ("auto": the map's); with a calibration, relevance_score IS that probability
    (meta.calibrated; there is no separate ``probability``); a reranker without a calibration,
    or a fusion weight it was not fitted at, is a 422."""
    import math

    from heedrank.calibration import Calibration, PlattMap
    from heedrank.fusion import fuse, reciprocal_ranks

    body = {"query": "apples", "documents": DOCS}
    plain = client.post("/rerank", json=body).json()
    assert "probability" not in plain["results"][0] and plain["meta"]["calibrated"] is False  # the fake has none
    assert "no calibrated scores" in _error(client.post("/rerank", json={**body, "cutoff": "auto"}), 422, "validation")
    assert _error(client.post("/rerank", json={**body, "cutoff": 3}), 422, "validation").startswith("cutoff must be")
    plat = PlattMap((2.0, 0.0, 0.0, 0.0), 0.0, 0.5)
    monkeypatch.setattr(FakeReranker, "calibration", Calibration(0.9, {"rank": plat}), raising=False)
    full = client.post("/rerank", json={**body, "fusion": 0.9}).json()
    want = fuse(reciprocal_ranks(len(DOCS)), [1.0 / len(t) for t in DOCS], 0.9)
    order = sorted(range(len(DOCS)), key=lambda i: (-want[i], f"{i}"))
    probs = [1 / (1 + math.exp(-2.0 * want[i])) for i in order]
    assert all(set(x) == {"index", "relevance_score"} for x in full["results"])  # no `probability` field
    assert [x["relevance_score"] for x in full["results"]] == pytest.approx(probs) and "cutoff" not in full["meta"]
    assert full["meta"]["calibrated"] is True and "score_scale" not in full["meta"]
    cut = client.post("/rerank", json={**body, "fusion": 0.9, "cutoff": "auto"}).json()
    assert cut["meta"]["cutoff"] == 0.5
    assert [x["index"] for x in cut["results"]] == [i for i, p in zip(order, probs) if p >= 0.5]
    assert all(x["relevance_score"] >= 0.5 for x in cut["results"])
    assert 0 < len(cut["results"]) < len(DOCS)
    assert not any("extrapolate" in w for w in cut["meta"].get("warnings") or [])
    # fewer documents than the map was fitted at: the answer says its probabilities extrapolate
    monkeypatch.setattr(FakeReranker, "calibration", Calibration(0.9, {"rank": PlattMap(
        plat.coef, plat.intercept, plat.threshold, (len(DOCS) + 1, 50))}), raising=False)
    few = client.post("/rerank", json={**body, "fusion": 0.9, "cutoff": "auto"}).json()
    assert [x["index"] for x in few["results"]] == [x["index"] for x in cut["results"]]
    assert any(f"with {len(DOCS)} its probabilities extrapolate" in w for w in few["meta"]["warnings"])
    assert "got fusion none" in _error(client.post("/rerank", json={**body, "fusion": "none", "cutoff": 0.2}),
                                       422, "validation")
    # the default (the position prior) is calibrated by the reranker's own map ("none") too
    assert "got fusion none" in _error(client.post("/rerank", json={**body, "cutoff": 0.2}), 422, "validation")
    # without a map for the weight used, there is no calibration: relevance_score is as before
    uncal = client.post("/rerank", json=body).json()
    assert uncal["meta"]["calibrated"] is False and "score_scale" not in uncal["meta"]
    assert [x["relevance_score"] for x in uncal["results"]] == pytest.approx(uncal["meta"]["raw_scores"])


def test_default_prior_with_a_calibration_serves_the_reranker_s_own_probability(client, monkeypatch):
    """With the default fusion (the position prior) and a calibration, relevance_score is the
    probability (the "none" map) of the served score, the prior inside it: with a prior of
    strength 0 the reranker's own, and sorted best first whatever the prior did; the cut-off keeps
    the documents at or above the threshold, a prefix of the served order."""
    from heedrank.calibration import Calibration, PlattMap
    from heedrank.fusion import standardize_list

    plat = PlattMap((2.0, -0.5, 0.0, 0.0), 0.0, 0.5)
    monkeypatch.setattr(FakeReranker, "calibration", Calibration(None, {"none": plat}), raising=False)
    own = sorted(DOCS, key=len)  # the fake's own order of texts ("short" and "tiny!" tie: kept in DOCS order)
    raw_desc = sorted((1.0 / len(t) for t in DOCS), reverse=True)
    want = dict(zip(BY_LENGTH, plat.probabilities(standardize_list(raw_desc))))
    body = client.post("/rerank", json={"query": "apples", "documents": DOCS}).json()
    assert body["meta"]["calibrated"] is True and "score_scale" not in body["meta"]
    assert "order_prior" in body["meta"] and body["meta"].get("fusion") is None
    got = {x["index"]: x["relevance_score"] for x in body["results"]}
    assert got == pytest.approx(want)
    assert all(set(x) == {"index", "relevance_score"} for x in body["results"])
    # sent in the fake's order (the prior now counts): the probability of the served score
    sent = [own[i] for i in (0, 2, 1, 3)]  # the tied "short" and "tiny!" still sent in that order
    again = client.post("/rerank", json={"query": "apples", "documents": sent}).json()
    assert again["meta"]["order_prior"] > 0
    served = PositionPrior().scores([1.0 / len(t) for t in sent])
    order = sorted(range(len(sent)), key=lambda i: -served[i])
    by_text = dict(zip((sent[i] for i in order), plat.probabilities([served[i] for i in order])))
    assert {sent[x["index"]]: x["relevance_score"] for x in again["results"]} == pytest.approx(by_text)
    assert [x["index"] for x in again["results"]] == order
    scores = [x["relevance_score"] for x in again["results"]]
    assert scores == sorted(scores, reverse=True)
    # the cut-off uses the probability
    threshold = sorted(want.values())[1]
    cut = client.post("/rerank", json={"query": "apples", "documents": DOCS, "cutoff": threshold}).json()
    assert cut["meta"]["cutoff"] == pytest.approx(threshold)
    assert {x["index"] for x in cut["results"]} == {i for i, p in want.items() if p >= threshold}
    assert [x["index"] for x in cut["results"]] == [x["index"] for x in body["results"] if want[x["index"]] >= threshold]


def test_search_and_rerank_serve_one_list_with_the_same_probabilities(client, monkeypatch):
    """One serving policy (:class:`heedrank.serving.ServePolicy`): the same candidates sent
    through /search (from its first stage) and through /rerank (as a list, in the first stage's
    order) get the same calibrated probability each, by the same map and the same function."""
    from api_fakes import DOCS as INDEXED
    from api_fakes import OverlapRetriever

    from heedrank.calibration import Calibration, PlattMap
    from heedrank.types import Query

    plat = PlattMap((1.5, -0.3, 0.2, 0.1), -0.4, 0.5)
    monkeypatch.setattr(FakeReranker, "calibration", Calibration(0.9, {"none": plat}), raising=False)
    query = "apples fruit"
    search = client.post("/search", json={"query": query, "top_k": 8, "retriever": "bm25",
                                          "rerank": {"method": "fake", "candidates": 8, "fusion": "none"}})
    assert search.status_code == 200, search.text
    probs_search = {h["doc_id"]: h["score"] for h in search.json()["results"]}
    assert search.json()["rerank"]["calibrated"] is True
    assert len(probs_search) == 8 and all(0.0 < p < 1.0 for p in probs_search.values())
    order = list(OverlapRetriever(INDEXED).retrieve([Query("q", query)], 8)[0].doc_ids)
    assert set(order) == set(probs_search)
    texts = {d.doc_id: d.content for d in INDEXED}
    rerank = client.post("/rerank", json={"query": query, "documents": [texts[d] for d in order], "fusion": "none"})
    assert rerank.status_code == 200, rerank.text
    assert rerank.json()["meta"]["calibrated"] is True
    # relevance_score is the calibrated probability (no separate `probability` field)
    probs_rerank = {order[r["index"]]: r["relevance_score"] for r in rerank.json()["results"]}
    assert all("probability" not in r for r in rerank.json()["results"])
    assert probs_rerank == pytest.approx(probs_search, abs=1e-12)
    assert len(set(round(p, 9) for p in probs_rerank.values())) > 1  # the map separates the documents
    # the default fusion (the position prior) gives each document the same probability
    default = client.post("/rerank", json={"query": query, "documents": [texts[d] for d in order]})
    assert default.status_code == 200, default.text
    probs_default = {order[r["index"]]: r["relevance_score"] for r in default.json()["results"]}
    assert probs_default == pytest.approx(probs_search, abs=1e-12)

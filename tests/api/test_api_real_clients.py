"""Requests that real clients make, against a real server (uvicorn on a loopback port,
:mod:`live_server`): clients that hang up, HEAD and CORS, invented
methods in the metrics, and the official Cohere SDK, v2 and v1."""

from __future__ import annotations

import logging
import math
import re
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from api_fakes import DOCS, BatchedReranker, FakeReranker
from heedrank.api.app import create_app
from live_server import serve
from heedrank.reranker.base import SCORE_SCALES

httpx = pytest.importorskip("httpx")


def _metric_lines(base: str) -> list[str]:
    return [line for line in httpx.get(f"{base}/metrics", trust_env=False).text.splitlines()
            if line.startswith("heedrank_requests_total{")]


def _count(lines: list[str], **labels: str) -> float:
    total = 0.0
    for line in lines:
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


# -------------------------------------------------------------------- hang-ups
def test_clients_that_hang_up_are_499_and_free_the_worker_at_the_next_batch(settings, pipeline, caplog):
    """Four /rerank clients give up after 1 s (40 new documents each, 8 batches of 0.4 s): the
    queued jobs are dropped, the started one stops at its next batch, /metrics holds no 5xx,
    the log has no traceback, and the next request waits less than one batch."""
    BatchedReranker.batch_size, BatchedReranker.batch_seconds = 5, 0.4
    settings = settings.model_copy(update={"rerank_method": "batched", "workers": 1, "queue_size": 8})
    docs = [f"new document number {i} about apples and orchards" for i in range(40)]
    with caplog.at_level(logging.INFO), serve(create_app(settings, pipeline=pipeline)) as base:

        def hang_up(i: int) -> str:
            try:
                httpx.post(f"{base}/rerank", json={"query": f"apples {i}", "documents": docs}, timeout=1.0,
                           trust_env=False)
            except httpx.TimeoutException:
                return "gave up"
            return "answered"

        with ThreadPoolExecutor(4) as ex:
            assert list(ex.map(hang_up, range(4))) == ["gave up"] * 4
        deadline = time.monotonic() + 10
        while _count(_metric_lines(base), route="/rerank", status="499") < 4:
            assert time.monotonic() < deadline, _metric_lines(base)
            time.sleep(0.05)

        r = httpx.post(f"{base}/rerank", json={"query": "apples", "documents": ["short", "a longer one"]},
                       timeout=30, trust_env=False)
        assert r.status_code == 200, r.text
        waited = r.json()["meta"]["timings"]["queue"]
        assert waited < BatchedReranker.batch_seconds, f"the next request waited {waited:.2f} s"

        lines = _metric_lines(base)
        assert _count(lines, route="/rerank", status="499") == 4
        assert not [line for line in lines if re.search(r'status="5\d\d"', line)], lines
    assert BatchedReranker.calls == 2  # the first hung-up job and the last request: the 3 queued ones never ran
    # the started job stopped at the batch after its client was seen gone (1 s + at most one
    # 0.5 s poll: by its 5th batch of 0.4 s) instead of running its 8; the last request: 1 batch
    print(f"batches scored: {BatchedReranker.batches}")
    assert BatchedReranker.batches <= 5 + 1
    assert not [rec for rec in caplog.records if "Exception in ASGI application" in rec.getMessage()]
    gone = [rec for rec in caplog.records if "client closed the connection" in rec.getMessage()]
    assert len([rec for rec in gone if rec.name == "heedrank.api.middleware"]) == 4
    assert all(rec.levelno == logging.INFO and rec.exc_info is None for rec in gone)
    assert any("job stopped after" in rec.getMessage() for rec in caplog.records)


def test_a_search_client_that_hangs_up_is_499(settings, pipeline):
    settings = settings.model_copy(update={"rerank_method": "batched", "workers": 1})
    BatchedReranker.batch_size, BatchedReranker.batch_seconds = 1, 0.5  # 4 candidates: 2 s
    with serve(create_app(settings, pipeline=pipeline)) as base:
        with pytest.raises(httpx.TimeoutException):
            httpx.post(f"{base}/search", json={"query": "apples", "rerank": {"method": "batched"}}, timeout=0.6,
                       trust_env=False)
        deadline = time.monotonic() + 10
        while _count(_metric_lines(base), route="/search", status="499") < 1:
            assert time.monotonic() < deadline, _metric_lines(base)
            time.sleep(0.05)
        assert not [line for line in _metric_lines(base) if re.search(r'status="5\d\d"', line)]
    assert BatchedReranker.batches < 4


# -------------------------------------------------------------------- HEAD, CORS
@pytest.mark.parametrize("path", ["/health", "/", "/ui", "/info", "/metrics", "/docs", "/redoc", "/openapi.json",
                                  "/documents/d01", "/ui/app.js", "/ui/app.css", "/docs/oauth2-redirect",
                                  "/static-offline-docs/swagger-ui.css"])
def test_every_get_route_answers_head(client, path):
    get, head = client.get(path), client.head(path)
    assert get.status_code == 200, get.text
    assert head.status_code == 200 and head.content == b""
    assert head.headers["content-type"] == get.headers["content-type"]
    if path not in ("/metrics", "/info"):  # their bodies change between two requests
        assert head.headers["content-length"] == get.headers["content-length"]


def _get_paths(routes) -> set[str]:
    out: set[str] = set()
    for r in routes:
        inner = getattr(r, "original_router", None)  # an included router (FastAPI >= 0.16x keeps them nested)
        if inner is not None:
            out |= _get_paths(inner.routes)
        elif "GET" in (getattr(r, "methods", None) or ()):
            out.add(r.path)
    return out


def test_every_get_route_of_the_app_is_covered_by_the_head_test(client):
    tested = {"/health", "/", "/ui", "/info", "/metrics", "/docs", "/redoc", "/openapi.json",
              "/documents/{doc_id:path}", "/ui/app.js", "/ui/app.css", "/docs/oauth2-redirect"}
    gets = _get_paths(client.app.routes)
    assert "/health" in gets and "/documents/{doc_id:path}" in gets
    assert gets <= tested, gets - tested


def test_head_keeps_errors_and_metrics_label_it_head(client):
    r = client.head("/search")  # a POST route: 405 as for GET, with Allow
    assert r.status_code == 405 and r.headers["allow"] == "POST" and r.content == b""
    assert client.head("/nope").status_code == 404
    assert client.head("/documents/nope").status_code == 404
    metrics = client.get("/metrics").text
    assert 'heedrank_requests_total{method="HEAD",route="/documents/{doc_id:path}",status="404"} 1.0' in metrics


def test_head_through_a_real_server(settings, pipeline):
    with serve(create_app(settings, pipeline=pipeline)) as base:
        for path in ("/health", "/", "/info"):
            r = httpx.head(f"{base}{path}", trust_env=False)
            assert r.status_code == 200 and r.content == b"", (path, r.status_code)
            assert int(r.headers["content-length"]) > 0


def test_cors_is_off_by_default(client):
    r = client.options("/search", headers={"Origin": "https://app.example.org", "Access-Control-Request-Method": "POST"})
    assert "access-control-allow-origin" not in r.headers
    assert "access-control-allow-origin" not in client.get("/health", headers={"Origin": "https://x.org"}).headers


def test_cors_preflight_and_answers_for_allowed_origins(settings, pipeline):
    from fastapi.testclient import TestClient
    from pydantic import SecretStr

    settings = settings.model_copy(update={"cors_origins": ["https://app.example.org"], "api_key": SecretStr("k")})
    with TestClient(create_app(settings, pipeline=pipeline)) as c:
        assert c.app.state.runtime.wait_ready(10)
        pre = c.options("/search", headers={"Origin": "https://app.example.org", "Access-Control-Request-Method": "POST",
                                            "Access-Control-Request-Headers": "authorization, content-type"})
        assert pre.status_code == 200, pre.text  # no API key on a preflight
        assert pre.headers["access-control-allow-origin"] == "https://app.example.org"
        assert "POST" in pre.headers["access-control-allow-methods"]
        assert {"authorization", "content-type"} <= {h.strip().lower() for h in
                                                     pre.headers["access-control-allow-headers"].split(",")}
        ok = c.post("/search", json={"query": "apples"},
                    headers={"Origin": "https://app.example.org", "Authorization": "Bearer k"})
        assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == "https://app.example.org"
        denied = c.post("/search", json={"query": "apples"}, headers={"Origin": "https://app.example.org"})
        assert denied.status_code == 401 and denied.headers["access-control-allow-origin"] == "https://app.example.org"
        other = c.options("/search", headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"})
        assert other.status_code == 400 and "access-control-allow-origin" not in other.headers


# -------------------------------------------------------------------- bounded method label
def test_invented_methods_fold_into_one_label(settings, pipeline):
    with serve(create_app(settings, pipeline=pipeline)) as base:
        before = _metric_lines(base)
        with httpx.Client(base_url=base, trust_env=False) as http:
            for i in range(20):
                r = http.request(f"BREW{i}", "/search")
                assert r.status_code == 405
        after = _metric_lines(base)
    new = [line for line in after if line.split(" ")[0] not in {b.split(" ")[0] for b in before}]
    methods = {re.search(r'method="([^"]*)"', line).group(1) for line in after}
    assert not [m for m in methods if m.startswith("BREW")]
    assert len(new) <= 2, new  # one series for the 20 invented methods (+ the first /metrics itself)
    assert _count(after, method="other", route="/search", status="405") == 20


def test_method_label_function():
    from heedrank.api.middleware import method_label

    assert [method_label(m) for m in ("GET", "HEAD", "POST", "DELETE", "OPTIONS", "PATCH")] == [
        "GET", "HEAD", "POST", "DELETE", "OPTIONS", "PATCH"]
    assert {method_label(m) for m in ("BREW", "get", "PROPFIND", "X" * 1000)} == {"other"}


# -------------------------------------------------------------------- the Cohere SDK
class UnboundedReranker(FakeReranker):
    """Scores like ICR's calibrated attention mass (real numbers around 0, from -0.9 to 1.4
    for DOCS' texts: longer = lower) with ICR's ``score_scale``, so that /rerank maps its
    scores to [0, 1]. Registered as ``"unbounded"``."""

    name = "unbounded"
    score_scale = SCORE_SCALES["icr"]

    def rerank(self, query, candidates):
        from dataclasses import replace

        from heedrank.types import Ranking

        rr = super().rerank(query, candidates)
        scores = {d.doc_id: 1.4 - len(d.content) / 25 for d in candidates}
        return replace(rr, ranking=Ranking.from_scores(query.query_id, scores))

    def describe(self):
        return {"method": "icr", "model": "none", "options": {}}


@pytest.fixture
def cohere_server(settings, pipeline, monkeypatch):
    pytest.importorskip("cohere")
    from pydantic import SecretStr

    from heedrank import registry

    monkeypatch.setitem(registry._RERANKERS, "unbounded", UnboundedReranker)
    settings = settings.model_copy(update={"rerank_method": "unbounded", "api_key": SecretStr("co-key"),
                                           "model_aliases": {"rerank-v3.5": "unbounded"}})
    with serve(create_app(settings, pipeline=pipeline), ready=False) as base:
        deadline = time.monotonic() + 30
        while httpx.get(f"{base}/health", trust_env=False).status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        yield base


TEXTS = [d.text for d in DOCS[:6]]
ORDER = sorted(range(len(TEXTS)), key=lambda i: (len(TEXTS[i]), i))  # shorter first: UnboundedReranker's order


def _expected(i: int) -> float:
    raw = 1.4 - len(TEXTS[i]) / 25
    return 1 / (1 + math.exp(-raw / SCORE_SCALES["icr"]))


def test_cohere_sdk_v2_client(cohere_server):
    import cohere

    co = cohere.ClientV2(api_key="co-key", base_url=cohere_server)
    res = co.rerank(model="rerank-v3.5", query="apples", documents=TEXTS, top_n=4)
    assert [r.index for r in res.results] == ORDER[:4]
    scores = [r.relevance_score for r in res.results]
    assert all(0.0 <= s <= 1.0 for s in scores) and scores == sorted(scores, reverse=True)
    assert scores == pytest.approx([_expected(i) for i in ORDER[:4]])
    raw = res.meta.model_extra["raw_scores"] if res.meta.model_extra else None  # our extension, kept by the SDK
    assert raw == pytest.approx([1.4 - len(TEXTS[i]) / 25 for i in ORDER[:4]])
    assert min(raw) < 0 < max(raw)  # raw scores outside [0, 1] ...
    assert res.meta.api_version.version == "2"
    assert not res.meta.warnings  # an aliased id: no warning
    # the default fusion is the position prior; uncalibrated: relevance_score from the raw score and its scale
    assert res.meta.model_extra["calibrated"] is False and res.meta.model_extra["score_scale"] == SCORE_SCALES["icr"]
    assert "order_prior" in res.meta.model_extra and res.meta.model_extra.get("fusion") is None


def test_cohere_sdk_v1_client(cohere_server):
    import cohere

    co = cohere.Client(api_key="co-key", base_url=cohere_server)
    res = co.rerank(model="rerank-v3.5", query="apples", documents=TEXTS, return_documents=True)
    assert [r.index for r in res.results] == ORDER
    assert [r.document.text for r in res.results] == [TEXTS[i] for i in ORDER]
    assert all(0.0 <= r.relevance_score <= 1.0 for r in res.results)
    assert res.meta.api_version.version == "1"


def test_cohere_sdk_errors_are_its_own(cohere_server):
    import cohere
    from cohere.core.api_error import ApiError

    co = cohere.ClientV2(api_key="co-key", base_url=cohere_server)
    # every model id is served now: the ids clients send silently, any other one with a warning
    res = co.rerank(model="rerank-english-v2.0", query="apples", documents=TEXTS)
    assert [r.index for r in res.results] == ORDER and not res.meta.warnings
    res = co.rerank(model="my-own-reranker", query="apples", documents=TEXTS)
    assert [r.index for r in res.results] == ORDER
    assert any("'my-own-reranker' is not a model id of this service" in w for w in res.meta.warnings)
    assert res.meta.model_extra["method"] == "unbounded"
    with pytest.raises(ApiError) as err:
        cohere.ClientV2(api_key="co-key", base_url=cohere_server).rerank(
            model="rerank-v3.5", query="apples", documents=TEXTS, top_n=0)
    assert err.value.status_code == 422 and "top_n" in err.value.body["error"]
    with pytest.raises(ApiError) as err:
        cohere.ClientV2(api_key="wrong", base_url=cohere_server).rerank(
            model="rerank-v3.5", query="apples", documents=TEXTS)
    assert err.value.status_code == 401


def test_cohere_sdk_against_the_real_icr_reranker(tmp_path):
    """The SDK against the packaged LM's ICR: relevance_score in [0, 1], in ICR's order, the
    logistic of the raw score (which lies outside [0, 1])."""
    cohere = pytest.importorskip("cohere")
    pytest.importorskip("torch")
    import json

    from heedrank.index.builder import build_index
    from heedrank.settings import Settings

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"_id": "d1", "title": "", "text": "unused"}) + "\n", encoding="utf-8")
    build_index(corpus, tmp_path / "index", dense=False, show_progress=False)
    settings = Settings(index=str(tmp_path / "index"), rerank_method="icr", warmup=False, max_doc_tokens=48,
                        model_aliases={"rerank-v3.5": "icr"})
    docs = ["At sea level, pure water boils at 100 degrees Celsius.",
            "Cats are small domesticated carnivorous mammals kept as pets.",
            "Tea is brewed by pouring hot or boiling water over leaves.",
            "Rome is the capital city of Italy."]
    with serve(create_app(settings)) as base:
        res = cohere.ClientV2(api_key="unused", base_url=base, timeout=300).rerank(
            model="rerank-v3.5", query="What is the boiling point of water?", documents=docs)
    scores = [r.relevance_score for r in res.results]
    raw = res.meta.model_extra["raw_scores"]
    assert sorted(r.index for r in res.results) == [0, 1, 2, 3] and res.results[0].index == 0
    assert all(0.0 < s < 1.0 for s in scores) and scores == sorted(scores, reverse=True)
    assert raw == sorted(raw, reverse=True) and not all(0.0 <= r <= 1.0 for r in raw)
    # relevance reads the served score: the reranker's own r less the position prior in r's units,
    # r - sd(r) * strength * log(1 + position) (heedrank.serving.ZFusion), so it follows the order
    strength = res.meta.model_extra["order_prior"]
    sd = statistics.pstdev(raw)
    served = [r - sd * strength * math.log1p(res.results[k].index) for k, r in enumerate(raw)]
    assert scores == pytest.approx([1 / (1 + math.exp(-v / SCORE_SCALES["icr"])) for v in served])
    assert res.meta.model_extra["score_scale"] == SCORE_SCALES["icr"]


@pytest.mark.parametrize(
    ("method", "options", "scale"),
    [
        ("icr", {}, 0.3),
        ("blockrank-cached", {"scoring": "learned"}, 1.0),
        ("blockrank-cached", {"scoring": "calibrated"}, 0.03),
        ("blockrank", {"scoring": "calibrated"}, 0.03),
        ("blockrank", {"scoring": "signal"}, None),  # probabilities: kept
        ("blockrank-cached", {"scoring": "signal"}, None),
    ],
)
def test_the_score_scale_is_the_rerankers(method, options, scale):
    """The scale of /rerank's relevance_score is the reranker's own (``score_scale``), not a route's table."""
    from heedrank import registry
    from heedrank.config import RerankerConfig
    from heedrank.serving import ServePolicy

    reranker = registry.reranker_class(method)(RerankerConfig(method=method, options=options))  # loads no model
    assert reranker.score_scale == scale
    assert ServePolicy.of(reranker, fusion=None).scale == scale
    assert ServePolicy.of(reranker, fusion=None, scale=2.0).scale == (None if scale is None else 2.0)
    assert ServePolicy.of(reranker, fusion=0.5).scale == 1.0  # fused scores are z-scores


def test_relevance_scores_are_in_0_1_monotone_and_per_document():
    from heedrank.serving import ZFusion

    raw = [1e6, 3.1, 1.36, 0.2, 0.0, -0.91, -1e6]
    rel = ZFusion(scale=0.3).relevance(raw)
    assert all(0.0 <= r <= 1.0 for r in rel) and rel == sorted(rel, reverse=True)
    assert rel[4] == 0.5 and rel[0] == 1.0 and rel[-1] == 0.0
    assert ZFusion(scale=0.3).relevance([1.36]) == [rel[2]]  # a document's score does not depend on the others
    assert ZFusion().relevance([0.7, 0.2]) == [0.7, 0.2]


def test_a_client_that_hangs_up_while_sending_its_body_is_499(client, caplog):
    """A disconnect in the middle of the body (FastAPI's generic 400 otherwise) is the client's doing."""
    sent: list[dict] = []
    incoming = iter([{"type": "http.request", "body": b'{"query": "app', "more_body": True},
                     {"type": "http.disconnect"}])

    async def receive():
        return next(incoming)

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/search", "raw_path": b"/search", "root_path": "", "query_string": b"",
             "headers": [(b"content-type", b"application/json"), (b"content-length", b"100")],
             "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 80), "app": client.app}
    with caplog.at_level(logging.INFO, logger="heedrank.api.app"):
        client.portal.call(client.app, scope, receive, send)
    assert sent[0]["status"] == 499
    assert b'"error_type":"client_closed"' in sent[1]["body"]
    assert any("client closed the connection while sending" in r.getMessage() and r.levelno == logging.INFO
               for r in caplog.records)
    assert 'method="POST",route="/search",status="499"' in client.get("/metrics").text

"""The search page in a real browser: Debian's ``chromium`` driven by Playwright for Python
(``executable_path``; Playwright's own browser download is never used), against a real
server (uvicorn in a thread on 127.0.0.1, a free port) over a small BM25 index directory,
with an API key and a fake reranker that explains (evidence spans on the query's words).

The tests type queries, wait for results and compare what the page shows with the API's
own answer to the same request (sent directly): highlighted substrings against
``text[start:end]`` of each evidence span, rank moves against ``first_stage_rank``, filter
errors against the API's 422 message; they add, open and delete a document through the
panel, and use the page with the keyboard alone in a narrow window.

Without playwright or a chromium executable the tests skip, saying why; with the ``CI``
environment variable set that is a failure instead. ``HEEDRANK_CHROMIUM`` names the
browser executable (default: ``chromium`` on the PATH). ``HEEDRANK_UI_SCREENSHOT=PATH``
saves the results page's screenshot there (``docs/search-page.png`` in the README).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import threading
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from api_fakes import FakeReranker

KEY = "ui-test-key"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")

CORPUS = [
    {"_id": "a01", "title": "Apples", "text": "Apples are red or green fruit grown in orchards.",
     "metadata": {"year": 2020, "tags": ["fruit"]}},
    {"_id": "a02", "title": "Apple taste", "text": "Green apples taste sour; red apples taste sweet.",
     "metadata": {"year": 2021}},
    {"_id": "a03", "title": "Orchard 🍎 notes",
     "text": "🍎🍏 Crisp apples from the orchard, picked in 🇫🇷 autumn; apples keep for months.",
     "metadata": {"year": 2023, "tags": ["orchard", "emoji"]}},
    {"_id": "a04", "title": "Proverb",
     "text": "An apple a day keeps the doctor away, says an old proverb about fruit and orchards.",
     "metadata": {"year": 2019}},
    {"_id": "a05", "title": "Orchards", "text": "Orchards grow apples, pears and plums.",
     "metadata": {"year": 2022, "tags": ["orchard"]}},
    {"_id": "a06", "title": "<i>Markup</i> & apples",
     "text": 'Untrusted <b>bold</b> <img src=x onerror="window.__pwned=1"> text about apples.',
     "metadata": {"year": 2024, "note": "<script>window.__pwned=2</script>"}},
    {"_id": "a07", "title": "Pears", "text": "Pears are sweet fruit related to apples.", "metadata": {"year": 2021}},
    {"_id": "a08", "title": "Bananas", "text": "Bananas are yellow fruit.", "metadata": {"year": 2018}},
    {"_id": "a09", "title": "Cider", "text": "Cider is made from fermented apples in Normandy orchards.",
     "metadata": {"year": 2018, "tags": ["drink"]}},
    {"_id": "a10", "title": "Grapes", "text": "Grapes grow in vineyards.", "metadata": {"year": 2017}},
    {"_id": "a11", "title": "Apple pie", "text": "Apple pie is a baked dessert with apples and cinnamon.",
     "metadata": {"year": 2016}},
    {"_id": "a12", "title": "", "text": "Citrus fruit such as oranges are rich in vitamin C.", "metadata": {}},
]


class SpanReranker(FakeReranker):
    """The API tests' fake reranker (shorter documents first, so ranks move) with
    ``rerank_with_evidence``: every word of the title or text that starts like a query word
    is a span, scored higher the earlier it comes. Registered as ``"spans"``."""

    name = "spans"

    def rerank_with_evidence(self, query, candidates, *, max_spans: int = 3):
        from heedrank.types import EvidenceSpan

        rr = self.rerank(query, candidates)
        stems = {w.lower()[:5] for w in re.findall(r"\w+", query.text) if len(w) > 2}
        evidence = {}
        for d in candidates:
            spans = []
            for field in ("title", "text"):
                for m in re.finditer(r"\w+", getattr(d, field)):
                    if len(m.group()) > 2 and m.group().lower()[:5] in stems:
                        spans.append(EvidenceSpan(field, m.start(), m.end(), m.group(), round(1 / (1 + m.start() / 8), 4)))
            evidence[d.doc_id] = sorted(spans, key=lambda s: -s.score)[:max_spans]
        return replace(rr, evidence=evidence)


def _browser_or_skip() -> str:
    """The chromium executable; skips (fails under ``CI``) when it or playwright is missing."""
    reason = None
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        reason = "playwright is not installed (pip install playwright, or bash scripts/setup.sh)"
    exe = os.environ.get("HEEDRANK_CHROMIUM") or next(filter(None, map(shutil.which, BROWSERS)), None)
    if reason is None and (exe is None or not os.access(exe, os.X_OK)):
        reason = ("no chromium executable (apt-get install chromium, or set HEEDRANK_CHROMIUM)"
                  if exe is None else f"HEEDRANK_CHROMIUM={exe} is not an executable")
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"the browser tests cannot run and CI is set: {reason}", pytrace=False)
        pytest.skip(reason)
    return exe


def test_the_browser_is_available():
    """Skips with the reason when chromium or playwright is missing; under ``CI`` fails."""
    assert os.access(_browser_or_skip(), os.X_OK)


def test_a_missing_browser_skips_but_fails_under_ci(monkeypatch):
    monkeypatch.setenv("HEEDRANK_CHROMIUM", "/nonexistent/chromium")
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="not an executable"):
        _browser_or_skip()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI is set"):
        _browser_or_skip()


@dataclass
class UI:
    base: str
    http: Any  # httpx.Client with the API key
    browser: Any
    index_dir: Path


def _serve(app):
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="ui-test-server")
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise AssertionError("the test server did not start")
        time.sleep(0.02)
    return server, thread, sock, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def ui(tmp_path_factory):
    exe = _browser_or_skip()
    import httpx
    from playwright.sync_api import expect, sync_playwright

    from heedrank import registry
    from heedrank.api.app import create_app
    from heedrank.index.builder import build_index
    from heedrank.settings import Settings

    root = tmp_path_factory.mktemp("ui")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in CORPUS), encoding="utf-8")
    build_index(corpus, root / "index", dense=False, show_progress=False)

    expect.set_options(timeout=10_000)
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(registry._RERANKERS, "spans", SpanReranker)
        settings = Settings(index=str(root / "index"), rerank_method="spans", api_key=KEY, warmup=False,
                            max_top_k=20, max_candidates=10, default_candidates=8, search_workers=1)
        server, thread, sock, base = _serve(create_app(settings))
        http = httpx.Client(base_url=base, headers={"Authorization": f"Bearer {KEY}"}, trust_env=False, timeout=30)
        try:
            deadline = time.monotonic() + 30
            while http.get("/health").json().get("status") != "ok":
                assert time.monotonic() < deadline, "the fake reranker never became ready"
                time.sleep(0.05)
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=exe,
                                             args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
                try:
                    yield UI(base, http, browser, root / "index")
                finally:
                    browser.close()
        finally:
            http.close()
            server.should_exit = True
            thread.join(15)
            sock.close()


@pytest.fixture
def page(ui):
    context = ui.browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    console_errors: list[str] = []
    page.on("pageerror", lambda exc: console_errors.append(str(exc)))
    yield page
    context.close()
    assert not console_errors, f"JavaScript errors on the page: {console_errors}"


def _open(page, ui, key: str | None = KEY):
    from playwright.sync_api import expect

    page.goto(f"{ui.base}/ui")
    if key is not None:
        page.fill("#api-key", key)
        page.press("#api-key", "Enter")
        expect(page.locator("#service")).to_contain_text("status ok")


def _search(page, query: str):
    """Types ``query``, presses Enter; returns the JSON body the page sent to /search."""
    from playwright.sync_api import expect

    page.fill("#q", query)
    with page.expect_response(lambda r: r.url.endswith("/search")) as resp:
        page.press("#q", "Enter")
    request = resp.value.request
    assert request.headers.get("authorization") == f"Bearer {KEY}"
    expect(page.locator("#results")).not_to_have_attribute("aria-busy", "true")
    return request.post_data_json


def _shown_ids(page) -> list[str]:
    return page.locator("#results > li.hit").evaluate_all("els => els.map(e => e.dataset.docId)")


def test_results_highlight_the_evidence_spans_at_the_api_offsets(page, ui, tmp_path):
    from playwright.sync_api import expect

    _open(page, ui)
    sent = _search(page, "apples orchard")
    assert sent["rerank"] == {"method": "spans"} and sent["explain"] is True and sent["top_k"] == 10
    api = ui.http.post("/search", json=sent)
    assert api.status_code == 200, api.text
    api = api.json()
    hits = api["results"]
    expect(page.locator("#results > li.hit")).to_have_count(len(hits))
    assert _shown_ids(page) == [h["doc_id"] for h in hits]

    spans_seen = moves_seen = 0
    for hit in hits:
        item = page.locator(f'#results > li.hit[data-doc-id="{hit["doc_id"]}"]')
        expect(item.locator(".rank")).to_have_text(f"#{hit['rank']}")
        expect(item.locator(".doc-id")).to_have_text(hit["doc_id"])
        assert item.locator(".hit-text").text_content() == hit["text"]  # the whole text, as text
        for field, where in (("text", ".hit-text"), ("title", ".hit-title")):
            want = sorted((e["start"], e["end"], hit[field][e["start"]:e["end"]])
                          for e in hit["evidence"] or [] if e["field"] == field)
            marks = item.locator(f"{where} mark.ev").evaluate_all(
                "els => els.map(e => [+e.dataset.start, +e.dataset.end, e.textContent])")
            assert [tuple(m) for m in marks] == want, (hit["doc_id"], field)
            spans_seen += len(want)
        if hit["first_stage_rank"] != hit["rank"]:
            expect(item.locator(".move")).to_contain_text(f"{hit['first_stage_rank']} → {hit['rank']}")
            moves_seen += 1
        else:
            expect(item.locator(".move")).to_have_count(0)
    assert spans_seen >= 10 and moves_seen >= 2
    # code-point offsets: the emoji document's spans sit after astral characters
    emoji_marks = page.locator('li[data-doc-id="a03"] .hit-text mark').all_text_contents()
    assert emoji_marks and set(emoji_marks) <= {"apples", "orchard"}
    # shades follow the span scores
    levels = page.locator("mark.ev").evaluate_all("els => els.map(e => [+e.dataset.score, +e.dataset.level])")
    assert {lv for _, lv in levels} >= {1, 5}
    best = max(levels)[1]
    assert best == 5 and all(lv <= best for _, lv in levels)

    # untrusted markup stays text
    markup = page.locator('li[data-doc-id="a06"]')
    expect(markup.locator(".hit-text")).to_contain_text('<b>bold</b> <img src=x onerror="window.__pwned=1">')
    expect(markup.locator(".hit-title")).to_contain_text("<i>Markup</i> & apples")
    expect(markup.locator(".metadata")).to_contain_text("<script>window.__pwned=2</script>")
    assert page.locator("#results b, #results img, #results i, #results script").count() == 0
    assert page.evaluate("window.__pwned") is None

    # timings and reranker info
    for stage in ("queue", "retrieve", "hydrate", "rerank"):
        expect(page.locator(f'#timing-legend li[data-stage="{stage}"]')).to_contain_text(f"{stage} ")
    expect(page.locator("#timing-bar > span")).to_have_count(4)
    expect(page.locator('#rerank-info dd[data-key="method"]')).to_have_text("spans")
    expect(page.locator('#rerank-info dd[data-key="candidates"]')).to_have_text(str(api["rerank"]["candidates"]))
    truncated, doc_tokens = api["rerank"]["truncated"], api["rerank"]["doc_tokens"]
    assert truncated > 0, "the fake reports long documents as truncated (a count)"
    assert doc_tokens == 160  # the service's budget for a method without its own
    expect(page.locator('#rerank-info dd[data-key="read"]')).to_have_text(
        f"the first {doc_tokens} tokens of each document; {truncated} of {api['rerank']['candidates']} are longer")
    expect(page.locator('#rerank-info dd[data-key="truncated"]')).to_have_count(0)  # no list of ids any more
    expect(page.locator('#rerank-info dd[data-key="doc tokens"]')).to_have_count(0)
    expect(page.locator("#status")).to_contain_text(f"{len(hits)} results for “apples orchard”")

    page.locator("#results").scroll_into_view_if_needed()
    page.evaluate("window.scrollTo(0, 0)")
    shot = tmp_path / "search-page.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    if os.environ.get("HEEDRANK_UI_SCREENSHOT"):
        target = Path(os.environ["HEEDRANK_UI_SCREENSHOT"])
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, target)


def test_a_bad_filter_shows_the_api_message_inline(page, ui):
    from playwright.sync_api import expect

    _open(page, ui)
    page.fill("#q", "apples")
    bad = {"must": [{"key": "year", "range": {"from": 2015}}]}
    page.fill("#filter", json.dumps(bad))
    with page.expect_response(lambda r: r.url.endswith("/search")) as resp:
        page.press("#filter", "Control+Enter")  # Ctrl+Enter in the filter searches
    assert resp.value.status == 422
    api = ui.http.post("/search", json={"query": "apples", "filter": bad})
    assert api.status_code == 422
    message = api.json()["error"]
    assert message.startswith("filter.must[0].range")
    box = page.locator("#filter-error")
    expect(box).to_be_visible()
    expect(box.locator(".emsg")).to_have_text(message)
    expect(box.locator(".etype")).to_have_text("validation")
    expect(page.locator("#filter")).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#error")).to_be_hidden()

    # invalid JSON is caught before any request
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url) if r.url.endswith("/search") else None)
    page.fill("#filter", '{"must": [')
    page.press("#q", "Enter")
    expect(box).to_contain_text("the filter is not valid JSON")
    assert requests == []

    # a good filter clears the message and filters the results
    page.fill("#filter", json.dumps({"must": [{"key": "year", "range": {"gte": 2022}}]}))
    sent = _search(page, "apples")
    expect(box).to_be_hidden()
    expect(page.locator("#filter")).not_to_have_attribute("aria-invalid", "true")
    want = [h["doc_id"] for h in ui.http.post("/search", json=sent).json()["results"]]
    assert want and set(want) <= {"a03", "a05", "a06"}
    expect(page.locator("#results > li.hit")).to_have_count(len(want))
    assert _shown_ids(page) == want


def test_the_document_panel_adds_opens_and_deletes(page, ui):
    from playwright.sync_api import expect

    _open(page, ui)
    status, error = page.locator("#doc-status"), page.locator("#doc-error")

    page.fill("#doc-id", "ui-kiwi")
    page.fill("#doc-title", "Kiwi")
    page.fill("#doc-text", "Kiwifruit has fuzzy brown skin and green flesh.")
    page.fill("#doc-metadata", "{not json")
    page.press("#doc-title", "Enter")  # Enter submits: Save
    expect(page.locator("#doc-metadata-error")).to_contain_text("the metadata is not valid JSON")
    page.fill("#doc-metadata", '{"year": 2026, "tags": ["ui"]}')
    with page.expect_response(lambda r: r.url.endswith("/documents")) as resp:
        page.click("#doc-save")
    assert resp.value.request.headers.get("authorization") == f"Bearer {KEY}"
    expect(status).to_contain_text("Added ui-kiwi in default")
    expect(page.locator("#doc-metadata-error")).to_be_hidden()
    assert ui.http.get("/documents/ui-kiwi").json()["metadata"] == {"year": 2026, "tags": ["ui"]}

    _search(page, "kiwifruit fuzzy")
    expect(page.locator("#results > li.hit").first).to_have_attribute("data-doc-id", "ui-kiwi")
    expect(page.locator("#results > li.hit").first.locator(".hit-text mark.ev")).to_have_text(["Kiwifruit", "fuzzy"])

    for field in ("#doc-id", "#doc-title", "#doc-text", "#doc-metadata"):
        page.fill(field, "")
    page.locator("#results > li.hit").first.locator(".open-doc").press("Enter")  # a hit into the panel
    expect(page.locator("#doc-id")).to_be_focused()
    expect(page.locator("#doc-id")).to_have_value("ui-kiwi")
    expect(page.locator("#doc-title")).to_have_value("Kiwi")
    for field in ("#doc-title", "#doc-text", "#doc-metadata"):
        page.fill(field, "")
    page.click("#doc-open")
    expect(status).to_contain_text("Opened ui-kiwi")
    expect(page.locator("#doc-title")).to_have_value("Kiwi")
    expect(page.locator("#doc-text")).to_have_value("Kiwifruit has fuzzy brown skin and green flesh.")
    assert json.loads(page.input_value("#doc-metadata")) == {"year": 2026, "tags": ["ui"]}

    page.click("#doc-delete")
    expect(status).to_contain_text("Deleted ui-kiwi from default")
    assert ui.http.get("/documents/ui-kiwi").status_code == 404
    _search(page, "kiwifruit fuzzy")
    assert "ui-kiwi" not in _shown_ids(page)

    page.click("#doc-open")
    api = ui.http.get("/documents/ui-kiwi").json()
    expect(error).to_be_visible()
    expect(error.locator(".etype")).to_have_text("not_found")
    expect(error.locator(".emsg")).to_have_text(api["error"])


def test_api_errors_are_shown_as_the_api_gives_them(page, ui):
    from playwright.sync_api import expect

    err = page.locator("#error")
    _open(page, ui, key=None)  # no key yet: /info is refused
    unauthorized = ui.http.get("/info", headers={"Authorization": ""}).json()
    expect(err.locator(".etype")).to_have_text("unauthorized")
    expect(err.locator(".emsg")).to_have_text(unauthorized["error"])
    expect(err).to_contain_text("Enter the service's API key")
    page.fill("#q", "apples")
    page.press("#q", "Enter")
    expect(err.locator(".etype")).to_have_text("unauthorized")

    page.fill("#api-key", KEY)
    page.press("#api-key", "Enter")
    expect(page.locator("#service")).to_contain_text("status ok")
    expect(err).to_be_hidden()
    assert page.evaluate("sessionStorage.getItem('heedrank.apiKey')") == KEY
    assert page.evaluate("localStorage.length") == 0 and page.context.cookies() == []

    # a 422 from the service, word for word
    page.fill("#top-k", "999")
    sent = _search(page, "apples")
    api = ui.http.post("/search", json=sent)
    assert api.status_code == 422
    expect(err.locator(".etype")).to_have_text("validation")
    expect(err.locator(".emsg")).to_have_text(api.json()["error"])
    page.fill("#top-k", "10")

    # 429 with Retry-After (the service's body, served by the browser's router)
    overloaded = {"error": "the rerank queue is full (8 waiting); retry later", "error_type": "overloaded"}
    page.route("**/search", lambda route: route.fulfill(
        status=429, headers={"Retry-After": "7"}, content_type="application/json", body=json.dumps(overloaded)))
    page.fill("#q", "apples")
    page.press("#q", "Enter")
    expect(err.locator(".etype")).to_have_text("overloaded")
    expect(err.locator(".emsg")).to_have_text(overloaded["error"])
    expect(err.locator(".retry")).to_have_text("Retry after 7 s.")

    # not JSON (a proxy's page) and no answer at all: still a message, never a blank page
    page.unroute("**/search")
    page.route("**/search", lambda route: route.fulfill(status=502, content_type="text/html",
                                                          body="<html><b>Bad gateway</b></html>"))
    page.press("#q", "Enter")
    expect(err.locator(".etype")).to_have_text("http_502")
    expect(err.locator(".emsg")).to_have_text("<html><b>Bad gateway</b></html>")
    page.unroute("**/search")
    page.route("**/search", lambda route: route.abort())
    page.press("#q", "Enter")
    expect(err.locator(".etype")).to_have_text("network_error")
    page.unroute("**/search")
    _search(page, "apples")
    expect(err).to_be_hidden()
    expect(page.locator("#results > li.hit").first).to_be_visible()


def test_the_cutoff_is_sent_and_its_probabilities_shown(page, ui):
    from playwright.sync_api import expect

    err = page.locator("#error")
    _open(page, ui)
    page.select_option("#cutoff", "auto")
    sent = _search(page, "apples")
    assert sent["rerank"] == {"method": "spans", "cutoff": "auto"}
    api = ui.http.post("/search", json=sent)  # the fake reranker has no calibration: the service says so
    assert api.status_code == 422
    expect(err.locator(".emsg")).to_have_text(api.json()["error"])

    # a calibrated reranker's answer (the service's own body, given probabilities and a threshold)
    answer = ui.http.post("/search", json={**sent, "rerank": {"method": "spans"}}).json()
    answer["results"] = answer["results"][:3]
    for hit, p in zip(answer["results"], (0.81, 0.42, 0.2)):
        hit["score"] = p
    answer["rerank"]["cutoff"] = 0.12
    answer["rerank"]["calibrated"] = True
    page.route("**/search", lambda route: route.fulfill(status=200, content_type="application/json",
                                                          body=json.dumps(answer)))
    page.select_option("#cutoff", "0.3")
    sent = _search(page, "apples")
    assert sent["rerank"]["cutoff"] == 0.3
    expect(err).to_be_hidden()
    expect(page.locator("#results .probability")).to_have_text(["0.81", "0.42", "0.20"])
    expect(page.locator("#status")).to_contain_text("3 results for “apples”")
    expect(page.locator("#status")).to_contain_text("cut off at P(relevant) ≥ 0.12")
    expect(page.locator('#rerank-info dd[data-key="cutoff"]')).to_have_text("0.12")
    page.unroute("**/search")
    # the Reranker select names the first stage alone and the service's method
    labels = dict(page.locator("#method option").evaluate_all("els => els.map(e => [e.value, e.textContent])"))
    assert labels["none"] == "none (first stage only)" and labels["spans"] == "spans (the service's)"
    page.select_option("#method", "none")
    expect(page.locator("#cutoff")).to_be_disabled()
    sent = _search(page, "apples")
    assert sent["rerank"] is False  # the service reranks unless asked not to
    expect(page.locator('#rerank-info dd[data-key="method"]')).to_have_text("none (first-stage order)")
    api = ui.http.post("/search", json=sent).json()
    assert api["rerank"] is None and _shown_ids(page) == [h["doc_id"] for h in api["results"]]


def test_keyboard_only_in_a_narrow_window(ui):
    from playwright.sync_api import expect

    context = ui.browser.new_context(viewport={"width": 360, "height": 740}, is_mobile=True, has_touch=True)
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(f"{ui.base}/")
        expect(page.locator("#q")).to_be_focused()  # the query box has focus at start
        # every form control has a label
        unlabeled = page.evaluate("""() => [...document.querySelectorAll('input, select, textarea')]
            .filter(e => !e.labels || e.labels.length === 0).map(e => e.id)""")
        assert unlabeled == []
        for region in ("#status", "#doc-status"):
            assert page.get_attribute(region, "role") == "status"
        for region in ("#error", "#filter-error", "#doc-error"):
            assert page.get_attribute(region, "role") == "alert"

        # focus order, backwards from the query box to the top, then forwards through the form
        def walk(key, n):
            out = []
            for _ in range(n):
                page.keyboard.press(key)
                out.append(page.evaluate("document.activeElement.id || document.activeElement.className"))
            return out

        assert walk("Shift+Tab", 4) == ["key-forget", "key-save", "api-key", "skip"]
        assert walk("Tab", 15) == ["api-key", "key-save", "key-forget", "q", "search-btn", "collection", "retriever",
                                   "method", "candidates", "fusion", "cutoff", "top-k", "explain", "filter", "doc-id"]
        # focus is visible
        page.focus("#q")
        page.keyboard.press("Shift+Tab")
        page.keyboard.press("Tab")
        assert page.evaluate("getComputedStyle(document.activeElement).outlineStyle") == "solid"

        # key, query and search with the keyboard only
        page.keyboard.press("Shift+Tab")  # back to "Forget"
        page.keyboard.press("Shift+Tab")
        page.keyboard.press("Shift+Tab")  # the key field
        expect(page.locator("#api-key")).to_be_focused()
        page.keyboard.type(KEY)
        page.keyboard.press("Enter")
        expect(page.locator("#service")).to_contain_text("status ok")
        for _ in range(3):
            page.keyboard.press("Tab")
        expect(page.locator("#q")).to_be_focused()
        page.keyboard.type("apples orchard")
        page.keyboard.press("Enter")
        expect(page.locator("#status")).to_contain_text("results for “apples orchard”")
        expect(page.locator("#results > li.hit").first).to_be_visible()

        # nothing wider than the window; the panel stacks under the results
        assert page.evaluate("document.documentElement.scrollWidth") <= 360
        results_box = page.locator("#results").bounding_box()
        panel_box = page.locator(".panel").bounding_box()
        assert panel_box["y"] > results_box["y"] and panel_box["width"] <= 360
        assert not errors, f"JavaScript errors on the page: {errors}"
    finally:
        context.close()


def test_the_status_line_says_how_many_were_reranked_and_why_the_others_were_not(page, ui):
    from playwright.sync_api import expect

    _open(page, ui)
    answer = ui.http.post("/search", json={"query": "apples", "top_k": 8, "rerank": {"method": "spans"}}).json()
    n = answer["rerank"]["candidates"]
    cold = dict(answer, rerank={**answer["rerank"], "reranked": n - 3, "skipped_cold": 3})
    page.route("**/search", lambda route: route.fulfill(status=200, content_type="application/json",
                                                          body=json.dumps(cold)))
    _search(page, "apples")
    expect(page.locator("#status")).to_contain_text(
        f"reranked {n - 3} of {n} by spans; 3 kept their first-stage places: not yet in the store")
    page.unroute("**/search")
    # the default's scorer (calibrated) places the unread ones from its other signals, with a probability
    scored = dict(cold, rerank={**cold["rerank"], "calibrated": True},
                  results=[{**h, "score": 0.5, "reranked": i > 0} for i, h in enumerate(cold["results"])])
    page.route("**/search", lambda route: route.fulfill(status=200, content_type="application/json",
                                                          body=json.dumps(scored)))
    _search(page, "apples")
    expect(page.locator("#status")).to_contain_text(
        f"reranked {n - 3} of {n} by spans; 3 not read by the LM (not yet in the store), scored from the other signals")
    expect(page.locator(".not-reranked").first).to_have_text("not read by the LM")
    expect(page.locator('#rerank-info dd[data-key="reranked"]')).to_contain_text("scored from the other signals")
    page.unroute("**/search")
    budget = dict(answer, rerank={**answer["rerank"], "reranked": 0, "skipped_cold": 0, "warnings": [
        "reranking stopped after 20.0 s (the service's per-request budget is 20 s, HEEDRANK_REQUEST_BUDGET_S): "
        "every candidate kept its first-stage place"]})
    page.route("**/search", lambda route: route.fulfill(status=200, content_type="application/json",
                                                          body=json.dumps(budget)))
    _search(page, "apples")
    expect(page.locator("#status")).to_contain_text(
        f"reranked 0 of {n} by spans; {n} kept their first-stage places: the reranking ran past the service's "
        "time budget")
    expect(page.locator('#rerank-info dd[data-key="reranked"]')).to_contain_text("every candidate kept")
    page.unroute("**/search")
    _search(page, "apples")  # the service's own answer: every candidate reranked
    expect(page.locator("#status")).to_contain_text(f"reranked {n} of {n} by spans (")

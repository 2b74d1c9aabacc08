"""The search page against the demo's own configuration, in a real browser:
``scripts/demo.sh``'s service (the default method: cached BlockRank with the learned head
weights and the packaged query adapter, fused with the first stage; hybrid first stage;
the index's document KV store filled before serving) over the first 40 real NFCorpus
documents. Typing a query gives highlighted results from the method that ranks, no error.

Skips without chromium/playwright (fails under ``CI``), as ``test_ui_browser.py``.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from test_ui_browser import _browser_or_skip, _serve

pytest.importorskip("torch")


@pytest.fixture(scope="module")
def demo(tmp_path_factory, nfcorpus_head):
    exe = _browser_or_skip()
    import httpx
    from playwright.sync_api import sync_playwright

    from heedrank.api.app import create_app
    from heedrank.config import RerankerConfig
    from heedrank.index.builder import build_index
    from heedrank.index.kv import build_index_blocks
    from heedrank.index.store import Index
    from heedrank.registry import build_reranker
    from heedrank.settings import Settings

    root = tmp_path_factory.mktemp("demo")
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"_id": d.doc_id, "title": d.title, "text": d.text}) + "\n"
                              for d in nfcorpus_head), encoding="utf-8")
    build_index(corpus, root / "index", dense=True, show_progress=False)
    ix = Index.open(root / "index")  # what the demo does before serving: `heedrank index kv build`
    try:
        build_index_blocks(ix, build_reranker(RerankerConfig(method="default", options={"query_adapter": None})))
    finally:
        ix.close()
    # the demo's settings: the defaults, with the hybrid first stage (HEEDRANK_DEFAULT_RETRIEVER=hybrid)
    settings = Settings(index=str(root / "index"), default_retriever="hybrid", warmup=False)
    server, thread, sock, base = _serve(create_app(settings))
    http = httpx.Client(base_url=base, trust_env=False, timeout=120)
    try:
        deadline = time.monotonic() + 300
        while http.get("/health").json().get("status") != "ok":
            assert time.monotonic() < deadline, "the default reranker never became ready"
            time.sleep(0.2)
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=exe,
                                         args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
            try:
                yield base, http, browser
            finally:
                browser.close()
    finally:
        http.close()
        server.should_exit = True
        thread.join(15)
        sock.close()


def test_the_page_searches_with_the_default_configuration_and_highlights_evidence(demo) -> None:
    from playwright.sync_api import expect

    base, http, browser = demo
    expect.set_options(timeout=120_000)
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(f"{base}/")
        expect(page.locator("#service")).to_contain_text("status ok")
        assert page.locator("#method").input_value() == "default"
        assert page.locator("#retriever").input_value() == "hybrid"
        assert page.locator("#explain").is_checked() and page.locator("#explain").is_enabled()
        assert page.locator("#fusion").input_value() == "default"
        page.fill("#q", "vitamin d and bone fractures")
        with page.expect_response(lambda r: r.url.endswith("/search")) as resp:
            page.press("#q", "Enter")
        assert resp.value.status == 200, resp.value.text()
        sent = resp.value.request.post_data_json
        assert sent["rerank"] == {"method": "default"} and sent["explain"] is True and sent["retriever"] == "hybrid"
        expect(page.locator("#results")).not_to_have_attribute("aria-busy", "true")
        expect(page.locator("#error")).to_be_hidden()
        api = resp.value.json()
        card = json.loads((Path(__file__).resolve().parents[2] / "reranker" / "data"
                           / "smollm2-135m-instruct.blockrank-cached.json").read_text())
        assert "scorer" in card  # the default is served by the card's scorer: no fusion weight
        assert api["rerank"]["method"] == "blockrank-cached" and api["rerank"].get("fusion") is None
        expect(page.locator("#status")).to_contain_text(" by default (blockrank-cached)")  # the alias, resolved
        expect(page.locator('#rerank-info dd[data-key="method"]')).to_have_text("default (blockrank-cached)")
        hits = api["results"]
        expect(page.locator("#results > li.hit")).to_have_count(len(hits))
        marks = 0
        for hit in hits:
            item = page.locator(f'#results > li.hit[data-doc-id="{hit["doc_id"]}"]')
            for field, where in (("text", ".hit-text"), ("title", ".hit-title")):
                want = sorted((e["start"], e["end"], hit[field][e["start"]:e["end"]])
                              for e in hit["evidence"] or [] if e["field"] == field)
                for e in hit["evidence"] or []:
                    assert hit[e["field"]][e["start"]:e["end"]] == e["text"]
                shown = item.locator(f"{where} mark.ev").evaluate_all(
                    "els => els.map(e => [+e.dataset.start, +e.dataset.end, e.textContent])")
                assert [tuple(m) for m in shown] == want, (hit["doc_id"], field)
                marks += len(want)
        assert marks >= len(hits)  # highlighted results
    finally:
        context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def test_a_search_before_info_answers_reranks_with_the_services_choices(demo) -> None:
    """A user who searches before ``GET /info`` has filled the selects (a slow first load) gets the
    service's defaults: the request names no retriever and no method, so the service reranks."""
    from playwright.sync_api import expect

    base, http, browser = demo
    context = browser.new_context()
    page = context.new_page()
    held: list = []
    page.route("**/info", lambda route: held.append(route))  # /info never answers during the search
    try:
        page.goto(f"{base}/")
        assert page.locator("#method").input_value() == "" and page.locator("#retriever").input_value() == ""
        page.fill("#q", "vitamin d and bone fractures")
        with page.expect_response(lambda r: r.url.endswith("/search")) as resp:
            page.press("#q", "Enter")
        sent = resp.value.request.post_data_json
        assert "retriever" not in sent and sent["rerank"] == {} and resp.value.status == 200
        assert resp.value.json()["rerank"]["method"] == "blockrank-cached"
        expect(page.locator("#error")).to_be_hidden()
    finally:
        for route in held:
            route.abort()
        context.close()

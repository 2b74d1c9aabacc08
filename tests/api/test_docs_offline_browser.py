"""``/docs`` (Swagger UI) and ``/redoc`` on a machine without internet access: a
real browser (Debian's chromium driven by Playwright, as in ``test_ui_browser.py``) opens them
against a real server while every request to another host is refused, and sees the API's
operations listed. Their scripts and styles come from the installed ``fastapi-offline``
package, never from a CDN.

Without playwright or chromium the browser tests skip (under ``CI`` they fail), as the search
page's do."""

from __future__ import annotations

import re
from urllib.parse import urlparse

import pytest

from heedrank.api.app import create_app
from live_server import serve
from test_ui_browser import _browser_or_skip

OPERATIONS = ["/search", "/rerank", "/v2/rerank", "/v1/rerank", "/documents", "/health", "/info"]


def test_docs_pages_reference_no_other_host(client):
    for path in ("/docs", "/redoc"):
        html = client.get(path).text
        urls = re.findall(r"""(?:src|href)=["']([^"']+)["']|url:\s*["']([^"']+)["']""", html)
        assert urls, html
        for found in (u for pair in urls for u in pair if u):
            assert not urlparse(found).netloc, f"{path} loads {found} from another host"
    assert client.get("/static-offline-docs/swagger-ui-bundle.js").status_code == 200
    assert client.get("/static-offline-docs/redoc.standalone.js").status_code == 200


@pytest.fixture(scope="module")
def browser():
    exe = _browser_or_skip()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=exe, args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        try:
            yield b
        finally:
            b.close()


def _offline_page(browser, outside: list[str]):
    """A page whose requests to any host but the loopback test server are aborted (and recorded)."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})

    def only_loopback(route):
        if urlparse(route.request.url).hostname in ("127.0.0.1", "localhost"):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    context.route("**/*", only_loopback)
    return context, context.new_page()


def test_swagger_ui_lists_the_operations_offline(browser, settings, pipeline):
    from playwright.sync_api import expect

    outside: list[str] = []
    errors: list[str] = []
    with serve(create_app(settings, pipeline=pipeline)) as base:
        context, page = _offline_page(browser, outside)
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        try:
            page.goto(f"{base}/docs")
            paths = page.locator(".opblock-summary-path")
            expect(paths.first).to_be_visible(timeout=15_000)
            shown = {p.strip() for p in paths.all_inner_texts()}
            assert set(OPERATIONS) <= {re.sub(r"\s+", "", p) for p in shown}, shown
            expect(page.locator(".info .title")).to_contain_text("heedrank")
        finally:
            context.close()
    assert outside == [] and errors == []


def test_redoc_lists_the_operations_offline(browser, settings, pipeline):
    from playwright.sync_api import expect

    outside: list[str] = []
    errors: list[str] = []
    with serve(create_app(settings, pipeline=pipeline)) as base:
        context, page = _offline_page(browser, outside)
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        try:
            page.goto(f"{base}/redoc")
            expect(page.get_by_role("heading", name="Search a collection")).to_be_visible(timeout=15_000)
            for name in ("Rerank documents (Cohere v2 compatible)", "Add or replace documents",
                         "Rerank documents (Cohere v2 path, for Cohere's SDK: ClientV2)"):
                expect(page.get_by_role("heading", name=name)).to_be_attached()
            for tag in ("health", "info", "search", "rerank", "documents"):  # the menu lists every tag
                expect(page.get_by_role("menuitem", name=tag, exact=True)).to_be_visible()
        finally:
            context.close()
    # ReDoc's bundle itself links the image of its "API docs by Redocly" credit; the page works without it
    assert [u for u in outside if not u.endswith("cdn.redoc.ly/redoc/logo-mini.svg")] == [] and errors == []

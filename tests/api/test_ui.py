"""The search page's server side, without a browser: ``GET /`` and ``/ui`` serve the static
page and its assets (public even with an API key, with a strict CSP), the page's script
never writes HTML, and ``/search`` hits carry ``first_stage_rank`` (the "12 -> 2" moves).
The page itself is driven in chromium by ``test_ui_browser.py``."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from api_fakes import make_pipeline
from heedrank.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "api" / "static"


@pytest.fixture
def keyed_client(fake_reranker):
    from fastapi.testclient import TestClient

    from heedrank.api.app import create_app

    settings = Settings(index="unused", rerank_method="fake", warmup=False, api_key="s3cret",
                        max_top_k=20, max_candidates=8, default_candidates=4)
    with TestClient(create_app(settings, pipeline=make_pipeline())) as c:
        assert c.app.state.runtime.wait_ready(10)
        yield c


@pytest.mark.parametrize("path", ["/", "/ui"])
def test_page_is_served_with_a_strict_csp(client, path):
    r = client.get(path)
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/html; charset=utf-8"
    csp = r.headers["content-security-policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp and "'unsafe-inline'" not in csp
    assert r.headers["x-content-type-options"] == "nosniff"
    html = r.text
    # relative asset URLs (works behind a path prefix), no inline script or style
    assert 'src="ui/app.js"' in html and 'href="ui/app.css"' in html
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html), "inline <script> would be blocked by the CSP"
    assert " style=" not in html and "<style" not in html
    assert 'role="search"' in html and 'aria-live="polite"' in html and 'role="alert"' in html


@pytest.mark.parametrize(("path", "media_type"), [("/ui/app.js", "text/javascript"), ("/ui/app.css", "text/css")])
def test_assets_are_served(client, path, media_type):
    r = client.get(path)
    assert r.status_code == 200
    assert r.headers["content-type"].startswith(media_type)
    assert r.content == (STATIC / path.rsplit("/", 1)[1]).read_bytes()


def test_unknown_asset_is_the_api_404(client):
    r = client.get("/ui/other.js")
    assert r.status_code == 404 and r.json()["error_type"] == "not_found"


def test_page_is_public_but_the_api_still_needs_the_key(keyed_client):
    for path in ("/", "/ui", "/ui/app.js", "/ui/app.css"):
        assert keyed_client.get(path).status_code == 200, path
    assert keyed_client.get("/ui/other.js").status_code == 401  # only the page's own files are public
    r = keyed_client.get("/info")
    assert r.status_code == 401 and r.json()["error_type"] == "unauthorized"
    assert keyed_client.get("/info", headers={"Authorization": "Bearer s3cret"}).status_code == 200


def test_page_is_not_in_the_openapi_schema(client):
    paths = client.get("/openapi.json").json()["paths"]
    assert "/" not in paths and "/ui" not in paths and "/search" in paths


def test_script_never_writes_html():
    js = (STATIC / "app.js").read_text(encoding="utf-8")
    code = "\n".join(line for line in js.splitlines() if not line.lstrip().startswith("//"))
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"):
        assert sink not in code, f"app.js uses {sink}"


def test_static_files_are_package_data():
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = conf["tool"]["setuptools"]["package-data"]["heedrank.api"]
    for f in ("index.html", "app.js", "app.css"):
        assert any(Path("static", f).match(p) for p in patterns), f
    assert any(r.startswith("playwright") for r in conf["project"]["optional-dependencies"]["test"])


def test_hits_carry_their_first_stage_rank(client):
    body = {"query": "apples orchards", "top_k": 8, "rerank": {"method": "fake", "candidates": 6}}
    reranked = client.post("/search", json=body).json()["results"]
    first = client.post("/search", json={"query": "apples orchards", "top_k": 8, "rerank": False}).json()["results"]
    first_rank = {h["doc_id"]: h["rank"] for h in first}
    assert all(h["first_stage_rank"] == h["rank"] for h in first)
    assert [h["first_stage_rank"] for h in reranked] == [first_rank[h["doc_id"]] for h in reranked]
    assert any(h["first_stage_rank"] != h["rank"] for h in reranked)  # the fake reorders

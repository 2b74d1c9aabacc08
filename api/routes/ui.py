"""``GET /`` and ``GET /ui``: the search page (static HTML, CSS and plain JavaScript shipped
as package data in ``api/static/``, no build step), and its two assets under ``/ui/``.

The page calls the JSON API from the browser (``GET /info``, ``POST /search`` with
``explain``, ``/documents``) with relative URLs, so it also works behind a path prefix. It
holds no data itself, so it is served without the API key (:data:`UI_PATHS` are public in
:class:`heedrank.api.middleware.AuthMiddleware`); the key, when the service has one, is
typed into the page, kept in the tab's ``sessionStorage`` and sent as
``Authorization: Bearer <key>`` by its requests. A strict Content-Security-Policy (scripts,
styles and requests from this origin only, no inline script) backs up the page's rule of
putting untrusted document text on the page as text only.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import Response

router = APIRouter(tags=["ui"], include_in_schema=False)

STATIC_DIR = Path(__file__).resolve().parent.parent / "static"
"""The page's files (package data of ``heedrank.api``)."""

ASSETS = {"app.js": "text/javascript; charset=utf-8", "app.css": "text/css; charset=utf-8"}
"""Files served under ``/ui/``, with their media types."""

UI_PATHS = frozenset({"/", "/ui", *(f"/ui/{name}" for name in ASSETS)})
"""Paths of the page and its assets (served without the API key)."""

CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _read(name: str) -> bytes:
    return (STATIC_DIR / name).read_bytes()


def _file(name: str, media_type: str) -> Response:
    return Response(_read(name), media_type=media_type, headers=_HEADERS)


@router.get("/", summary="Search page")
@router.get("/ui", summary="Search page")
async def page() -> Response:
    """The search page."""
    return _file("index.html", "text/html; charset=utf-8")


@router.get("/ui/app.js")
async def script() -> Response:
    return _file("app.js", ASSETS["app.js"])


@router.get("/ui/app.css")
async def stylesheet() -> Response:
    return _file("app.css", ASSETS["app.css"])

"""The REST service: ``create_app()`` builds a FastAPI app over one or more collections.

Start-up (lifespan) opens every collection's index (``settings.index`` is the default
collection, ``settings.collections`` adds named ones; a missing index fails start-up),
starts the inference pools and loads the reranker's model in a background thread
(:mod:`attnrank.api.runtime`): until it is loaded ``/health`` says ``loading`` and compute routes
answer 503. ``app.state`` holds ``settings``, ``runtime`` and ``pipeline`` (the default
collection's). Every error has the body ``{"error": str, "error_type": str}``:

================================  ======  ======================================
cause                             status  error_type
================================  ======  ======================================
invalid body, top_k out of range  422     validation
missing / wrong API key           401     unauthorized
unknown collection, document      404     not_found
update of a read-only collection  409     index_mismatch
unknown route / wrong method      404/405 not_found / method_not_allowed
body, documents or text too big   413     payload_too_large
Content-Encoding not gzip/deflate 415     unsupported_media_type
corrupt compressed body           400     bad_request
inference queue full              429     overloaded (with ``Retry-After``)
models loading / load failed      503     unhealthy (with ``Retry-After``)
model cannot be loaded            503     model_unavailable
other ``AttnrankError``           theirs  theirs
anything else                     500     internal (logged with traceback)
================================  ======  ======================================

Request bodies may be sent compressed (``Content-Encoding: gzip`` or ``deflate``); the body
limit counts their decompressed bytes (:class:`attnrank.api.middleware.BodyLimitMiddleware`).
Every string of a request must be valid text and every document id a TREC-safe id
(:mod:`attnrank.textrules`), else 422 naming the field.

Routes: ``POST /search``, ``POST /rerank`` (Cohere v2 compatible), ``POST /documents``
(durable batch upsert), ``GET``/``DELETE /documents/{doc_id}``, ``GET /health``,
``GET /info``, ``GET /metrics`` (Prometheus), and the search page at ``GET /`` and ``GET /ui``
(:mod:`attnrank.api.routes.ui`). With ``settings.api_key`` set, every route but ``/health``
and the page needs ``Authorization: Bearer <key>``.

Run it with ``attnrank serve --index ...`` or ``uvicorn --factory api.app:create_app``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from collections.abc import Mapping

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from attnrank import __version__
from attnrank.errors import AttnrankError
from attnrank.pipeline import Pipeline
from attnrank.settings import Settings

logger = logging.getLogger(__name__)

_HTTP_ERROR_TYPES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}


def error_response(status_code: int, message: str, error_type: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """A JSON response with the error body ``{error, error_type}``."""
    return JSONResponse({"error": message, "error_type": error_type}, status_code=status_code, headers=headers)


def _field(loc: tuple[Any, ...] | list[Any]) -> str:
    """``("body", "documents", 3, "text")`` -> ``"documents[3].text"``."""
    parts = list(loc)
    if parts and parts[0] in ("body", "query", "path", "header", "cookie"):  # where, not which field
        parts = parts[1:]
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "body"


def validation_message(exc: RequestValidationError) -> str:
    """One line naming each invalid field, e.g. ``"top_k: Input should be greater than or equal to 1"``."""
    msgs = []
    for err in exc.errors():
        msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        if err.get("type") == "json_invalid":
            msgs.append(f"request body is not valid JSON: {err.get('ctx', {}).get('error', msg)}")
        elif err.get("type") == "missing" and len(err.get("loc", ())) <= 1:
            msgs.append("request body is required (JSON object)")
        elif err.get("type") == "model_attributes_type" and len(err.get("loc", ())) <= 1:
            msgs.append("request body must be a JSON object; send it with the header Content-Type: application/json")
        else:
            msgs.append(f"{_field(err.get('loc', ()))}: {msg}")
    return "; ".join(msgs) or "invalid request"


async def _attnrank_error(request: Request, exc: AttnrankError) -> JSONResponse:
    if exc.status_code >= 500 and exc.error_type != "unhealthy":
        logger.error("%s %s failed (%s): %s", request.method, request.url.path, exc.error_type, exc)
    return error_response(exc.status_code, str(exc), exc.error_type, headers=getattr(exc, "headers", None))


async def _request_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    return error_response(422, validation_message(exc), "validation")


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    error_type = _HTTP_ERROR_TYPES.get(exc.status_code, "internal" if exc.status_code >= 500 else "http_error")
    message = str(exc.detail)
    if exc.status_code == 404 and message == "Not Found":
        message = f"no route {request.method} {request.url.path}; see /docs"
    return error_response(exc.status_code, message, error_type, headers=getattr(exc, "headers", None))


async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
    logger.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, f"internal error ({type(exc).__name__}); see the server log", "internal")


def create_app(
    settings: Settings | None = None,
    pipeline: Pipeline | None = None,
    collections: Mapping[str, Pipeline] | None = None,
) -> FastAPI:
    """Build the FastAPI app.

    Args:
        settings: Service settings; default: ``Settings()`` (from ``ATTNRANK_*`` variables).
        pipeline: A ready pipeline to serve as the default collection instead of opening
            ``settings.index`` (tests, embedding in another service). ``settings.preload``
            still applies to it.
        collections: Ready pipelines of named collections (same use).

    Returns:
        The app; collections open when its lifespan starts (``with TestClient(app)`` or a
        server start-up), and start-up fails with the index error if one cannot; models
        then load in the background.
    """
    from attnrank.api.middleware import AuthMiddleware, BodyLimitMiddleware, MetricsMiddleware
    from attnrank.api.runtime import Runtime

    settings = settings or Settings()
    settings.collection_dirs()  # fail now on a collection named like the default one

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime = await anyio.to_thread.run_sync(Runtime.open, settings, pipeline, collections)
        runtime.start()
        app.state.runtime = runtime
        app.state.pipeline = runtime.pipeline(None)
        logger.info("attnrank service started: collections %s; models %s", sorted(runtime.collections), runtime.status)
        try:
            yield
        finally:
            app.state.pipeline = None
            await anyio.to_thread.run_sync(runtime.close)
            app.state.runtime = None

    app = FastAPI(
        title="attnrank",
        summary="Retrieval with attention-based in-context reranking.",
        version=__version__,
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.runtime = None
    app.add_exception_handler(AttnrankError, _attnrank_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _request_validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _internal_error)
    # Added innermost first: metrics see every answer, auth runs before the body is read.
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    if settings.api_key is not None:
        app.add_middleware(AuthMiddleware, api_key=settings.api_key.get_secret_value())
    app.add_middleware(MetricsMiddleware)

    from attnrank.api.routes import documents, health, info, metrics, rerank, search, ui

    for module in (health, info, metrics, search, rerank, documents, ui):
        app.include_router(module.router)
    return app


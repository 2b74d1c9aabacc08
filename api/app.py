"""The REST service: ``create_app()`` builds a FastAPI app over one or more collections.

Start-up (lifespan) opens every collection's index (``settings.index`` is the default
collection, ``settings.collections`` adds named ones; a missing index fails start-up),
starts the inference pools and loads the reranker's model in a background thread
(:mod:`heedrank.api.runtime`): until it is loaded ``/health`` says ``loading`` and compute routes
answer 503. ``app.state`` holds ``settings``, ``runtime`` and ``pipeline`` (the default
collection's). Every error has the body ``{"error": str, "error_type": str}``:

================================  ======  ======================================
cause                             status  error_type
================================  ======  ======================================
invalid body, top_k out of range  422     validation
body not UTF-8 JSON               400     bad_request
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
client closed the connection      499     client_closed (never read; logged at info)
other ``HeedrankError``           theirs  theirs
anything else                     500     internal (logged with traceback)
================================  ======  ======================================

A client that hangs up is not a server error: its request is counted as ``status="499"``
in ``/metrics`` and logged at info level without a traceback, its queued job is dropped and
its started reranking stops at the next layer (:mod:`heedrank.api.inference`), as a passed
``deadline_ms`` does.

Every ``GET`` route also answers ``HEAD`` (the same status and headers, no body:
:class:`heedrank.api.middleware.HeadMiddleware`), for load balancers and uptime checks. With
``settings.cors_origins`` set, pages served from those origins may call the API (CORS, with
preflight ``OPTIONS`` answered without the API key); it is off by default. ``/docs`` (Swagger
UI) and ``/redoc`` load their scripts and styles from the installed ``fastapi-offline``
package (under ``/static-offline-docs``), never from a CDN, so they work without internet.

Request bodies may be sent compressed (``Content-Encoding: gzip`` or ``deflate``); the body
limit counts their decompressed bytes (:class:`heedrank.api.middleware.BodyLimitMiddleware`).
Every string of a request must be valid text and every document id a TREC-safe id
(:mod:`heedrank.textrules`), else 422 naming the field.

Routes: ``POST /search``, ``POST /rerank`` (Cohere v2 compatible; also at ``/v2/rerank`` and
``/v1/rerank``, the paths Cohere's SDK posts to), ``POST /documents``
(durable batch upsert), ``GET``/``DELETE /documents/{doc_id}``, ``GET /health``,
``GET /info``, ``GET /metrics`` (Prometheus), and the search page at ``GET /`` and ``GET /ui``
(:mod:`heedrank.api.routes.ui`). With ``settings.api_key`` set, every route but ``/health``
and the page needs ``Authorization: Bearer <key>``.

Run it with ``heedrank serve --index ...`` or ``uvicorn --factory api.app:create_app``.
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
from starlette.requests import ClientDisconnect

from heedrank import __version__
from heedrank.config import NOISY_LOGGERS
from heedrank.errors import HeedrankError, ClientClosedError
from heedrank.pipeline import Pipeline
from heedrank.settings import Settings

logger = logging.getLogger(__name__)


class _HealthPolls(logging.Filter):
    """Drops uvicorn's access-log lines of ``GET /health`` (a load balancer or the demo script
    polls it once a second while the models load)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not (len(args) >= 3 and str(args[2]).startswith("/health"))


def quiet_library_logs() -> None:
    """Library log noise filtered: :data:`NOISY_LOGGERS` from WARNING up, health polls out of the
    access log. Idempotent."""
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, _HealthPolls) for f in access.filters):
        access.addFilter(_HealthPolls())

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


async def _heedrank_error(request: Request, exc: HeedrankError) -> JSONResponse:
    if isinstance(exc, ClientClosedError):
        logger.info("%s %s: %s", request.method, request.url.path, exc)
    elif exc.status_code >= 500 and exc.error_type != "unhealthy":
        logger.error("%s %s failed (%s): %s", request.method, request.url.path, exc.error_type, exc)
    return error_response(exc.status_code, str(exc), exc.error_type, headers=getattr(exc, "headers", None))


async def _request_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    return error_response(422, validation_message(exc), "validation")


def _body_problem(exc: StarletteHTTPException) -> str | None:
    """What FastAPI's generic 400 "error parsing the body" was about, or ``None``."""
    cause = exc.__cause__
    if isinstance(cause, UnicodeDecodeError):
        byte = cause.object[cause.start:cause.start + 1].hex()
        return (f"request body must be JSON encoded as UTF-8 (RFC 8259): byte 0x{byte} at offset {cause.start} is "
                f"not valid {cause.encoding.upper()}; re-encode the body as UTF-8 (e.g. a Latin-1 'é' is 0xe9, in "
                "UTF-8 it is 0xc3 0xa9)")
    if cause is not None:
        return f"request body could not be read as JSON ({type(cause).__name__}: {cause}); send a UTF-8 JSON object"
    return None


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    if isinstance(exc.__cause__, ClientDisconnect):  # hung up while its body was being read
        return await _heedrank_error(request, ClientClosedError("the client closed the connection while sending "
                                                                "its request body"))
    error_type = _HTTP_ERROR_TYPES.get(exc.status_code, "internal" if exc.status_code >= 500 else "http_error")
    message = str(exc.detail)
    if exc.status_code == 400 and message == "There was an error parsing the body":
        message = _body_problem(exc) or message
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
        settings: Service settings; default: ``Settings()`` (from ``HEEDRANK_*`` variables).
        pipeline: A ready pipeline to serve as the default collection instead of opening
            ``settings.index`` (tests, embedding in another service). ``settings.preload``
            still applies to it.
        collections: Ready pipelines of named collections (same use).

    Returns:
        The app; collections open when its lifespan starts (``with TestClient(app)`` or a
        server start-up), and start-up fails with the index error if one cannot; models
        then load in the background.
    """
    from fastapi_offline import FastAPIOffline

    from heedrank.api.middleware import (
        AuthMiddleware,
        BodyLimitMiddleware,
        ClientGoneMiddleware,
        HeadMiddleware,
        MetricsMiddleware,
    )
    from heedrank.api.runtime import Runtime, check_model_aliases

    settings = settings or Settings()
    settings.collection_dirs()  # fail now on a collection named like the default one
    check_model_aliases(settings)  # and on a model alias that maps to nothing served

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        quiet_library_logs()
        runtime = await anyio.to_thread.run_sync(Runtime.open, settings, pipeline, collections)
        runtime.start()
        app.state.runtime = runtime
        app.state.pipeline = runtime.pipeline(None)
        logger.info("heedrank service started: collections %s; models %s", sorted(runtime.collections), runtime.status)
        try:
            yield
        finally:
            app.state.pipeline = None
            await anyio.to_thread.run_sync(runtime.close)
            app.state.runtime = None

    # FastAPIOffline: /docs and /redoc with the Swagger UI and ReDoc assets of the installed
    # package (no CDN); no validator badge (it would call validator.swagger.io)
    app: FastAPI = FastAPIOffline(
        title="heedrank",
        summary="Retrieval with attention-based in-context reranking.",
        version=__version__,
        lifespan=lifespan,
        swagger_ui_parameters={"validatorUrl": None},
    )
    app.state.settings = settings
    app.state.runtime = None
    app.add_exception_handler(HeedrankError, _heedrank_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _request_validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _internal_error)
    # Added innermost first: metrics see every answer, CORS answers preflights before auth (a
    # browser sends no key with them) and adds its headers to every answer, auth runs before
    # the body is read, HEAD runs the GET route, a hung-up client's request ends as a 499.
    app.add_middleware(ClientGoneMiddleware)
    app.add_middleware(HeadMiddleware)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    if settings.api_key is not None:
        app.add_middleware(AuthMiddleware, api_key=settings.api_key.get_secret_value())
    if settings.cors_origins:
        from starlette.middleware.cors import CORSMiddleware

        app.add_middleware(
            CORSMiddleware, allow_origins=list(settings.cors_origins), allow_credentials=False,
            allow_methods=["GET", "HEAD", "POST", "DELETE", "OPTIONS"],
            allow_headers=["Authorization", "Content-Type", "Content-Encoding"],
            expose_headers=["Retry-After", "WWW-Authenticate"], max_age=600,
        )
    app.add_middleware(MetricsMiddleware)

    from heedrank.api.routes import documents, health, info, metrics, rerank, search, ui

    for module in (health, info, metrics, search, rerank, documents, ui):
        app.include_router(module.router)
    return app


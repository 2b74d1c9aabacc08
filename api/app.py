"""The REST service: ``create_app()`` builds a FastAPI app over one search pipeline.

Start-up (lifespan) opens the index and builds the :class:`~attnrank.pipeline.Pipeline`
from :class:`~attnrank.settings.Settings`, and with ``settings.preload`` loads the
reranker, all in a worker thread; ``app.state`` holds ``settings``, ``pipeline`` and
``limiter``. Every error has the body ``{"error": str, "error_type": str}``:

============================  ======  ===================================
cause                         status  error_type
============================  ======  ===================================
``AttnrankError`` subclasses  theirs  theirs (validation, not_found, ...)
invalid request body          422     validation
unknown route / method        404/405 not_found / method_not_allowed
anything else                 500     internal (logged with traceback)
============================  ======  ===================================

Run it with ``attnrank serve --index ...`` or ``uvicorn --factory api.app:create_app``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from attnrank.errors import AttnrankError
from attnrank.pipeline import NO_RERANK, Pipeline
from attnrank.settings import Settings

logger = logging.getLogger(__name__)

_HTTP_ERROR_TYPES = {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}


def error_response(status_code: int, message: str, error_type: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """A JSON response with the error body ``{error, error_type}``."""
    return JSONResponse({"error": message, "error_type": error_type}, status_code=status_code, headers=headers)


def _field(loc: tuple[Any, ...] | list[Any]) -> str:
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header", "cookie"):  # where, not which field
        parts = parts[1:]
    return ".".join(parts) or "body"


def validation_message(exc: RequestValidationError) -> str:
    """One line naming each invalid field, e.g. ``"top_k: Input should be greater than or equal to 1"``."""
    msgs = []
    for err in exc.errors():
        msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
        if err.get("type") == "json_invalid":
            msgs.append(f"request body is not valid JSON: {err.get('ctx', {}).get('error', msg)}")
        elif err.get("type") == "missing" and len(err.get("loc", ())) <= 1:
            msgs.append("request body is required (JSON object)")
        else:
            msgs.append(f"{_field(err.get('loc', ()))}: {msg}")
    return "; ".join(msgs) or "invalid request"


async def _attnrank_error(request: Request, exc: AttnrankError) -> JSONResponse:
    if exc.status_code >= 500:
        logger.error("%s %s failed (%s): %s", request.method, request.url.path, exc.error_type, exc)
    return error_response(exc.status_code, str(exc), exc.error_type)


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


def _preload(pipeline: Pipeline, method: str) -> None:
    """Build reranker ``method`` and load its model now (rerankers with a ``load()``
    method load their LM lazily otherwise, on the first request)."""
    reranker = pipeline.reranker(method)
    load = getattr(reranker, "load", None)
    if callable(load):
        load()


def create_app(settings: Settings | None = None, pipeline: Pipeline | None = None) -> FastAPI:
    """Build the FastAPI app.

    Args:
        settings: Service settings; default: ``Settings()`` (from ``ATTNRANK_*`` variables).
        pipeline: A ready pipeline to serve instead of opening ``settings.index`` (tests,
            embedding in another service). ``settings.preload`` still applies to it.

    Returns:
        The app; the pipeline is built when its lifespan starts (``with TestClient(app)``
        or a server start-up), and start-up fails with the index/model error if it cannot.
    """
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pipe = pipeline
        if pipe is None:
            logger.info("opening index %s", settings.index)
            pipe = await anyio.to_thread.run_sync(Pipeline.from_config, settings.pipeline_config())
        if settings.preload and settings.rerank_method != NO_RERANK:
            logger.info("loading reranker %r", settings.rerank_method)
            await anyio.to_thread.run_sync(_preload, pipe, settings.rerank_method)
        app.state.pipeline = pipe
        app.state.limiter = anyio.CapacityLimiter(settings.workers)
        logger.info("attnrank service ready (retrievers %s)", sorted(pipe.retrievers))
        try:
            yield
        finally:
            app.state.pipeline = None
            close = getattr(pipe.docstore, "close", None)
            if pipeline is None and callable(close):  # we opened it; an injected one is the caller's
                close()

    app = FastAPI(
        title="attnrank",
        summary="Retrieval with attention-based in-context reranking.",
        version=_version(),
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.add_exception_handler(AttnrankError, _attnrank_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _request_validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _internal_error)

    from api.routes import health, search

    app.include_router(health.router)
    app.include_router(search.router)
    return app


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("attnrank")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "0"

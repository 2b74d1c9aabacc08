"""Pure ASGI middleware: API-key auth, request body decoding (gzip, deflate) and size
limit, ``HEAD`` for every ``GET`` route, request metrics.

Pure ASGI (not ``BaseHTTPMiddleware``) so that bodies stream through untouched and
errors raised by the app keep their handlers. Responses these layers produce themselves
use the service's error body ``{error, error_type}``.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import time
import zlib
from typing import Any

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from heedrank.api.deadline import ARRIVED
from heedrank.api.inference import ClientGoneError
from heedrank.api.routes.ui import UI_PATHS

logger = logging.getLogger(__name__)

PUBLIC_PATHS = frozenset({"/health", *UI_PATHS})
"""Paths served without an API key: readiness, and the search page and its assets (which
hold no data; the page sends the key with its API requests)."""


async def send_error(
    send: Send, status: int, message: str, error_type: str, headers: dict[str, str] | None = None
) -> None:
    """Send a complete JSON error response ``{error, error_type}``."""
    body = json.dumps({"error": message, "error_type": error_type}).encode()
    raw = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


class AuthMiddleware:
    """Requires ``Authorization: Bearer <api_key>`` on every path but :data:`PUBLIC_PATHS`
    (401 ``unauthorized`` otherwise). Keys are compared in constant time."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in PUBLIC_PATHS:
            await self.app(scope, receive, send)
            return
        header = b""
        for name, value in scope.get("headers", ()):
            if name == b"authorization":
                header = value
                break
        scheme, _, token = header.partition(b" ")
        if scheme.lower() != b"bearer" or not hmac.compare_digest(token.strip(), self._key):
            message = "missing API key: send 'Authorization: Bearer <key>'" if not header else "invalid API key"
            await send_error(send, 401, message, "unauthorized", {"WWW-Authenticate": "Bearer"})
            return
        await self.app(scope, receive, send)


SUPPORTED_ENCODINGS = ("gzip", "deflate")
"""Request ``Content-Encoding`` values decoded by :class:`BodyLimitMiddleware` (besides
``identity``; ``x-gzip`` is read as ``gzip``)."""


class _Inflater:
    """Stream-decompresses one gzip or deflate body, never producing more than ``limit + 1``
    bytes in all: a small body that would inflate past the limit (a "zip bomb") costs at
    most ``limit`` bytes of memory before it is refused.

    ``deflate`` is the zlib format (RFC 9110); raw deflate, which some clients send under
    that name, is recognised by its missing zlib header. Concatenated gzip members are read
    one after the other.
    """

    def __init__(self, coding: str, limit: int) -> None:
        self.coding = coding
        self.limit = limit
        self.produced = 0
        self._head = b""
        self._d: Any = None

    def _bad(self, why: str) -> HTTPException:
        return HTTPException(400, f"request body is not valid {self.coding} data ({why}); compress it with "
                                  f"{self.coding} or send it uncompressed without Content-Encoding")

    def _start(self, head: bytes) -> None:
        if self.coding == "gzip":
            wbits = 16 + zlib.MAX_WBITS
        else:
            zlib_header = len(head) >= 2 and head[0] & 0x0F == 8 and (head[0] << 8 | head[1]) % 31 == 0
            wbits = zlib.MAX_WBITS if zlib_header else -zlib.MAX_WBITS
        self._d = zlib.decompressobj(wbits)

    def feed(self, data: bytes, final: bool) -> bytes:
        """Decompressed bytes of the next chunk ``data`` (``final``: no more follow).

        Raises:
            HTTPException: 413 once the output passes ``limit``; 400 on corrupt or cut data.
        """
        if self._d is None:
            self._head += data
            if len(self._head) < 2 and not final:
                return b""
            data, self._head = self._head, b""
            if not data:  # an empty body stays empty
                return b""
            self._start(data)
        out = []
        try:
            while data:
                chunk = self._d.decompress(data, self.limit - self.produced + 1)
                self.produced += len(chunk)
                if self.produced > self.limit:
                    raise HTTPException(413, f"decompressed request body is over the limit of {self.limit} bytes; "
                                             "send less in one request")
                out.append(chunk)
                data = b""
                if self._d.eof and self._d.unused_data and self.coding == "gzip":  # next gzip member
                    data = self._d.unused_data
                    self._start(data)
                elif self._d.eof and self._d.unused_data:
                    raise self._bad("data after the end of the compressed stream")
        except zlib.error as exc:
            raise self._bad(str(exc)) from None
        if final and not self._d.eof:
            raise self._bad("the compressed stream is cut short")
        return b"".join(out)


class BodyLimitMiddleware:
    """Decodes compressed request bodies and refuses bodies over ``max_bytes``: the one
    place where request bodies are sized.

    * No ``Content-Encoding`` (or ``identity``): a body over the limit is 413
      ``payload_too_large``, at once when ``Content-Length`` says so, else as soon as the
      streamed body passes the limit.
    * ``gzip`` (``x-gzip``) or ``deflate``: the body is decompressed as it streams in and the
      app sees the plain body (without the ``Content-Encoding`` and ``Content-Length``
      headers). The limit applies to the decompressed bytes (and to the bytes received): 413
      as soon as either passes it, so a decompression bomb is never inflated in full. A
      corrupt compressed body is 400 ``bad_request``.
    * Any other encoding, or a chain of several: 415 ``unsupported_media_type`` naming the
      supported ones (and an ``Accept-Encoding`` header listing them).
    """

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
        encoding = ""
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > limit:
                    await send_error(send, 413, f"request body of {declared} bytes is over the limit of {limit} bytes",
                                     "payload_too_large")
                    return
            elif name == b"content-encoding":
                encoding = value.decode("latin-1")
        codings = [c.strip().lower() for c in encoding.split(",") if c.strip().lower() not in ("", "identity")]
        codings = ["gzip" if c == "x-gzip" else c for c in codings]
        if len(codings) > 1 or (codings and codings[0] not in SUPPORTED_ENCODINGS):
            supported = ", ".join(SUPPORTED_ENCODINGS)
            await send_error(
                send, 415, f"Content-Encoding {encoding.strip()!r} is not supported; send the body uncompressed or "
                f"compressed with one of: {supported}", "unsupported_media_type", {"Accept-Encoding": supported},
            )
            return
        inflater = _Inflater(codings[0], limit) if codings else None
        if inflater is not None:
            # edited in place, not copied: outer middleware (metrics) reads the route the
            # router writes into this same scope
            scope["headers"] = [(n, v) for n, v in scope.get("headers", ())
                                if n not in (b"content-encoding", b"content-length")]
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                body = message.get("body", b"")
                seen += len(body)
                if seen > limit:
                    raise HTTPException(413, f"request body is over the limit of {limit} bytes")
                if inflater is not None:
                    message = {**message, "body": inflater.feed(body, final=not message.get("more_body", False))}
            return message

        await self.app(scope, limited, send)


class ClientGoneMiddleware:
    """Answers a request whose client hung up while its job waited or ran
    (:class:`heedrank.api.inference.ClientGoneError`) with 499 ``client_closed`` (never read:
    the connection is gone; counted so in the metrics) and logs it at info level without a
    traceback: a closed connection is not a server error."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watch(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except ClientGoneError as exc:
            logger.info("%s %s: %s", scope.get("method"), scope.get("path"), exc)
            if not started:
                await send_error(send, 499, str(exc), "client_closed")


class HeadMiddleware:
    """Answers ``HEAD`` on every ``GET`` route (RFC 9110 section 9.3.2): the request runs as a
    ``GET`` and the answer keeps its status and headers (``Content-Length`` included) but
    sends no body. A path without a ``GET`` route answers as it would a ``GET`` (404, or 405
    with ``Allow``).

    The app gets a copy of the scope with the method ``GET`` (the server keeps reading its
    own, so it still knows the request was ``HEAD``); the route the router matched is copied
    back for :class:`MetricsMiddleware`, which labels the request ``HEAD``.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "HEAD":
            await self.app(scope, receive, send)
            return
        inner = {**scope, "method": "GET"}

        async def no_body(message: Message) -> None:
            if message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return
                message = {"type": "http.response.body", "body": b"", "more_body": False}
            await send(message)

        try:
            await self.app(inner, receive, no_body)
        finally:
            if "route" in inner:
                scope["route"] = inner["route"]


KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT"})
"""Request methods counted under their own ``method`` label (RFC 9110 and PATCH); any other
verb a client invents is counted as ``method="other"``, so the label stays bounded."""


def method_label(method: str) -> str:
    """The ``method`` label of a request method: itself when known, else ``"other"``."""
    return method if method in KNOWN_METHODS else "other"


class MetricsMiddleware:
    """Stamps each request's arrival, counts requests by route template, method and status,
    and times them.

    The outermost layer, so the stamp (``scope[ARRIVED]``, :func:`time.perf_counter` seconds,
    :data:`heedrank.api.deadline.ARRIVED`) is taken before the body is read: a request's
    per-request budget counts from it (:func:`heedrank.api.deadline.request_deadline`).
    Every label is bounded: ``route`` is a route template or ``unmatched``, ``method`` one of
    :data:`KNOWN_METHODS` or ``other``. A request whose client hung up is counted as
    ``status="499"`` (also when the app was cancelled before answering), never as a 5xx.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        t0 = time.perf_counter()
        runtime = None
        if scope["type"] == "http":
            scope.setdefault(ARRIVED, t0)
            runtime = getattr(getattr(scope.get("app"), "state", None), "runtime", None)
        if runtime is None:
            await self.app(scope, receive, send)
            return
        status = 500
        started = False

        async def send_status(message: Message) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                status, started = message["status"], True
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        except asyncio.CancelledError:  # the server cancelled the request: nobody reads an answer
            if not started:
                status = 499
            raise
        finally:
            route: Any = scope.get("route")
            label = getattr(route, "path", None) or "unmatched"
            m = runtime.metrics
            m.requests.labels(label, method_label(scope.get("method", "")), str(status)).inc()
            m.request_seconds.labels(label).observe(time.perf_counter() - t0)

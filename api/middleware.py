"""Pure ASGI middleware: API-key auth, request body limit, request metrics.

Pure ASGI (not ``BaseHTTPMiddleware``) so that bodies stream through untouched and
errors raised by the app keep their handlers. Responses these layers produce themselves
use the service's error body ``{error, error_type}``.
"""

from __future__ import annotations

import hmac
import json
import time
from typing import Any

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

PUBLIC_PATHS = frozenset({"/health"})
"""Paths served without an API key."""


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


class BodyLimitMiddleware:
    """Refuses request bodies over ``max_bytes`` with 413 ``payload_too_large``: at once when
    ``Content-Length`` says so, else as soon as the streamed body passes the limit."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
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
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise HTTPException(413, f"request body is over the limit of {limit} bytes")
            return message

        await self.app(scope, limited, send)


class MetricsMiddleware:
    """Counts requests by route template, method and status, and times them."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        runtime = None
        if scope["type"] == "http":
            runtime = getattr(getattr(scope.get("app"), "state", None), "runtime", None)
        if runtime is None:
            await self.app(scope, receive, send)
            return
        status = 500
        t0 = time.perf_counter()

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route: Any = scope.get("route")
            label = getattr(route, "path", None) or "unmatched"
            m = runtime.metrics
            m.requests.labels(label, scope.get("method", ""), str(status)).inc()
            m.request_seconds.labels(label).observe(time.perf_counter() - t0)

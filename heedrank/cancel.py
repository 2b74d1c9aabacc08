"""Cooperative cancellation of running work: stop a reranking whose result nobody will read.

A :class:`CancelToken` is set by whoever waits for a job and stops waiting (the service's
inference pools: the client hung up, or ``deadline_ms`` passed). The work runs inside
:func:`cancel_scope` with that token, and long loops call :func:`check` at their batch or
layer boundaries: the attention function every LM layer runs
(:func:`heedrank.reranker.attention.heedrank_attention_forward`) does, so every attention
reranker stops at its next layer once its token is set, raising
:class:`~heedrank.errors.JobCancelledError`. Stopping there leaves nothing half-written: the
per-query buffers are rewritten by the next query and block caches are only filled after a
block's pass completes.

Outside a scope (library use, batch evaluation) :func:`check` never raises, and costs one
thread-local attribute read.

Example:
    >>> token = CancelToken()
    >>> with cancel_scope(token):
    ...     check()            # nothing happens
    ...     token.cancel("the client closed the connection")
    ...     check()            # doctest: +SKIP
    Traceback (most recent call last):
    JobCancelledError: stopped: the client closed the connection
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from heedrank.errors import JobCancelledError

__all__ = ["CancelToken", "cancel_scope", "check", "current_token", "time_left"]

_local = threading.local()


class CancelToken:
    """A thread-safe flag with the reason it was set (first reason wins), and the time by which
    the work must end, when its caller has one.

    Attributes:
        reason: Why it was cancelled ("" until then).
        deadline: :func:`time.perf_counter` seconds by which the work should have ended (a
            request's end-to-end budget less what its answer needs), or ``None``: work that can
            choose how much to do reads it through :func:`time_left`.
    """

    __slots__ = ("_event", "reason", "deadline")

    def __init__(self, deadline: float | None = None) -> None:
        self._event = threading.Event()
        self.reason = ""
        self.deadline = deadline

    def cancel(self, reason: str = "nobody waits for the result any more") -> None:
        """Ask the work to stop at its next :func:`check` (idempotent; safe from any thread)."""
        if not self._event.is_set():
            self.reason = reason
            self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()


@contextmanager
def cancel_scope(token: CancelToken | None) -> Iterator[CancelToken | None]:
    """Run the block with ``token`` as this thread's current token (``None``: none);
    the previous one is restored afterwards, so scopes nest."""
    previous = getattr(_local, "token", None)
    _local.token = token
    try:
        yield token
    finally:
        _local.token = previous


def current_token() -> CancelToken | None:
    """This thread's current token, if any."""
    return getattr(_local, "token", None)


def check() -> None:
    """Raise when this thread's current token is set; call it at batch or layer boundaries.

    Raises:
        JobCancelledError: the token was cancelled; the message gives its reason.
    """
    token = getattr(_local, "token", None)
    if token is not None and token._event.is_set():
        raise JobCancelledError(f"stopped: {token.reason}")


def time_left() -> float | None:
    """Seconds until this thread's current token's deadline (may be negative), or ``None``
    outside a scope or without a deadline (library use, batch evaluation: no limit)."""
    token = getattr(_local, "token", None)
    if token is None or token.deadline is None:
        return None
    return float(token.deadline - time.perf_counter())


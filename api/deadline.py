"""One end-to-end time limit per request: from its arrival to its response, the wait for a
worker included.

:class:`heedrank.api.middleware.MetricsMiddleware` stamps each request's arrival in its ASGI
scope (:data:`ARRIVED`, :func:`time.perf_counter` seconds) before anything else runs (body read,
auth, validation). A reranking route turns it into a :class:`RequestDeadline`
(:func:`request_deadline`): the arrival plus the service's per-request budget
(``HEEDRANK_REQUEST_BUDGET_S``) or the client's ``deadline_ms``, whichever ends first, and
splits the time so that the response leaves within :attr:`RequestDeadline.end` + :data:`GRACE_S`:

* the reranking job gets until :meth:`RequestDeadline.work_end`: the end less a reserve for the
  fallback, its measured cost (:class:`FallbackCosts`), at most :data:`RESERVE_SHARE` of the
  window. The ``rerank`` pool answers at once a job whose estimated end is past that, drops
  one still queued when a worker frees too late for it, and stops a running one then, at its
  next layer (:meth:`heedrank.api.inference.InferencePool.run`, ``deadline``);
* the fallback (the documents scored without the LM, in the ``search`` pool) gets until
  :meth:`RequestDeadline.fallback_end`, the end plus :data:`GRACE_S`; past it, or with that
  queue full, the answer keeps the given (first-stage) order.

Example:
    >>> d = RequestDeadline(arrived=100.0, end=120.0, by_budget=True)
    >>> d.work_end(reserve=1.5), d.fallback_end()
    (118.5, 120.5)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ARRIVED = "heedrank.arrived"
"""ASGI scope key of a request's arrival, :func:`time.perf_counter` seconds."""

GRACE_S = 0.3
"""Seconds past a request's end that its fallback may run (then the response is written:
it leaves within :data:`ANSWER_WITHIN_S` of the end)."""

ANSWER_WITHIN_S = 0.5
"""What the service promises: a request's answer leaves within its end plus this many seconds."""

RESERVE_SHARE = 0.25
"""Most of a request's window (end - arrival) reserved for its fallback before the end."""


def arrival(scope: Mapping[str, Any]) -> float:
    """A request's arrival (:func:`time.perf_counter` seconds): the middleware's stamp, or now
    when there is none (an app mounted without :class:`heedrank.api.middleware.MetricsMiddleware`)."""
    stamp = scope.get(ARRIVED)
    return float(stamp) if stamp is not None else time.perf_counter()


@dataclass(frozen=True, slots=True)
class RequestDeadline:
    """When one request must be answered.

    Attributes:
        arrived: Arrival, :func:`time.perf_counter` seconds.
        end: ``arrived`` plus the earlier of the limits (seconds, same clock), or ``None``: no limit.
        by_budget: Whether the service's per-request budget set ``end`` (``False``: the client's
            ``deadline_ms``, or no limit).
    """

    arrived: float
    end: float | None
    by_budget: bool

    @property
    def window(self) -> float | None:
        """Seconds from arrival to the end, or ``None``."""
        return None if self.end is None else self.end - self.arrived

    def elapsed(self) -> float:
        """Seconds since arrival."""
        return time.perf_counter() - self.arrived

    def work_end(self, reserve: float) -> float | None:
        """The end less ``reserve`` seconds for the fallback, at most :data:`RESERVE_SHARE` of the
        window (perf_counter seconds), or ``None``: no limit."""
        if self.end is None:
            return None
        return self.end - min(max(0.0, reserve), RESERVE_SHARE * (self.end - self.arrived))

    def fallback_end(self) -> float | None:
        """The end plus :data:`GRACE_S` (perf_counter seconds), or ``None``: no limit."""
        return None if self.end is None else self.end + GRACE_S


def request_deadline(scope: Mapping[str, Any], budget_s: float | None, client_s: float | None = None) -> RequestDeadline:
    """The deadline of a request: its :func:`arrival` plus the earlier of ``budget_s`` (the
    service's per-request budget, seconds) and ``client_s`` (the client's ``deadline_ms`` in
    seconds); on a tie the client's is named. ``None`` for either: no such limit."""
    arrived = arrival(scope)
    limits = [s for s in (budget_s, client_s) if s is not None]
    if not limits:
        return RequestDeadline(arrived, None, False)
    by_budget = budget_s is not None and (client_s is None or budget_s < client_s)
    return RequestDeadline(arrived, arrived + min(limits), by_budget)


class FallbackCosts:
    """Seconds per document the deadline fallback of each route took, learned, so that a
    request reserves that much of its window for it (:meth:`RequestDeadline.work_end`).

    Args:
        alpha: Weight of the newest fallback in the running mean (0..1].
    """

    def __init__(self, alpha: float = 0.3) -> None:
        self.alpha = alpha
        self._lock = threading.Lock()
        self._spd: dict[str, float] = {}

    def observe(self, route: str, seconds: float, documents: int) -> None:
        """A fallback of ``route`` (``"search"``, ``"rerank"``) over ``documents`` documents took
        ``seconds`` (or was cut after them: a lower bound, learned alike)."""
        if seconds <= 0:
            return
        value = seconds / max(1, documents)
        with self._lock:
            old = self._spd.get(route)
            self._spd[route] = value if old is None else (1 - self.alpha) * old + self.alpha * value

    def reserve(self, route: str, documents: int) -> float:
        """Seconds to reserve for a fallback of ``route`` over ``documents`` documents (0.0
        before one was measured)."""
        with self._lock:
            spd = self._spd.get(route)
        return 0.0 if spd is None else spd * max(1, documents)

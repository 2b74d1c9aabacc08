"""What each reranking method costs per candidate on this service, measured, so that a request
the per-request budget cannot hold is refused up front instead of reranking nothing.

One :class:`MethodCosts` per service (:attr:`heedrank.api.runtime.Runtime.costs`). After each
reranking ``/search`` it learns the method's seconds per candidate (a running mean of the
reranking time over the candidates reranked; a request whose reranking encoded cold candidate
blocks is not counted: its cost is the fill's, not the method's). A request stopped by the
budget (``HEEDRANK_REQUEST_BUDGET_S``) teaches a lower bound, at least the seconds it ran over its
candidates (its wait for a worker not counted), for a method that reads no stored blocks (cached
BlockRank's time depends on how many candidates were cold, which a stopped request does not say).
From the mean, :meth:`MethodCosts.max_candidates` is the most candidates that fit the budget;
``/search`` refuses more with a 422 that names it, and ``GET /info`` shows it per method
(``max_candidates_in_budget``, ``seconds_per_candidate``). A method not measured yet has no
such limit (its first request may still be stopped by the budget, and then teaches one); a
mean that came from one slow moment heals as smaller requests of the method complete.
"""

from __future__ import annotations

import math
import threading

HEADROOM = 0.9
"""Share of the budget a request is planned to fill (the rest: the first stage, queueing, noise)."""


class MethodCosts:
    """Seconds per candidate of each reranking method, learned from the requests served.

    Args:
        alpha: Weight of the newest request in the running mean (0..1].
    """

    def __init__(self, alpha: float = 0.3) -> None:
        self.alpha = alpha
        self._lock = threading.Lock()
        self._spc: dict[str, float] = {}

    def observe(self, method: str, seconds: float, candidates: int) -> None:
        """A reranking of ``candidates`` candidates by ``method`` took ``seconds`` (warm blocks)."""
        if candidates < 1 or seconds <= 0:
            return
        value = seconds / candidates
        with self._lock:
            old = self._spc.get(method)
            self._spc[method] = value if old is None else (1 - self.alpha) * old + self.alpha * value

    def stopped(self, method: str, seconds: float, candidates: int) -> None:
        """A reranking of ``candidates`` by ``method`` was stopped by the budget after it ran
        ``seconds`` (its wait for a worker not included): it costs at least
        ``seconds / candidates`` per candidate."""
        if candidates < 1 or seconds <= 0:
            return
        with self._lock:
            self._spc[method] = max(self._spc.get(method, 0.0), seconds / candidates)

    def seconds_per_candidate(self, method: str) -> float | None:
        """The running mean for ``method`` in seconds, or ``None`` before it was measured."""
        with self._lock:
            return self._spc.get(method)

    def max_candidates(self, method: str, budget: float | None) -> int | None:
        """The most candidates ``method`` reranks within ``HEADROOM * budget`` seconds (at least
        1), or ``None``: not measured yet, or no budget."""
        spc = self.seconds_per_candidate(method)
        if spc is None or budget is None or spc <= 0:
            return None
        return max(1, math.floor(HEADROOM * budget / spc))

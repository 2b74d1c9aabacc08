"""How many cold blocks a reranking can encode in the time it has: a running estimate of one
reranker's pass.

A cached reranker's call (cached BlockRank) costs about ``c N + b K`` seconds for ``N``
candidates in its query pass, ``K`` of them cold (their blocks encoded now, not read from the
store). :class:`PassCosts` keeps ``c`` and ``b`` as running means over the calls it is shown, and
:meth:`PassCosts.cold_within` turns the seconds a request has left (:func:`heedrank.cancel.time_left`)
into how many cold blocks it may encode, so a request with a budget reads as many candidates
with the LM as fit and scores the rest from its other signals (:class:`heedrank.serving.ScorerServing`)
instead of running past its deadline and reading none.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field

__all__ = ["PassCosts"]


@dataclass
class PassCosts:
    """Running estimates of one reranker's call, in seconds (module docstring).

    Attributes:
        per_candidate: ``c``: seconds of the query pass per candidate whose block is read.
            The prior, 0.02 s, is above a warm pass on 2 CPU cores (about 0.01 s).
        per_block: ``b``: seconds per cold block encoded now. The prior, 0.3 s, is above what
            SmolLM2-135M takes on 2 CPU cores (0.15-0.25 s): a first request errs short.
        alpha: Weight of the newest call in the running means (the first call of each kind
            replaces the prior).
        share: The part of the time left a call plans to use (the rest absorbs the estimate's error).
    """

    per_candidate: float = 0.02
    per_block: float = 0.3
    alpha: float = 0.3
    share: float = 0.85
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)
    _seen: int = field(default=0, repr=False, compare=False)  # bit 1: a warm call seen, bit 2: a cold one

    def observe(self, candidates: int, cold: int, seconds: float) -> None:
        """Learn from one call: ``candidates`` in its pass, ``cold`` of them encoded now, ``seconds`` wall time."""
        if candidates <= 0 or seconds <= 0 or not math.isfinite(seconds):
            return
        with self._lock:  # the first measurement of each replaces its prior; later ones move the mean
            if cold == 0:
                weight = self.alpha if self._seen & 1 else 1.0
                self.per_candidate += weight * (seconds / candidates - self.per_candidate)
                self._seen |= 1
            else:
                per_block = max(0.0, seconds - self.per_candidate * candidates) / cold
                weight = self.alpha if self._seen & 2 else 1.0
                self.per_block += weight * (per_block - self.per_block)
                self._seen |= 2

    def observe_blocks(self, blocks: int, seconds: float) -> None:
        """Learn ``b`` from ``blocks`` encoded with no query pass in ``seconds`` (a prefetched chunk)."""
        if blocks <= 0 or seconds <= 0 or not math.isfinite(seconds):
            return
        with self._lock:
            weight = self.alpha if self._seen & 2 else 1.0
            self.per_block += weight * (seconds / blocks - self.per_block)
            self._seen |= 2

    def chunk_size(self, seconds: float = 1.5) -> int:
        """Blocks encoded in about ``seconds`` (at least 1): a prefetch chunk, so that the time is
        checked that often."""
        with self._lock:
            return max(1, int(seconds // max(self.per_block, 1e-3)))

    def cold_within(self, seconds_left: float, warm: int) -> int:
        """How many cold blocks a call with ``warm`` read candidates may encode in ``seconds_left``
        (>= 0; 0 when even the warm pass does not fit)."""
        with self._lock:
            spare = self.share * seconds_left - self.per_candidate * warm
            return max(0, int(spare // (self.per_candidate + self.per_block)))

"""The ``rank`` signal: ``log(1 + i)`` of the candidate's 0-based place ``i`` in the first stage.

Read only when the order is a first stage's (:attr:`heedrank.signals.base.SignalInputs.ranked`):
``/rerank``'s given order is a client's, and every candidate is NaN there.
"""

from __future__ import annotations

import math

import numpy as np

from heedrank.signals.base import SignalInputs

NAME = "rank"


def feature(position: int) -> float:
    """``log(1 + i)`` of a 0-based first-stage (or given) position ``i`` (``math.log1p``: the
    number the fit read, to the last bit; numpy's differs in the last place for some ``i``)."""
    return math.log1p(position)


class RankSignal:
    """See the module docstring."""

    name = NAME
    reads_reranker = False

    def values(self, inputs: SignalInputs) -> np.ndarray:
        """``(N,)`` float64 ``log(1 + i)``, or NaN everywhere for an order that is not a first stage's."""
        if not inputs.ranked:
            return inputs.missing()
        return np.asarray([feature(i) for i in range(len(inputs.candidates))], dtype=np.float64)


SIGNAL = RankSignal()
"""The signal (registered by :mod:`heedrank.signals`, in the card's order)."""

"""The ``attention`` signal: the reranker's own score of a candidate it read.

For the default (cached BlockRank, ``scoring='independent'``) the list-independent log-odds of
relevance (:mod:`heedrank.reranker.cached.independent`); for another reranker its own score
(unitless). NaN for a candidate the reranker did not read (its block cold past the budget, the
request budget spent) and for every candidate when no reranker pass ran.
"""

from __future__ import annotations

import numpy as np

from heedrank.signals.base import SignalInputs

NAME = "attention"


class AttentionSignal:
    """See the module docstring."""

    name = NAME
    reads_reranker = True

    def values(self, inputs: SignalInputs) -> np.ndarray:
        """``(N,)`` float64: the reranker's score, NaN where it read none."""
        if inputs.reranker is None:
            return inputs.missing()
        return inputs.column({h.doc_id: float(h.score) for h in inputs.reranker.hits})


SIGNAL = AttentionSignal()
"""The signal (registered by :mod:`heedrank.signals`, in the card's order)."""

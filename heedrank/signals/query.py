"""The ``query_words`` signal: the query's length in words (whitespace-separated), the same for
every candidate of the list.

A number of the query alone, so it never ranks one candidate above another: the scorer reads it
as its query gate (:class:`heedrank.scorer.QueryGate`), which leans the score on the embedder alone
by how far the query lies outside the lengths the scorer was fitted on (a whole argument or a pasted
passage against the short questions and claims of its training sources).
"""

from __future__ import annotations

import numpy as np

from heedrank.signals.base import SignalInputs

NAME = "query_words"


def words(text: str) -> int:
    """The length of ``text`` in whitespace-separated words (``len(text.split())``)."""
    return len(text.split())


class QueryWordsSignal:
    """See the module docstring."""

    name = NAME
    reads_reranker = False

    def values(self, inputs: SignalInputs) -> np.ndarray:
        """``(N,)`` float64, the query's word count on every row."""
        return np.full(len(inputs.candidates), float(words(inputs.query.text)), dtype=np.float64)


SIGNAL = QueryWordsSignal()
"""The signal (registered by :mod:`heedrank.signals`, after the built-in scoring signals)."""

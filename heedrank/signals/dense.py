"""The ``dense`` signal: the embedder's cosine of the query and the candidate, in [-1, 1].

Read from the index's stored vector for a document it holds (``/search``); otherwise the
candidate's text is encoded once and cached by its hash (``/rerank``, ``rerank-batch``,
``eval trec-dl``): :class:`heedrank.index.cosines.DenseSignal`. NaN on a path without an
embedder, and for a document without a vector. The embedder alone (method ``dense``,
:class:`heedrank.reranker.dense.DenseReranker`) is this signal served by itself.
"""

from __future__ import annotations

import numpy as np

from heedrank.signals.base import SignalInputs

NAME = "dense"


class DenseSignal:
    """See the module docstring."""

    name = NAME
    reads_reranker = False

    def values(self, inputs: SignalInputs) -> np.ndarray:
        """``(N,)`` float64 cosines, NaN where a candidate has none."""
        if inputs.dense is None:
            return inputs.missing()
        docs = [h.document for h in inputs.candidates.hits if h.document is not None]
        return inputs.column(inputs.dense.cosines(inputs.query.text, docs, stored=inputs.stored))


SIGNAL = DenseSignal()
"""The signal (registered by :mod:`heedrank.signals`, in the card's order)."""

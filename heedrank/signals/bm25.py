"""The ``bm25`` signal: BM25's score of the query and the candidate (unitless, >= 0).

Read from the index's BM25 for every candidate it holds (:meth:`heedrank.index.store.Index.bm25_scores`;
``/search`` and ``eval beir``: a hybrid candidate the dense side found has one too). NaN for a
document outside the index (``/rerank``'s, ``eval trec-dl``'s passages).
"""

from __future__ import annotations

import numpy as np

from heedrank.signals.base import SignalInputs

NAME = "bm25"


class BM25Signal:
    """See the module docstring."""

    name = NAME
    reads_reranker = False

    def values(self, inputs: SignalInputs) -> np.ndarray:
        """``(N,)`` float64 BM25 scores, NaN where the index holds none."""
        if inputs.index is None or not inputs.stored:
            return inputs.missing()
        return inputs.column(inputs.index.bm25_scores(inputs.query.text, [h.doc_id for h in inputs.candidates.hits]))


SIGNAL = BM25Signal()
"""The signal (registered by :mod:`heedrank.signals`, in the card's order)."""

"""A signal added as one new file: ``words``, the candidate's length in words (unitless, >= 1),
registered on import, with no edit to the serving or the stage (tests/heedrank/test_signals.py)."""

from __future__ import annotations

import numpy as np

from heedrank.signals import SignalInputs, register

NAME = "words"


class WordsSignal:
    name = NAME
    reads_reranker = False

    def values(self, inputs: SignalInputs) -> np.ndarray:
        return np.asarray([len(h.document.content.split()) if h.document is not None else np.nan
                           for h in inputs.candidates.hits], dtype=np.float64)


SIGNAL = register(WordsSignal())

"""The scorer's signals, one module each (:mod:`heedrank.signals.base` says what a signal is).

Importing the package registers the built-in signals: ``attention`` (the reranker's own score),
``dense`` (the embedder's cosine) and ``rank`` (``log(1 + i)`` of the first-stage place);
:data:`BUILT_IN` holds them in the card's order. ``query_words`` (the query's length) is no
term of a model: the scorer's query gate reads it (:class:`heedrank.scorer.QueryGate`).
"""

from __future__ import annotations

from heedrank.signals import attention, dense, query, rank
from heedrank.signals.base import Signal, SignalInputs, gather, names, register, signal

BUILT_IN: tuple[Signal, ...] = tuple(register(s) for s in (attention.SIGNAL, dense.SIGNAL, rank.SIGNAL))
"""The built-in signals, registered in the order weights cards list them (a new signal's module
registers its own on import: :func:`register`)."""

QUERY_WORDS: Signal = register(query.SIGNAL)
"""The query's length in words, read by the scorer's query gate (:class:`heedrank.scorer.QueryGate`)."""

__all__ = ["BUILT_IN", "QUERY_WORDS", "Signal", "SignalInputs", "gather", "names", "register", "signal"]

"""The scorer's signals, one module each (:mod:`heedrank.signals.base` says what a signal is).

Importing the package registers the built-in signals: ``attention`` (the reranker's own score),
``dense`` (the embedder's cosine) and ``rank`` (``log(1 + i)`` of the first-stage place).
:data:`BUILT_IN` holds them in the card's order.
"""

from __future__ import annotations

from heedrank.signals import attention, dense, rank
from heedrank.signals.base import Signal, SignalInputs, gather, names, register, signal

BUILT_IN: tuple[Signal, ...] = tuple(register(s) for s in (attention.SIGNAL, dense.SIGNAL, rank.SIGNAL))
"""The built-in signals, registered in the order weights cards list them (a new signal's module
registers its own on import: :func:`register`)."""

__all__ = ["BUILT_IN", "Signal", "SignalInputs", "gather", "names", "register", "signal"]

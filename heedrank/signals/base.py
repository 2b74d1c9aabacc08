"""What a signal of the default's scorer is, and the one place signals are found by name.

A signal is one number per (query, candidate) pair that the scorer (:mod:`heedrank.scorer`)
reads: one module each (:mod:`heedrank.signals.attention`, :mod:`~heedrank.signals.dense`,
:mod:`~heedrank.signals.rank`), each a :class:`Signal` that maps one query's candidates to an
``(N,)`` float64 array, NaN where it has no value (a block the LM did not read, a document
without a vector, a client's order). A new signal is a new
module that calls :func:`register`; the rerank stage (:class:`heedrank.stage.RerankStage`)
gathers only the signals the serving strategy reads (:func:`gather`), as the ``(N, F)`` matrix
the strategy serves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from heedrank.errors import UnknownNameError, ValidationError
from heedrank.types import Document, Query, Ranking


class CosineSource(Protocol):
    """The embedder's side (:class:`heedrank.index.cosines.DenseSignal`)."""

    def cosines(self, query: str, documents: Sequence[Document], *, stored: bool = True) -> Mapping[str, float]: ...


@dataclass(frozen=True)
class SignalInputs:
    """What a signal may read of one query's candidates.

    Attributes:
        query: The query (with text).
        candidates: The ``N`` candidates, hydrated, in first-stage (or given) order; rows of a
            signal's array follow this order.
        reranker: The reranker's scores of the candidates it read, or ``None`` when no
            reranker pass ran (the request budget spent, a strategy that reads none).
        dense: The embedder's cosines, or ``None`` (no dense signal on this path).
        stored: The candidates are the index's documents: read their stored vectors.
        ranked: The candidates' order is a first stage's (``False`` for ``/rerank``'s given
            order: a client's, not a signal).
    """

    query: Query
    candidates: Ranking
    reranker: Ranking | None = None
    dense: CosineSource | None = None
    stored: bool = True
    ranked: bool = True

    def column(self, values: Mapping[str, float]) -> np.ndarray:
        """``(N,)`` float64 of ``values`` in candidate order, NaN where a candidate has none."""
        return np.asarray([values.get(h.doc_id, np.nan) for h in self.candidates.hits], dtype=np.float64)

    def missing(self) -> np.ndarray:
        """``(N,)`` float64 of NaN: a signal with no value for any candidate."""
        return np.full(len(self.candidates), np.nan, dtype=np.float64)


@runtime_checkable
class Signal(Protocol):
    """One signal of the scorer.

    Attributes:
        name: Its name in weights cards and ``/info`` (a scorer model's ``uses``).
        reads_reranker: It is the reranker's own output (a reranker pass must run first).
    """

    name: str
    reads_reranker: bool

    def values(self, inputs: SignalInputs) -> np.ndarray:
        """``(N,)`` float64, one value per candidate in ``inputs.candidates`` order, NaN where
        the candidate has none."""
        ...


_SIGNALS: dict[str, Signal] = {}


def register(signal: Signal) -> Signal:
    """Make ``signal`` known by its name (a module's own signal, at import); returns it.

    Raises:
        ValidationError: another signal holds that name.
    """
    held = _SIGNALS.get(signal.name)
    if held is not None and held is not signal and type(held) is not type(signal):
        raise ValidationError(f"a signal named {signal.name!r} is registered already ({type(held).__name__})")
    _SIGNALS[signal.name] = signal
    return signal


def names() -> tuple[str, ...]:
    """The registered signals' names, in registration order (the built-in ones first)."""
    return tuple(_SIGNALS)


def signal(name: str) -> Signal:
    """The registered signal ``name``.

    Raises:
        UnknownNameError: no such signal (the message lists the registered ones).
    """
    try:
        return _SIGNALS[name]
    except KeyError:
        raise UnknownNameError(f"unknown signal {name!r}; registered: {list(_SIGNALS)} (a signal module "
                               "registers itself when imported: heedrank.signals.register)") from None


def gather(features: Sequence[str], inputs: SignalInputs) -> np.ndarray:
    """The ``(N, F)`` float64 matrix of the signals ``features`` (columns, in that order) over
    ``inputs.candidates`` (rows), NaN where a candidate has no value.

    Raises:
        UnknownNameError: a feature that is no registered signal.
        ValidationError: a signal whose array is not ``(N,)``.
    """
    n = len(inputs.candidates)
    out = np.empty((n, len(features)), dtype=np.float64)
    for j, name in enumerate(features):
        column = np.asarray(signal(name).values(inputs), dtype=np.float64)
        if column.shape != (n,):
            raise ValidationError(f"signal {name!r} returned shape {column.shape} for {n} candidates; want ({n},)")
        out[:, j] = column
    return out

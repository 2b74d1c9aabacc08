"""The default's scorer: one logit per candidate from every signal a path holds.

Signals (:mod:`heedrank.signals`, one module each: the card names the ones it reads), each a
number of the (query, document) pair and of where the document came in, never of the other
candidates; the built-in ones:

- ``attention``: the reranker's list-independent log-odds of relevance (cached BlockRank,
  ``scoring='independent'``: :mod:`heedrank.reranker.cached.independent`);
- ``dense``: the embedder's cosine of the query and the document (the index's stored vector for
  ``/search``; the text encoded for ``/rerank``, ``rerank-batch`` and ``eval``);
- ``rank``: :func:`heedrank.signals.rank.feature` of the candidate's 0-based place in the first stage (or the
  order ``/rerank`` was given);
- ``query_words``: the query's length, no term of a model: the query gate (:class:`QueryGate`, the
  card's ``scorer.gate``) reads it, so that a query longer than the scorer's sources' leans on the
  embedder alone.

The score is a logistic model, ``s = bias + sum_f w_f x_f`` (log-odds of P(relevant)), with one
fitted model per subset of the signals (:class:`Scorer`), so a candidate missing a signal (cold
past the budget, the request budget spent, an index without vectors) is scored by the model of
the signals it has, calibrated on its own; in a list the LM read only in part, the attention
enters as a step from where the model without it puts the candidate (:meth:`Scorer.logit`), so
candidates with and without it share one scale. Chosen by ``heedrank lab choose-scorer``
(:mod:`heedrank.lab.train.source_choice`, leave-one-source-out; ``recipes/default``'s ``scorer``
step; ``heedrank lab fit-scorer`` fits the logistic form); the weights live in the weights card's
``scorer`` entry, read by :meth:`Scorer.from_card`.

Arrays in, arrays out: :meth:`Scorer.logits` takes one query's ``(N, F)`` float64 signal matrix
(NaN where a candidate has no value) and returns ``(N,)`` logits; each model is a linear score of
fixed signals Platt-scaled to log-odds (docs/design/algorithms.md, "The learned scorer").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from heedrank.errors import ValidationError
from heedrank.signals import attention, dense, names, query


@dataclass(frozen=True)
class SubsetModel:
    """One fitted model: ``s = bias + sum_i weights[i] x[uses[i]]`` (log-odds)."""

    uses: tuple[str, ...]
    weights: tuple[float, ...]
    bias: float

    def logits(self, X: np.ndarray, column: Mapping[str, int]) -> np.ndarray:
        """``(n,)`` float64 log-odds of the rows of ``X`` (``(n, F)``; ``column``: signal -> its column),
        summed in the model's order (as a Python ``bias + sum(...)`` would: the same float64 number)."""
        acc = np.zeros(X.shape[0], dtype=np.float64)
        for u, w in zip(self.uses, self.weights):
            acc = acc + w * X[:, column[u]]
        return self.bias + acc

    def logit(self, x: Mapping[str, float]) -> float:
        """The log-odds of one candidate's signals ``x`` (every one of :attr:`uses` present)."""
        return self.bias + sum(w * x[u] for u, w in zip(self.uses, self.weights))


@dataclass(frozen=True)
class QueryGate:
    """How far a long query's score leans on the model of fewer signals, from its length.

    ``g(q) = min(1, (limit / words(q)) ** power)``: 1 for a query no longer than ``limit`` words,
    falling as it grows past it. The scorer's models were fitted on short questions and claims
    (``limit``: their sources' longest query). Past them the attention, which reads at most the
    first ``max_query_tokens`` tokens of a query, and the first stage's rank (BM25 over a bag of
    a few hundred words) earn less than the weight they earned there, while the embedder reads a
    long query whole. So a candidate of a long query gets ``T(x) + g (s(x) - T(x))``: ``s`` its
    score without the gate, ``T`` the target model, of the signals :attr:`toward` (``("dense",)``:
    the embedder alone). Every candidate of the list holding the target's signals leans by the
    same ``g``. ``g`` is a number of the query alone, so a document's probability stays its own in
    any list, and a query of at most ``limit`` words is scored to the bit as without a gate.
    (Leaning on the candidate's model less the attention lost on the long-query source: tag
    ``exp/gate-toward-no-attention``, docs/results/default.md, "Long queries lean on the embedder".)

    Attributes:
        signal: The signal of the query's length (:mod:`heedrank.signals.query`).
        limit: Words up to which the score is the models' own.
        power: How fast the lean grows past ``limit``.
        toward: The target model's signals.
    """

    signal: str
    limit: float
    power: float = 1.0
    toward: tuple[str, ...] = (dense.NAME,)

    def weights(self, lengths: np.ndarray) -> np.ndarray:
        """``(n,)`` float64 ``g`` of ``(n,)`` query lengths (1 where a length is NaN or at most ``limit``)."""
        lengths = np.asarray(lengths, dtype=np.float64)
        over = np.isfinite(lengths) & (lengths > self.limit)
        g = np.ones(lengths.shape, dtype=np.float64)
        g[over] = (self.limit / lengths[over]) ** self.power
        return g

    @classmethod
    def from_entry(cls, entry: Mapping[str, Any] | None) -> QueryGate | None:
        """Read a card's ``scorer.gate`` (``{"signal", "limit", "power", "toward"}``); ``None`` without one.

        Raises:
            ValidationError: an unregistered signal, a limit that is not a positive number or a
                negative power.
        """
        if not entry:
            return None
        sig, limit, power = str(entry.get("signal", query.NAME)), entry.get("limit"), entry.get("power", 1.0)
        toward = tuple(str(t) for t in entry.get("toward") or ())
        if not toward:
            raise ValidationError("the card's scorer gate names no target model ('toward'): refit it "
                                  "(heedrank lab choose-gate)")
        if not {sig, *toward} <= set(names()):
            raise ValidationError(f"the card's scorer gate reads {[sig, *toward]}, not all registered signals: refit "
                                  "it (heedrank lab choose-gate)")
        if (not isinstance(limit, (int, float)) or not isinstance(power, (int, float)) or limit <= 0
                or power < 0):
            raise ValidationError(f"the card's scorer gate needs a positive limit and a power >= 0, got {dict(entry)}: "
                                  "refit it (heedrank lab choose-gate)")
        return cls(sig, float(limit), float(power), toward)


@dataclass(frozen=True)
class Scorer:
    """The card's ``scorer`` entry, as read (:meth:`from_card`).

    Attributes:
        models: One model per subset of the signals that holds ``attention`` or ``dense``,
            the full set first.
        threshold: The ``"auto"`` cut-off's probability (chosen on dev by mean F1).
        stepped: The signal that enters as a step in a list read only in part (:meth:`logits`):
            the reranker's ``attention``.
        gate: The query gate (:class:`QueryGate`), or ``None``.
    """

    models: tuple[SubsetModel, ...]
    threshold: float
    stepped: str = attention.NAME
    gate: QueryGate | None = None

    @classmethod
    def from_card(cls, data: Mapping[str, Any]) -> Scorer | None:
        """Read a card's ``scorer`` entry; ``None`` when the card has none.

        Raises:
            ValidationError: a signal no module registers (:func:`heedrank.signals.names`), a model
                whose weights do not match its signals (a card fitted by another version), or no
                cut-off: refit it.
        """
        entry = data.get("scorer")
        if entry is None:
            return None
        if "threshold" not in entry:
            raise ValidationError("the card's scorer entry has no threshold: refit it (heedrank lab choose-scorer)")
        known = names()
        models = []
        for m in entry.get("models", ()):
            uses, weights = tuple(m["uses"]), tuple(float(w) for w in m["weights"])
            if not set(uses) <= set(known) or len(uses) != len(weights):
                raise ValidationError(f"the card's scorer model {list(uses)} does not match the signals "
                                      f"{list(known)}: refit it (heedrank lab choose-scorer, recipes/default)")
            models.append(SubsetModel(uses, weights, float(m["bias"])))
        if not models:
            raise ValidationError("the card's scorer entry has no models: refit it (heedrank lab choose-scorer)")
        return cls(tuple(models), float(entry["threshold"]), gate=QueryGate.from_entry(entry.get("gate")))

    @property
    def features(self) -> tuple[str, ...]:
        """The signals any model or the gate reads, in the registered order (the columns
        :meth:`logits` wants)."""
        used = {u for m in self.models for u in m.uses} | ({self.gate.signal} if self.gate is not None else set())
        return tuple(n for n in names() if n in used)

    def only(self, uses: Sequence[str]) -> Scorer | None:
        """This scorer restricted to the model of exactly the signals ``uses`` (the embedder alone,
        method ``dense``), with the same cut-off; ``None`` when no such model was fitted."""
        model = self.exact(uses)
        return None if model is None else Scorer((model,), self.threshold, self.stepped)

    def reads(self, signal: str) -> bool:
        """Whether any of the models reads ``signal``."""
        return signal in self.features

    def model_for(self, have: Sequence[str]) -> SubsetModel | None:
        """The model of the largest fitted subset of the signals ``have`` (among as large ones, the
        first in the card: the fit orders them by their worst margin); ``None``: none fits."""
        avail = set(have)
        best = None
        for m in self.models:
            if set(m.uses) <= avail and (best is None or len(m.uses) > len(best.uses)):
                best = m
        return best

    def exact(self, uses: Sequence[str]) -> SubsetModel | None:
        """The model of exactly the signals ``uses``; ``None`` when none was fitted."""
        return next((m for m in self.models if set(m.uses) == set(uses)), None)

    def logits(self, X: np.ndarray, features: Sequence[str], *, step: bool = False) -> np.ndarray:
        """Log-odds of one query's candidates from the signals each has.

        A candidate gets the model of the signals it has (:meth:`model_for`). With ``step`` (a
        list the reranker read only in part), a candidate without :attr:`stepped` gets ``N(x)``,
        the model of its signals, and one with it ``N(x) + A(x) - B(x)``: ``N`` the model it would
        get without it, ``A`` the model of its signals with it, ``B`` the model of ``A``'s signals
        less it (``A`` and ``B`` fitted on the same training rows). So the attention moves a
        candidate from where the candidates without it stand, and a list the LM read only in
        part is on one scale; where ``N`` is ``B`` (no signal ``A`` leaves out, as on ``/rerank``)
        this is ``A(x)``. Measured in ``docs/results/default.md`` ("At a 10 % store budget"):
        ``A(x)`` beside ``N(x)`` put the models' calibration gap between the candidates with and
        without attention. Without ``step`` (every candidate read, or none) the candidate gets
        ``A(x)``: the fit's choice on dev (the card's ``scorer.figures``, docs/results/default.md
        "At a 10 % store budget").

        Args:
            X: ``(N, F)`` float64 signal values, NaN (or inf) where a candidate has none.
            features: ``F`` signal names, the columns of ``X``.
            step: The step form above.

        Returns:
            ``(N,)`` float64 log-odds; NaN for a candidate with no signal a model reads.
        """
        X = np.asarray(X, dtype=np.float64)
        n = X.shape[0]
        out = np.full(n, np.nan, dtype=np.float64)
        if n == 0:
            return out
        column = {f: j for j, f in enumerate(features)}
        gate = self.gate if self.gate is not None and self.gate.signal in column else None
        target = self.exact(gate.toward) if gate is not None else None
        have = np.isfinite(X)
        patterns, inverse = np.unique(have, axis=0, return_inverse=True)
        for p, pattern in enumerate(patterns):
            rows = np.flatnonzero(inverse.reshape(-1) == p)
            present = [f for f, j in column.items() if pattern[j]]
            model = self.model_for(present)
            if model is None:
                continue
            s = model.logits(X[rows], column)
            inner = self.exact([u for u in model.uses if u != self.stepped]) if self.stepped in model.uses else None
            if step and inner is not None:
                base = self.model_for([f for f in present if f != self.stepped])
                if base is not None and base is not inner:
                    s = s + (base.logits(X[rows], column) - inner.logits(X[rows], column))
            if gate is not None and target is not None:
                g = gate.weights(X[rows, column[gate.signal]])
                if (g < 1).any() and target is not model and set(target.uses) <= set(present):
                    s = s - (1.0 - g) * (s - target.logits(X[rows], column))  # the whole score leans on the target
            out[rows] = s
        return out

    def logit(self, x: Mapping[str, float | None], *, step: bool = False) -> tuple[float, SubsetModel] | None:
        """:meth:`logits` of one candidate given as ``{signal: value}`` (``None`` or NaN: missing),
        with the model used; ``None`` when it has no signal a model reads."""
        have = {k: float(v) for k, v in x.items() if v is not None and math.isfinite(float(v))}
        model = self.model_for(list(have))
        if model is None:
            return None
        features = list(x)
        row = np.asarray([[np.nan if x[f] is None else float(x[f]) for f in features]],  # type: ignore[arg-type]
                         dtype=np.float64)
        return float(self.logits(row, features, step=step)[0]), model

"""The default's scorer: one logit per candidate from every signal a path holds.

Signals (:data:`FEATURES`), each a number of the (query, document) pair and of where the document
came in, never of the other candidates:

- ``attention``: the reranker's list-independent log-odds of relevance (cached BlockRank,
  ``scoring='independent'``: :mod:`heedrank.reranker.cached.independent`);
- ``dense``: the embedder's cosine of the query and the document (the index's stored vector for
  ``/search``; the text encoded for ``/rerank``, ``rerank-batch`` and ``eval``);
- ``rank``: :func:`rank_feature` of the candidate's 0-based place in the first stage (or the
  order ``/rerank`` was given);
- ``bm25``: BM25's score of the query and the document, read from the index's BM25 for the
  documents it holds (:meth:`heedrank.index.store.Index.bm25_scores`; ``/search`` and ``eval beir``:
  a hybrid candidate the dense side found has one too); documents outside an index have none.

The score is a logistic model, ``s = bias + sum_f w_f x_f`` (log-odds of P(relevant)), with one
fitted model per subset of the signals (:class:`Scorer`), so a candidate missing a signal (cold
past the budget, the request budget spent, an index without vectors) is scored by the model of
the signals it has, calibrated on its own; in a list the LM read only in part, the attention
enters as a step from where the model without it puts the candidate (:meth:`Scorer.logit`), so
candidates with and without it share one scale. Fitted by ``heedrank lab fit-scorer``
(:mod:`heedrank.lab.train.scorer_fit`; ``recipes/default``'s ``scorer`` step); the weights live in
the weights card's ``scorer`` entry, read by :meth:`Scorer.from_card`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from heedrank.errors import ValidationError

FEATURES = ("attention", "dense", "rank", "bm25")
"""The signals the scorer reads, in the card's order (module docstring)."""


def rank_feature(position: int) -> float:
    """``log(1 + i)`` of a 0-based first-stage (or given) position ``i``."""
    return math.log1p(position)


@dataclass(frozen=True)
class SubsetModel:
    """One fitted model: ``s = bias + sum_i weights[i] x[uses[i]]`` (log-odds)."""

    uses: tuple[str, ...]
    weights: tuple[float, ...]
    bias: float

    def logit(self, x: Mapping[str, float]) -> float:
        return self.bias + sum(w * x[u] for u, w in zip(self.uses, self.weights))


@dataclass(frozen=True)
class Scorer:
    """The card's ``scorer`` entry, as read (:meth:`from_card`).

    Attributes:
        models: One model per subset of :data:`FEATURES` that holds ``attention`` or ``dense``,
            the full set first.
        threshold: The ``"auto"`` cut-off's probability (chosen on dev by mean F1).
    """

    models: tuple[SubsetModel, ...]
    threshold: float

    @classmethod
    def from_card(cls, data: Mapping[str, Any]) -> Scorer | None:
        """Read a card's ``scorer`` entry; ``None`` when the card has none.

        Raises:
            ValidationError: a signal the code does not know, a model whose weights do not
                match its signals (a card fitted by another version), or no cut-off: refit it.
        """
        entry = data.get("scorer")
        if entry is None:
            return None
        if "threshold" not in entry:
            raise ValidationError("the card's scorer entry has no threshold: refit it (heedrank lab fit-scorer)")
        models = []
        for m in entry.get("models", ()):
            uses, weights = tuple(m["uses"]), tuple(float(w) for w in m["weights"])
            if not set(uses) <= set(FEATURES) or len(uses) != len(weights):
                raise ValidationError(f"the card's scorer model {list(uses)} does not match the signals "
                                      f"{list(FEATURES)}: refit it (heedrank lab fit-scorer, recipes/default)")
            models.append(SubsetModel(uses, weights, float(m["bias"])))
        if not models:
            raise ValidationError("the card's scorer entry has no models: refit it (heedrank lab fit-scorer)")
        return cls(tuple(models), float(entry["threshold"]))

    def only(self, uses: Sequence[str]) -> Scorer | None:
        """This scorer restricted to the model of exactly the signals ``uses`` (the embedder alone,
        method ``dense``), with the same cut-off; ``None`` when no such model was fitted."""
        model = self.exact(uses)
        return None if model is None else Scorer((model,), self.threshold)

    def reads(self, signal: str) -> bool:
        """Whether any of the models reads ``signal`` (a path computes ``bm25`` only then)."""
        return any(signal in m.uses for m in self.models)

    def model_for(self, have: Sequence[str]) -> SubsetModel | None:
        """The model of the largest fitted subset of the signals ``have`` (among as large ones, the
        first in the card: the fit orders them by their dev nDCG@10); ``None``: none fits."""
        avail = set(have)
        best = None
        for m in self.models:
            if set(m.uses) <= avail and (best is None or len(m.uses) > len(best.uses)):
                best = m
        return best

    def exact(self, uses: Sequence[str]) -> SubsetModel | None:
        """The model of exactly the signals ``uses``; ``None`` when none was fitted."""
        return next((m for m in self.models if set(m.uses) == set(uses)), None)

    def logit(self, x: Mapping[str, float | None], *, step: bool = False) -> tuple[float, SubsetModel] | None:
        """Log-odds of one candidate from the signals it has (``None`` or NaN values are missing),
        with the model used; ``None`` when it has no signal a model reads.

        A candidate gets the model of the signals it has. With ``step`` (a list the LM read only in
        part), a candidate without ``attention`` gets ``N(x)``, the model of its signals, and one with
        it ``N(x) + A(x) - B(x)``: ``N`` the model it would get without attention, ``A`` the
        model of its signals with attention, ``B`` the model of ``A``'s signals less attention (``A``
        and ``B`` fitted on the same training rows). So the attention moves a candidate from where
        the candidates without it stand, and a list the LM read only in part is on one scale; where
        ``N`` is ``B`` (no signal ``A`` leaves out, as on ``/rerank``) this is ``A(x)``. Measured in
        ``docs/results/default.md`` ("At a 10 % store budget"): ``A(x)`` beside ``N(x)`` put the
        models' calibration gap between the candidates with and without attention. Without
        ``step`` (every candidate read, or none) the candidate gets ``A(x)``: the fit's choice on
        dev (NFCorpus dev 33.33 against 32.55 for the step form on every list).
        """
        have = {k: float(v) for k, v in x.items() if v is not None and math.isfinite(float(v))}
        model = self.model_for(list(have))
        if model is None:
            return None
        s = model.logit(have)
        if step and "attention" in model.uses:
            base = self.model_for([k for k in have if k != "attention"])
            inner = self.exact([u for u in model.uses if u != "attention"])
            if base is not None and inner is not None and base is not inner:
                s += base.logit(have) - inner.logit(have)
        return s, model


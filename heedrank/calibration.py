"""A relevance cut-off: served scores calibrated to a probability of relevance, and one
threshold on it (docs/results/default.md, "The relevance cut-off"; the Cosine Adapter idea of a query-dependent monotone
map plus one global threshold).

The map is Platt scaling (Platt 1999, "Probabilistic outputs for support vector machines")
with query-dependent inputs. For the hit at 0-based position ``i`` of a query's ``N``
reranked candidates, whose served scores in served order are ``s_0 >= s_1 >= ...``::

    P(relevant) = sigmoid(w . [s_i, log(1 + i), s_0, log N] + b)

made non-increasing down the ranking, so a threshold always keeps a prefix of the served
order. The fit holds ``w_score >= 0`` and ``w_rank <= 0`` (:data:`heedrank.lab.train.cutoff_fit.MONOTONE`),
which makes the map non-increasing by itself, with one probability per distinct score; a running
minimum guards maps fitted without those signs (it flattened runs of hits to one probability).
``s`` is the score the candidates are served by: the fused score
``alpha z(first stage) + (1 - alpha) z(reranker)`` (:mod:`heedrank.fusion`), or with no fusion
the reranker's score z-scored over the candidates. Both are unitless; ``P`` is a probability.

A map holds only for the scores it was fitted on, so a :class:`Calibration` carries one map
per way of serving (:data:`MODES`) and the fusion weight it was fitted at; ``/search`` and
``/rerank`` refuse a cut-off the reranker has no map for (:meth:`Calibration.map_for`).
The maps are fitted on queries the reranker was not trained on, the thresholds chosen on dev
(``heedrank lab calibrate``, :mod:`heedrank.lab.train.cutoff_fit`), and written into the
reranker's weights card under ``"calibration"``.

Pure Python (no numpy): it runs on every reranked request.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from heedrank.errors import ValidationError
from heedrank.fusion import sigmoid, unit_or_keyword

FEATURES = ("score", "log1p_rank", "top_score", "log_candidates")
"""The inputs of the map, in order (see the module docstring)."""

MODES = ("score", "rank", "none")
"""How the served scores were made: ``"score"`` fused with first-stage scores (``/search``),
``"rank"`` fused with the reciprocal rank of the given order (``/rerank``), ``"none"`` the
reranker alone (z-scored)."""

AUTO = "auto"
"""``cutoff`` value: the threshold chosen on dev and recorded with the map."""


def features(scores: Sequence[float]) -> list[tuple[float, float, float, float]]:
    """The map's inputs :data:`FEATURES` for one query's served scores.

    Args:
        scores: ``(N,)`` served scores in served order, best first (unitless).

    Returns:
        ``N`` tuples ``(s_i, log(1 + i), s_0, log N)``; empty for no scores.
    """
    n = len(scores)
    if not n:
        return []
    top, log_n = float(scores[0]), math.log(n)
    return [(float(s), math.log1p(i), top, log_n) for i, s in enumerate(scores)]


@dataclass(frozen=True)
class PlattMap:
    """One fitted map and its dev-chosen threshold.

    Attributes:
        coef: Weights of :data:`FEATURES`, in order.
        intercept: The bias ``b``.
        threshold: The ``"auto"`` cut-off: the probability in (0, 1) that maximised mean F1
            on dev.
        counts: ``(fewest, most)`` candidates per query the map was fitted at, or ``None``
            when the card does not say.
    """

    coef: tuple[float, ...]
    intercept: float
    threshold: float
    counts: tuple[int, int] | None = None

    def __post_init__(self) -> None:
        if len(self.coef) != len(FEATURES):
            raise ValidationError(f"a calibration map needs {len(FEATURES)} weights {FEATURES}, got {len(self.coef)}")
        if not 0.0 < self.threshold < 1.0:
            raise ValidationError(f"a calibration threshold is a probability in (0, 1), got {self.threshold}")

    def probabilities(self, scores: Sequence[float]) -> list[float]:
        """``P(relevant)`` of each hit, non-increasing down the list.

        Args:
            scores: ``(N,)`` served scores in served order, best first.

        Returns:
            ``N`` probabilities in [0, 1].
        """
        out, low = [], 1.0
        for f in features(scores):
            p = sigmoid(sum(w * x for w, x in zip(self.coef, f)) + self.intercept)
            low = min(low, p)
            out.append(low)
        return out

    def to_json(self) -> dict[str, Any]:
        return {"coef": list(self.coef), "intercept": self.intercept, "threshold": self.threshold}

    def extrapolation(self, n: int) -> str | None:
        """A warning when ``n`` candidates lie outside the counts the map was fitted at (its
        probabilities then extrapolate in ``log N``), else ``None``."""
        if self.counts is None or self.counts[0] <= n <= self.counts[1]:
            return None
        return (f"cutoff: the calibration was fitted on {self.counts[0]}-{self.counts[1]} candidates per query; "
                f"with {n} its probabilities extrapolate (rank more documents, or read them as rough)")


@dataclass(frozen=True)
class Calibration:
    """The maps of one reranker configuration (a weights card's ``"calibration"``).

    Attributes:
        alpha: The fusion weight the ``"score"`` and ``"rank"`` maps were fitted at.
        maps: One :class:`PlattMap` per mode of :data:`MODES` it covers.
        info: Everything else the card records (data, dev and test figures, the command).
    """

    alpha: float | None
    maps: Mapping[str, PlattMap]
    info: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Calibration:
        """Read a card's ``"calibration"`` entry.

        Raises:
            ValidationError: features other than :data:`FEATURES`, an unknown mode, a bad map.
        """
        if list(data.get("features", FEATURES)) != list(FEATURES):
            raise ValidationError(f"calibration features {data.get('features')} are not {list(FEATURES)}; refit it "
                                  "with `heedrank lab calibrate`")
        maps = {}
        counts = [int(c) for c in data.get("counts") or []]
        span = (min(counts), max(counts)) if counts else None
        for mode, m in (data.get("maps") or {}).items():
            if mode not in MODES:
                raise ValidationError(f"calibration mode {mode!r} is not one of {MODES}")
            maps[mode] = PlattMap(tuple(float(x) for x in m["coef"]), float(m["intercept"]), float(m["threshold"]),
                                  span)
        alpha = data.get("alpha")
        return cls(None if alpha is None else float(alpha), maps,
                   {k: v for k, v in data.items() if k not in ("maps", "alpha", "features")})

    def to_json(self) -> dict[str, Any]:
        return {"features": list(FEATURES), "alpha": self.alpha,
                "maps": {k: v.to_json() for k, v in self.maps.items()}, **self.info}

    def map_for(self, alpha: float | None, *, by: str = "score") -> PlattMap:
        """The map of scores served with fusion weight ``alpha`` (``None``: no fusion), fused
        with first-stage scores (``by="score"``) or the given order (``by="rank"``).

        Raises:
            ValidationError: no map for that fusion weight or mode (the message lists those
                there are).
        """
        mode = "none" if alpha is None else by
        fitted = mode in self.maps and (alpha is None or (self.alpha is not None and abs(alpha - self.alpha) < 1e-9))
        if not fitted:
            have = [("fusion none" if m == "none" else f"fusion {self.alpha:g} ({m})") for m in self.maps]
            raise ValidationError(f"cutoff is calibrated only for {', '.join(have) or 'nothing'}; got fusion "
                                  f"{'none' if alpha is None else f'{alpha:g}'}: use fusion 'default' or 'none', or "
                                  "a top_k instead of a cutoff")
        return self.maps[mode]


def resolve_cutoff(value: float | str | None) -> float | str | None:
    """A ``cutoff`` value checked: ``None``/``"none"`` (no cut-off), ``"auto"`` (the map's
    dev-chosen threshold), or a probability in [0, 1] (a number or its text).

    Raises:
        ValidationError: anything else.
    """
    return unit_or_keyword(value, {"none": None, AUTO: AUTO},
                           "cutoff must be a probability between 0 and 1 or 'auto', got {value!r}")


def apply_cutoff(scores: Sequence[float], cutoff: float | str, plat: PlattMap) -> tuple[list[float], float, int]:
    """Probabilities of one query's served scores and how many hits pass the cut-off.

    Args:
        scores: ``(N,)`` served scores in served order, best first.
        cutoff: A probability, or ``"auto"`` for ``plat.threshold``.
        plat: The map (:meth:`Calibration.map_for`).

    Returns:
        ``(probabilities (N,), the threshold used, the number of leading hits at or above it)``.
    """
    threshold = plat.threshold if cutoff == AUTO else float(cutoff)
    probs = plat.probabilities(scores)
    keep = sum(1 for p in probs if p >= threshold)  # non-increasing: the passing hits are a prefix
    return probs, threshold, keep

"""Score normalisation and fusion: the one home of the z-score, min-max, reciprocal rank and
sigmoid that serving (:meth:`heedrank.pipeline.Pipeline.search`), the hybrid first stage
(:mod:`heedrank.retriever.hybrid`), the scorers (:mod:`heedrank.reranker.scoring`), the
calibration maps (:mod:`heedrank.calibration`), the query-adapter training and the training
study all call, so that a weights card and a fusion weight chosen on dev mean the same thing
where they are used (``tests/reranker/test_scoring_parity.py``).

Fusion (docs/results/training.md, "The training and fusion study on cached BlockRank"): ``alpha * z(first stage) + (1 - alpha) * z(reranker)``,
each score z-scored over one query's candidates (population standard deviation; a
constant list gives zeros). With no first-stage scores (``/rerank``), the first-stage score
is the reciprocal rank ``1 / rank`` of the given order (:func:`reciprocal_ranks`).
Reciprocal rank fusion (:func:`rrf`) scores a rank ``1 / (60 + rank)``
(docs/design/algorithms.md section 5).

Works on numpy arrays and torch tensors alike (gradients flow through torch); this module
imports neither at import time.
"""

from __future__ import annotations

from dataclasses import dataclass

import math
from collections.abc import Mapping, Sequence
from typing import Any

from heedrank.textrules import is_number

EPS = 1e-12
"""Spreads (a standard deviation, a max - min range) at or below this count as zero: the
slice is constant, and :func:`standardize` gives zeros, :func:`minmax` ones."""

RRF_K = 60
"""The constant of reciprocal rank fusion (Cormack et al., SIGIR 2009)."""


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def standardize(x: Any, axis: int = 0) -> Any:
    """``(x - mean) / std`` along ``axis`` (population std; a constant slice gives zeros).

    Args:
        x: numpy array or torch tensor, any float dtype (e.g. ``(N,)`` scores of one query's
            candidates, or ``(N, F)`` features, standardised per column with ``axis=0``).

    Returns:
        The same type, shape and dtype as ``x``; unitless.
    """
    if _is_torch(x):
        import torch

        mu = x.mean(dim=axis, keepdim=True)
        sd = x.std(dim=axis, unbiased=False, keepdim=True)
        return (x - mu) / torch.where(sd > EPS, sd, torch.ones_like(sd))
    import numpy as np

    x = np.asarray(x)
    mu = x.mean(axis=axis, keepdims=True)
    sd = x.std(axis=axis, keepdims=True)
    return (x - mu) / np.where(sd > EPS, sd, 1.0)


def standardized_weights(x: Any, weights: Any, axis: int = 0) -> Any:
    """The weights of a linear map on :func:`standardize` ``(x)`` carried to raw ``x``:
    ``w / sd`` per column, 0 for a constant column (``sd <= EPS``), so that
    ``standardize(x) @ w == x @ standardized_weights(x, w) - const`` (one constant per slice).

    Args:
        x: ``(N, F)`` numpy array or torch tensor (features of one query's candidates).
        weights: ``(F,)`` weights, same type.
        axis: The axis standardised over (0: per column).

    Returns:
        ``(F,)`` weights (units of ``1 / x``), the type of ``x``.
    """
    if _is_torch(x):
        import torch

        sd = x.std(dim=axis, unbiased=False)
        return torch.where(sd > EPS, weights / torch.where(sd > EPS, sd, torch.ones_like(sd)), torch.zeros_like(sd))
    import numpy as np

    sd = np.asarray(x).std(axis=axis)
    return np.where(sd > EPS, np.asarray(weights) / np.where(sd > EPS, sd, 1.0), 0.0)


def minmax(x: Any, axis: int = 0) -> Any:
    """``(x - min) / (max - min)`` along ``axis``, into ``[0, 1]``; a constant slice
    (``max - min <= EPS``) gives ones.

    Args:
        x: numpy array or torch tensor, any float dtype (e.g. ``(N,)`` scores of one ranking).

    Returns:
        The same type, shape and dtype as ``x``; unitless, in ``[0, 1]``.
    """
    if _is_torch(x):
        import torch

        lo, hi = x.amin(dim=axis, keepdim=True), x.amax(dim=axis, keepdim=True)
        span = hi - lo
        return torch.where(span > EPS, (x - lo) / torch.where(span > EPS, span, torch.ones_like(span)),
                           torch.ones_like(x))
    import numpy as np

    x = np.asarray(x)
    lo, hi = x.min(axis=axis, keepdims=True), x.max(axis=axis, keepdims=True)
    span = hi - lo
    return np.where(span > EPS, (x - lo) / np.where(span > EPS, span, 1.0), 1.0)


def rrf(rank: Any, k: float = RRF_K) -> Any:
    """``1 / (k + rank)``: the reciprocal-rank-fusion score of a 1-based ``rank``
    (docs/design/algorithms.md section 5).

    Args:
        rank: 1-based rank(s): an int, or a numpy array / torch tensor of them.
        k: Smoothing constant (:data:`RRF_K`).

    Returns:
        Unitless score(s) in ``(0, 1 / (k + 1)]``, the type of ``rank`` (a float for an int).

    Example:
        >>> round(rrf(1), 5), round(rrf(2, k=0), 5)
        (0.01639, 0.5)
    """
    return 1.0 / (k + rank)


def sigmoid(x: Any) -> Any:
    """The logistic function ``1 / (1 + exp(-x))``, computed without overflow for large ``|x|``.

    Args:
        x: A float, or a numpy array of any shape.

    Returns:
        A float in ``[0, 1]`` for a float; else a float64 array of ``x``'s shape.
    """
    if isinstance(x, (int, float)):
        if x >= 0:
            return 1.0 / (1.0 + math.exp(-x))
        e = math.exp(x)
        return e / (1.0 + e)
    import numpy as np

    return np.exp(-np.logaddexp(0.0, -np.asarray(x, dtype=np.float64)))


@dataclass(frozen=True)
class Standardizer:
    """Fixed statistics of :func:`standardize`, fitted once (a model's training features) and
    applied to other data: ``(x - mean) / std`` per column.

    Attributes:
        mean: float64 ``(F,)`` column means.
        std: float64 ``(F,)`` column standard deviations (population), 1 for a constant column
            (``<= EPS``), so it maps to zeros.
    """

    mean: Any
    std: Any

    @classmethod
    def fit(cls, x: Any, weights: Any = None) -> Standardizer:
        """The statistics of ``x`` (float ``(N, F)``, or ``(N,)`` as one column) over its rows,
        weighted by ``weights`` (``(N,)``, non-negative) when given."""
        import numpy as np

        x = np.asarray(x, dtype=np.float64)
        mean = np.average(x, axis=0, weights=weights)
        std = np.sqrt(np.average((x - mean) ** 2, axis=0, weights=weights))
        return cls(mean, np.where(std > EPS, std, 1.0))

    def __call__(self, x: Any) -> Any:
        """``(x - mean) / std``, float64."""
        import numpy as np

        return (np.asarray(x, dtype=np.float64) - self.mean) / self.std


def fuse(first_stage: Any, reranker: Any, alpha: float) -> Any:
    """``alpha * z(first_stage) + (1 - alpha) * z(reranker)`` over one query's candidates.

    Args:
        first_stage: ``(N,)`` first-stage scores (or :func:`reciprocal_ranks`), numpy or torch.
        reranker: ``(N,)`` reranker scores, same order, same type.
        alpha: Weight of the first stage in ``[0, 1]``.

    Returns:
        ``(N,)`` fused scores (unitless), float64 for numpy input.
    """
    if not _is_torch(reranker):
        import numpy as np

        first_stage = np.asarray(first_stage, dtype=np.float64)
        reranker = np.asarray(reranker, dtype=np.float64)
    return combine(standardize(first_stage), standardize(reranker), alpha)


def combine(z_first: Any, z_reranker: Any, alpha: float) -> Any:
    """``alpha * z_first + (1 - alpha) * z_reranker``: the fusion of already standardised
    scores (floats, arrays or tensors)."""
    return alpha * z_first + (1.0 - alpha) * z_reranker


def standardize_list(values: Sequence[float]) -> list[float]:
    """:func:`standardize` of one query's scores given as a list (float64), as a list; fewer
    than two values give zeros."""
    if len(values) < 2:
        return [0.0] * len(values)
    return [float(v) for v in standardize(list(values))]


def unit_or_keyword(value: Any, keywords: Mapping[str, Any], message: str) -> Any:
    """``value`` read as a request field that takes a number in [0, 1] or a keyword:
    ``None`` -> ``None``; a keyword (text, any case and surrounding blanks) -> its entry in
    ``keywords``; a number or its text in [0, 1] -> that float.

    Raises:
        ValidationError: anything else; ``message`` is its text, ``{value!r}`` in it replaced.
    """
    from heedrank.errors import ValidationError

    if isinstance(value, str):
        text = value.strip().lower()
        if text in keywords:
            return keywords[text]
        try:
            value = float(text)
        except ValueError:
            value = -1.0
    if value is None:
        return None
    if not is_number(value) or not 0.0 <= float(value) <= 1.0:
        raise ValidationError(message.format(value=value))
    return float(value)


def resolve_weight(value: float | str | None, recorded: Any = None, *, name: str = "fusion") -> float | None:
    """The fusion weight ``alpha`` that a ``fusion`` value names: ``None``/``"none"`` -> no fusion,
    ``"default"`` -> ``recorded`` (the method's weight, ``None`` when it records none), else the
    number (a number or its text) in ``[0, 1]``.

    Raises:
        ValidationError: anything else, or a number outside [0, 1] (the message names ``name``).
    """
    default = None if recorded is None else float(recorded)
    return unit_or_keyword(value, {"none": None, "default": default},
                           name + " must be a number between 0 and 1, got {value!r} (or 'default', 'none')")


def reciprocal_ranks(n: int) -> list[float]:
    """``[1, 1/2, ..., 1/n]``: the first-stage score of a list given in first-stage order."""
    return [1.0 / (i + 1) for i in range(n)]

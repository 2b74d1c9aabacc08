"""Standardisation and fusion of first-stage and reranker scores: the one implementation
that serving (:meth:`heedrank.pipeline.Pipeline.search`), the query-adapter training and the
training study all call, so that a weights card and a fusion weight chosen on dev mean the
same thing where they are used (``tests/heedrank/test_scoring_parity.py``).

Fusion (docs/RESULTS.md, "Fusion"): ``alpha * z(first stage) + (1 - alpha) * z(reranker)``,
each score z-scored over one query's candidates (population standard deviation; a
constant list gives zeros). With no first-stage scores (``/rerank``), the first-stage score
is the reciprocal rank ``1 / rank`` of the given order (:func:`reciprocal_ranks`).

Works on numpy arrays and torch tensors alike (gradients flow through torch); this module
imports neither.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

EPS = 1e-12
"""Standard deviations at or below this count as zero (the z-scores are then 0)."""


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
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= float(value) <= 1.0:
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

"""Shared argument checks of the retrievers."""

from __future__ import annotations

import operator

from attnrank.errors import ValidationError
from attnrank.protocols import Filter


def check_request(k: int, filter: Filter | None) -> int:
    """Validate ``retrieve`` arguments and return ``k`` as an ``int``.

    An empty filter (``{}``) means no filter.

    Raises:
        ValidationError: ``k`` is not an integer >= 1, or a non-empty metadata filter is
            given (not supported yet).
    """
    try:
        kk = operator.index(k)
    except TypeError:
        raise ValidationError(f"k must be a positive integer, got {k!r}") from None
    if isinstance(k, bool) or kk < 1:
        raise ValidationError(f"k must be a positive integer, got {k!r}")
    if filter:
        raise ValidationError("metadata filters are not supported yet")
    return kk

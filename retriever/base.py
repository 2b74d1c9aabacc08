"""Shared argument checks of the retrievers."""

from __future__ import annotations

import operator

from attnrank.errors import ValidationError
from attnrank.protocols import Filter


def check_request(k: int, filter: Filter | None = None) -> int:
    """Validate ``retrieve`` arguments and return ``k`` as an ``int``.

    The filter is parsed (:func:`index.filters.parse_filter`) so that a malformed one
    fails before any work; an empty filter (``{}``) means no filter.

    Raises:
        ValidationError: ``k`` is not an integer >= 1.
        FilterError: an invalid filter (the message names the offending clause).
    """
    try:
        kk = operator.index(k)
    except TypeError:
        raise ValidationError(f"k must be a positive integer, got {k!r}") from None
    if isinstance(k, bool) or kk < 1:
        raise ValidationError(f"k must be a positive integer, got {k!r}")
    if filter is not None:
        from index.filters import parse_filter

        parse_filter(filter)
    return kk

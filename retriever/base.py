"""Shared argument checks of the retrievers."""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING

from heedrank.errors import ValidationError
from heedrank.protocols import FilterArg

if TYPE_CHECKING:
    from heedrank.index.filters import BoolFilter


def check_args(k: int, filter: FilterArg | None = None) -> tuple[int, BoolFilter | None]:
    """Validate ``retrieve`` arguments: ``k`` as an ``int`` and the filter in parsed form.

    A JSON filter is parsed here, once, so that a malformed one fails before any work and
    the stages below get the parsed object; a filter parsed already (by the pipeline) is
    passed through (:func:`heedrank.index.filters.as_filter`). ``{}`` means no filter (``None``).

    Raises:
        ValidationError: ``k`` is not an integer >= 1.
        FilterError: an invalid filter (the message names the offending clause).
    """
    from heedrank.index.filters import as_filter

    try:
        kk = operator.index(k)
    except TypeError:
        raise ValidationError(f"k must be a positive integer, got {k!r}") from None
    if isinstance(k, bool) or kk < 1:
        raise ValidationError(f"k must be a positive integer, got {k!r}")
    return kk, as_filter(filter)

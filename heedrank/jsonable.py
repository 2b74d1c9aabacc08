"""One conversion to JSON-ready values, shared by the service (``GET /info``), the Ray
engine (a reranker's ``describe()`` sent back by a worker) and the evaluation reports."""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def jsonable(value: Any) -> Any:
    """Convert to JSON-compatible values: mappings -> dict, sequences -> list, paths -> str,
    numpy scalars -> Python numbers, non-finite floats -> ``None``."""
    if isinstance(value, Mapping):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value) if isinstance(value, (set, frozenset)) else value
        return [jsonable(v) for v in items]
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if hasattr(value, "item") and callable(value.item):  # numpy scalar
        value = value.item()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, int):
        return value
    return str(value)

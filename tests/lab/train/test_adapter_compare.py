"""Two adapters side by side (:mod:`heedrank.lab.train.adapter_compare`) on tiny inline sources:
an adapter whose attention sees relevance better scores higher on the attention alone and on the
scorers fitted with it, the first stage and the embedder are the same for both, and sets that
differ in queries are refused."""

from __future__ import annotations

import numpy as np
import pytest

from heedrank.lab.train.adapter_compare import VARIANTS, compare_adapters, format_comparison
from heedrank.lab.train.source_choice import Source

from test_source_choice import _source  # noqa: E402  (the sources of the choice's own tests)


def _adapter(strength: float) -> tuple[list[Source], list[Source]]:
    """The same queries, candidates and labels for every adapter (seeded); only the attention's
    strength differs."""
    return [_source("fit", 11, strength, n_queries=60)], [_source("test", 12, strength, n_queries=60)]


def test_the_stronger_attention_wins_every_row_it_enters() -> None:
    report = compare_adapters({"old": _adapter(0.2), "new": _adapter(3.0)})
    rows = report["sets"]["test"]["rows"]
    assert report["adapters"] == ["old", "new"] and report["sets"]["test"]["queries"] == 60
    for same in ("first stage", "dense"):
        assert rows[same]["old"] == rows[same]["new"] and rows[same]["new - old"] == 0.0 and "vs dense" not in rows[same]
    for row in ("attention", *VARIANTS):
        assert rows[row]["new"] > rows[row]["old"] + 5 and rows[row]["p"] < 0.01
        diff, p = rows[row]["vs dense"]["new"]
        assert diff == pytest.approx(rows[row]["new"] - rows["dense"]["new"]) and 0 <= p <= 1
    table = format_comparison(report)
    assert "| attention |" in table and "test (60 queries)" in table


def test_sets_of_other_queries_are_refused() -> None:
    fit, tests = _adapter(1.0)
    other = [_source("test", 13, 1.0, n_queries=50)]
    with pytest.raises(ValueError, match="different queries"):
        compare_adapters({"a": (fit, tests), "b": (fit, other)})
    with pytest.raises(ValueError, match="two adapters"):
        compare_adapters({"a": (fit, tests)})


def test_rows_are_means_of_per_query_values() -> None:
    report = compare_adapters({"a": _adapter(1.0), "b": _adapter(1.0)})
    rows = report["sets"]["test"]["rows"]
    assert all(r["a"] == pytest.approx(r["b"]) for r in rows.values())
    assert np.isfinite([r["a"] for r in rows.values()]).all()

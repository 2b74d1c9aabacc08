"""Two query adapters side by side, paired: does one make the attention add more to the embedder?

Each adapter has feature dumps of the same queries (``heedrank lab dump --adapter``): one or more
*fit* sources (e.g. 150 of MS MARCO dev-600's train-fold queries that neither adapter trained on)
and *test* sets (dev-600's test fold, TREC DL 2019). For each adapter, on the same candidates:

- the first stage alone, the embedder alone (cosine), the attention alone (the card's
  ``independent`` log-odds, :func:`heedrank.lab.train.scorer_fit.signals`);
- ``direction``: :func:`heedrank.lab.train.source_choice.fit_direction` over attention, dense and
  rank, fitted on the fit sources and served on each test set as the product serves a scorer;
- ``heads + direction``: the attention's head weights refitted on the fit sources' per-head features
  (cross-fitted halves for the direction's own fit, :func:`heedrank.lab.train.source_choice`'s
  ``heads`` configuration), then the direction.

Every row is a mean over the test set's queries (nDCG@10 or MRR@10 x 100); the paired
randomization p-values (:func:`heedrank.eval.compare.randomization_test`) compare the second
adapter with the first on each row, and each scorer with the embedder alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from heedrank.lab.train.source_choice import (
    DENSE, SIGNALS, Source, _refit_attention, baselines, fit_direction, fit_heads, serve, with_attention,
)
from heedrank.scorer import Scorer

VARIANTS = ("direction", "heads + direction")
"""The scorers fitted per adapter (module docstring)."""


HEAD_C = 0.003
"""Inverse L2 strength of the refitted head weights (the middle of the choice's ``HEAD_CS``)."""


def adapter_rows(fit: Sequence[Source], tests: Sequence[Source]) -> dict[str, dict[str, np.ndarray]]:
    """Per test set, ``{row: (Q,) per-query values}`` of the single signals and the
    :data:`VARIANTS` fitted on ``fit`` (one adapter's dumps), each fitted once and read on every set."""
    direction, _ = fit_direction(fit, [s.values for s in fit], SIGNALS)
    train_values, _ = _refit_attention(tuple(fit), fit[0], HEAD_C)  # cross-fitted on the fit sources
    refitted, _ = fit_direction(fit, train_values, SIGNALS)
    w, b = fit_heads(fit, None, HEAD_C)  # the head weights a test set reads: fitted on every fit row
    out: dict[str, dict[str, np.ndarray]] = {}
    for test in tests:
        rows = dict(baselines(test))
        rows["direction"] = test.per_query(serve(Scorer((direction,), 0.5), test.values, SIGNALS))
        heads = with_attention(test, [x @ w + b for x in test.heads])
        rows["heads + direction"] = test.per_query(serve(Scorer((refitted,), 0.5), heads, SIGNALS))
        out[test.name] = rows
    return out


def compare_adapters(sources: Mapping[str, tuple[Sequence[Source], Sequence[Source]]]) -> dict[str, Any]:
    """Both adapters' rows and the paired differences.

    Args:
        sources: ``{adapter: (fit sources, test sets)}`` (:func:`heedrank.lab.train.source_choice.load_source`
            of each adapter's dumps), two adapters, the first the reference, with the same test sets
            (same names, same queries in the same order).

    Returns:
        ``{"adapters": [a, b], "sets": {set: {"queries": Q, "rows": {row: {a: mean, b: mean,
        "b - a": diff, "p": p[, "vs dense": {a: [diff, p], b: [diff, p]}]}}}}}``.

    Raises:
        ValueError: not two adapters, or test sets that differ in names or queries.
    """
    from heedrank.eval.compare import randomization_test

    if len(sources) != 2:
        raise ValueError(f"two adapters are compared, got {list(sources)}")
    names = list(sources)
    rows: dict[str, dict[str, dict[str, np.ndarray]]] = {}
    queries: dict[str, list[str]] = {}
    for adapter, (fit, tests) in sources.items():
        for t in tests:
            ids = [it.query_id for it in t.items]
            if queries.setdefault(t.name, ids) != ids:
                raise ValueError(f"{t.name}: the two adapters' test sets hold different queries")
        rows[adapter] = adapter_rows(fit, tests)
    a, b = names
    if set(rows[a]) != set(rows[b]):
        raise ValueError(f"the adapters' test sets differ: {sorted(rows[a])} and {sorted(rows[b])}")

    def paired(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        return float((y - x).mean()), float(randomization_test(list(y - x)))

    report: dict[str, Any] = {"adapters": names, "sets": {}}
    for name, ids in queries.items():
        table: dict[str, Any] = {}
        for row in rows[a][name]:
            x, y = rows[a][name][row], rows[b][name][row]
            diff, p = paired(x, y)
            entry: dict[str, Any] = {a: float(x.mean()), b: float(y.mean()), f"{b} - {a}": diff, "p": p}
            if row not in ("first stage", DENSE):
                entry["vs dense"] = {k: list(paired(rows[k][name][DENSE], rows[k][name][row])) for k in names}
            table[row] = entry
        report["sets"][name] = {"queries": len(ids), "rows": table}
    return report


def format_comparison(report: Mapping[str, Any]) -> str:
    """One markdown table per test set."""
    a, b = report["adapters"]
    lines = []
    for name, s in report["sets"].items():
        lines += [f"\n{name} ({s['queries']} queries)\n",
                  f"| row | {a} | {b} | {b} - {a} (p) | {a} - embedder (p) | {b} - embedder (p) |",
                  "|---|---|---|---|---|---|"]
        for row, e in s["rows"].items():
            vd = e.get("vs dense")
            extra = (f"{vd[a][0]:+.2f} ({vd[a][1]:.3f}) | {vd[b][0]:+.2f} ({vd[b][1]:.3f})" if vd else " | ")
            lines.append(f"| {row} | {e[a]:.2f} | {e[b]:.2f} | {e[f'{b} - {a}']:+.2f} ({e['p']:.3f}) | {extra} |")
    return "\n".join(lines)

"""Paired comparison of two evaluation reports.

For every metric both reports have, the per-query differences ``d_i = B_i - A_i`` over the
queries both reports evaluated are tested with a two-sided paired randomization test
(sign flipping, Fisher / Smucker et al. 2007): under the null hypothesis that A and B are
exchangeable, each ``d_i`` is equally likely to have either sign, so the p-value is the
share of random sign assignments whose ``|mean|`` is at least the observed ``|mean(d)|``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from heedrank.errors import ValidationError
from heedrank.eval.report import EvalReport, load_report

logger = logging.getLogger(__name__)

_EXACT_MAX_QUERIES = 16
"""Up to this many queries, all ``2**n`` sign assignments are enumerated (exact p-value)."""

_CHUNK = 2048


@dataclass(frozen=True)
class MetricDelta:
    """One metric's paired comparison.

    Attributes:
        metric: Metric name.
        a: Mean of A over the shared queries (in [0, 1]).
        b: Mean of B over the shared queries.
        delta: ``b - a``.
        p_value: Two-sided randomization-test p-value, in (0, 1].
        wins: Queries where B > A.
        losses: Queries where B < A.
        ties: Queries where B == A.
    """

    metric: str
    a: float
    b: float
    delta: float
    p_value: float
    wins: int
    losses: int
    ties: int


@dataclass(frozen=True)
class Comparison:
    """Result of :func:`compare_reports`.

    Attributes:
        a_name: Name (label) of the baseline report.
        b_name: Name (label) of the treatment report.
        query_ids: Queries evaluated by both reports, sorted.
        only_a: Number of queries only A evaluated (left out).
        only_b: Number of queries only B evaluated (left out).
        deltas: One :class:`MetricDelta` per shared metric, in A's metric order.
        trials: Random sign assignments drawn (``0`` when the test was exact).
        seed: Seed of the random sign assignments.
    """

    a_name: str
    b_name: str
    query_ids: list[str]
    only_a: int
    only_b: int
    deltas: list[MetricDelta] = field(default_factory=list)
    trials: int = 0
    seed: int = 0


def randomization_test(diffs: Sequence[float], trials: int = 10_000, seed: int = 0) -> float:
    """Two-sided paired randomization (sign-flip) test of ``mean(diffs) == 0``.

    Args:
        diffs: Per-query differences ``B - A``.
        trials: Random sign assignments; with at most 16 differences all ``2**n``
            assignments are enumerated instead (exact test) and ``trials`` is unused.
        seed: Seed of numpy's ``default_rng`` for the random assignments.

    Returns:
        The p-value in (0, 1]: ``(count + 1) / (trials + 1)`` for the Monte Carlo test
        (the observed assignment counts once), ``count / 2**n`` for the exact test, where
        ``count`` counts assignments with ``|mean| >= |observed mean|`` (up to 1e-12).
        1.0 when every difference is 0 or there are none.

    Raises:
        ValidationError: ``trials < 1``.
    """
    import numpy as np

    if trials < 1:
        raise ValidationError(f"trials must be >= 1, got {trials}")
    d = np.asarray(diffs, dtype=np.float64)
    n = d.size
    if n == 0 or not np.any(d):
        return 1.0
    observed = abs(d.mean())
    tol = 1e-12 * max(1.0, observed)
    if n <= _EXACT_MAX_QUERIES:
        codes = np.arange(2**n, dtype=np.int64)[:, None]
        signs: np.ndarray = 1.0 - 2.0 * ((codes >> np.arange(n, dtype=np.int64)) & 1)
        count = int(np.sum(np.abs(signs @ d) / n >= observed - tol))
        return count / 2**n
    rng = np.random.default_rng(seed)
    count = 0
    done = 0
    while done < trials:
        m = min(_CHUNK, trials - done)
        signs = rng.integers(0, 2, size=(m, n), dtype=np.int8) * 2 - 1
        count += int(np.sum(np.abs(signs @ d) / n >= observed - tol))
        done += m
    return (count + 1) / (trials + 1)


def compare_reports(
    a_path: str | Path | EvalReport,
    b_path: str | Path | EvalReport,
    trials: int = 10_000,
    seed: int = 0,
    metrics: Sequence[str] | None = None,
) -> Comparison:
    """Per-metric deltas (B - A) over the shared queries, with randomization-test p-values.

    Args:
        a_path: Baseline report (path or loaded report).
        b_path: Treatment report (path or loaded report).
        trials: Random sign assignments per metric (see :func:`randomization_test`).
        seed: Seed of the sign assignments (the same for every metric).
        metrics: Metrics to compare; default: those both reports have, in A's order.

    Returns:
        The :class:`Comparison`.

    Raises:
        NotFoundError: a report file does not exist.
        ValidationError: no shared query or no shared metric; a requested metric missing.
    """
    a = a_path if isinstance(a_path, EvalReport) else load_report(a_path)
    b = b_path if isinstance(b_path, EvalReport) else load_report(b_path)
    if (a.dataset, a.split) != (b.dataset, b.split):
        logger.warning("comparing reports of different data: %s/%s vs %s/%s", a.dataset, a.split, b.dataset, b.split)
    qa, qb = set(a.per_query), set(b.per_query)
    shared = sorted(qa & qb)
    if not shared:
        raise ValidationError(f"reports {a.name!r} and {b.name!r} share no evaluated query")
    if qa != qb:
        logger.warning("comparing over %d shared queries (%d only in A, %d only in B)",
                       len(shared), len(qa - qb), len(qb - qa))
    common = [m for m in a.metrics if m in b.metrics]
    if metrics is None:
        names = common
    else:
        missing = [m for m in metrics if m not in common]
        if missing:
            raise ValidationError(f"metrics {missing} are not in both reports; shared metrics: {common}")
        names = list(metrics)
    if not names:
        raise ValidationError(f"reports {a.name!r} and {b.name!r} share no metric ({list(a.metrics)} vs {list(b.metrics)})")

    deltas = []
    for m in names:
        va = [_value(a, q, m) for q in shared]
        vb = [_value(b, q, m) for q in shared]
        diffs = [y - x for x, y in zip(va, vb)]
        mean_a, mean_b = math.fsum(va) / len(va), math.fsum(vb) / len(vb)
        deltas.append(MetricDelta(
            metric=m, a=mean_a, b=mean_b, delta=mean_b - mean_a,
            p_value=randomization_test(diffs, trials=trials, seed=seed),
            wins=sum(x > 0 for x in diffs), losses=sum(x < 0 for x in diffs), ties=sum(x == 0 for x in diffs),
        ))
    exact = len(shared) <= _EXACT_MAX_QUERIES
    return Comparison(a.label, b.label, shared, len(qa - qb), len(qb - qa), deltas, 0 if exact else trials, seed)


def _value(report: EvalReport, qid: str, metric: str) -> float:
    value = report.per_query[qid].get(metric)
    if value is None:
        raise ValidationError(f"report {report.name!r} has no {metric!r} for query {qid!r}")
    return float(value)


def format_comparison(comparison: Comparison, alpha: float = 0.05) -> str:
    """A plain-text table: metric, A, B, delta (x100, one decimal), wins/losses/ties, p.

    Rows with ``p < alpha`` are marked ``*``.
    """
    c = comparison
    test = "exact" if c.trials == 0 else f"{c.trials} trials, seed {c.seed}"
    head = [
        f"A: {c.a_name}",
        f"B: {c.b_name}",
        f"queries: {len(c.query_ids)} shared"
        + (f" ({c.only_a} only in A, {c.only_b} only in B, left out)" if c.only_a or c.only_b else "")
        + f"; paired randomization test ({test})",
    ]
    header = ["metric", "A", "B", "B-A", "W/L/T", "p", ""]
    rows = [
        [d.metric, f"{100 * d.a:.1f}", f"{100 * d.b:.1f}", f"{100 * d.delta:+.1f}",
         f"{d.wins}/{d.losses}/{d.ties}", f"{d.p_value:.4f}", "*" if d.p_value < alpha else ""]
        for d in c.deltas
    ]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(x.ljust(w) if i == 0 else x.rjust(w) for i, (x, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join(head + [line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])

"""The scorer's query gate (:class:`heedrank.scorer.QueryGate`), chosen on a source of long queries.

The scorer (:mod:`heedrank.lab.train.source_choice`) is fitted on sources whose queries are short
(their dumps' longest query: 24 words); the long-query source (:mod:`heedrank.lab.long_queries`: NFCorpus documents
as queries, median 223 words) shows what its attention is worth past them. The gate's ``limit``
is the longest query of the scorer's sources (a rule: the attention keeps its fitted weight over
the lengths it was fitted on); its target model (:data:`TARGETS`: the embedder alone) and
``power`` (:data:`POWERS`) are chosen on the long source (the highest
value there; ties: the smallest power, the least change). The scorer's sources are
read again with the gate, so that a short query's score is seen unchanged (no query of theirs
is longer than ``limit``).

Reported per source (:func:`choose_gate`): the first stage alone, the embedder alone, the
attention alone, the scorer without the gate and with each power, and the paired difference of
the gated scorer against the embedder and against the ungated one (randomization p).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from heedrank.lab.train.source_choice import Source, baselines, serve
from heedrank.scorer import QueryGate, Scorer
from heedrank.signals.dense import NAME as DENSE
from heedrank.signals.query import NAME as QUERY_WORDS

logger = logging.getLogger(__name__)

POWERS = (0.5, 1.0, 2.0, math.inf)
"""Powers of the gate tried (``inf``: past ``limit`` the score is the target model's)."""

STEEP = 64.0
"""The power written for ``inf``: ``(24 / 30) ** 64`` is below 1e-6, the target model alone."""


def card_power(power: float) -> float:
    """``power`` as a card holds it (:data:`STEEP` for ``inf``)."""
    return STEEP if math.isinf(power) else float(power)

TARGETS: dict[str, tuple[str, ...]] = {"embedder": (DENSE,)}
"""The models a long query's score may lean on (:attr:`heedrank.scorer.QueryGate.toward`): the
embedder alone (the candidate's model less the attention lost: tag ``exp/gate-toward-no-attention``)."""


def gated(scorer: Scorer, limit: float, power: float, toward: tuple[str, ...] = (DENSE,)) -> Scorer:
    """``scorer`` with the gate ``(limit, power, toward)`` (``inf``: :func:`card_power`)."""
    from dataclasses import replace

    return replace(scorer, gate=QueryGate(QUERY_WORDS, float(limit), card_power(power), tuple(toward)))


def row_name(target: str, power: float) -> str:
    """The report's row of a gate."""
    return f"gate toward {target}, power {power:g}"


def served(scorer: Scorer, source: Source) -> np.ndarray:
    """``(Q,)`` per-query metric x 100 of ``scorer`` served on ``source``."""
    return source.per_query(serve(scorer, source.values, list(scorer.features)))


def choose_gate(scorer: Scorer, sources: Sequence[Source], long: Source, powers: Sequence[float] = POWERS
                ) -> dict[str, Any]:
    """Choose the gate's power on ``long`` for ``scorer`` (the card's, fitted on ``sources``).

    Returns:
        ``{"limit", "power", "sets": {name: {"queries", "words": {...}, "rows": {row: value},
        "paired": {row: {"vs dense": [diff, p], "vs ungated": [diff, p]}}}}, "power", "toward"}``:
        the gate with the highest value on ``long`` (:data:`TARGETS` x ``powers``; ties: the smaller
        power), ``None`` (no gate) when none beats the ungated scorer there.
    """
    from heedrank.eval.compare import randomization_test

    limit = float(max(max(s.query_words) for s in sources))
    report: dict[str, Any] = {"limit": limit, "sets": {}}
    per: dict[str, dict[str, np.ndarray]] = {}
    for s in (*sources, long):
        rows = dict(baselines(s))
        rows["default, no gate"] = served(scorer, s)
        for target, toward in TARGETS.items():
            for p in powers:
                rows[row_name(target, p)] = served(gated(scorer, limit, p, toward), s)
        per[s.name] = rows
        words = sorted(s.query_words)
        report["sets"][s.name] = {"queries": len(s.items), "metric": s.metric,
                                  "words": {"median": words[len(words) // 2], "max": words[-1]},
                                  "rows": {k: float(v.mean()) for k, v in rows.items()}}
        logger.info("%s: %s", s.name, {k: round(float(v.mean()), 2) for k, v in rows.items()})
    options = [(t, p) for t in TARGETS for p in powers]
    best = max(options, key=lambda tp: (float(per[long.name][row_name(*tp)].mean()), -tp[1]))
    gain = float(per[long.name][row_name(*best)].mean() - per[long.name]["default, no gate"].mean())
    report["power"] = best[1] if gain > 0 else None
    report["toward"] = list(TARGETS[best[0]]) if gain > 0 else None
    for name, rows in per.items():
        report["sets"][name]["paired"] = {
            k: {"vs dense": _paired(rows["dense"], v, randomization_test),
                "vs ungated": _paired(rows["default, no gate"], v, randomization_test)}
            for k, v in rows.items() if k.startswith("gate") or k == "default, no gate"}
    return report


def _paired(x: np.ndarray, y: np.ndarray, test: Any) -> list[float]:
    d = y - x
    return [float(d.mean()), float(test(list(d))) if np.any(d != 0) else 1.0]


def gate_entry(report: Mapping[str, Any]) -> dict[str, Any] | None:
    """The card's ``scorer.gate`` of :func:`choose_gate`'s choice (``None``: no gate)."""
    if report["power"] is None:
        return None
    return {"signal": QUERY_WORDS, "limit": report["limit"], "power": card_power(report["power"]),
            "toward": report["toward"],
            "sets": {n: {"queries": s["queries"], "words": s["words"],
                         "rows": {k: round(v, 2) for k, v in s["rows"].items()}} for n, s in report["sets"].items()}}


def format_gate(report: Mapping[str, Any]) -> str:
    """A markdown table: each set's single signals, the ungated scorer and each gate (paired with
    the embedder alone and with the ungated scorer)."""
    lines = [f"gate limit: {report['limit']:g} words (the scorer's sources' longest query); chosen: power "
             f"{report['power']}, toward {report.get('toward')}", ""]
    for name, s in report["sets"].items():
        lines += [f"### {name} ({s['queries']} queries, {s['metric']}, median {s['words']['median']} words, "
                  f"longest {s['words']['max']})", "", "| row | value | vs embedder (p) | vs ungated (p) |",
                  "|---|---|---|---|"]
        for k, v in s["rows"].items():
            pd = s["paired"].get(k)
            cells = ["", ""] if pd is None else [f"{pd['vs dense'][0]:+.2f} ({pd['vs dense'][1]:.3f})",
                                                 f"{pd['vs ungated'][0]:+.2f} ({pd['vs ungated'][1]:.3f})"]
            lines.append(f"| {k} | {v:.2f} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)

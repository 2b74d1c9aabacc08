"""Does the scorer's probability mean what it says? Its calibration on judged candidate lists.

For each set (a feature dump of the served reranker, :func:`heedrank.lab.train.source_choice.load_source`)
and each weights card's scorer, every candidate is served as ``/rerank`` serves it (the attention
and the embedder's cosine, no first-stage rank: the given order is a client's) and as ``/search``
serves it (every signal), and compared with its label (relevant from the set's lowest relevant grade):

- the relevant share of the candidates against their mean probability;
- the top candidate of each list: its mean probability against how often it is relevant;
- the expected calibration error (10 equal-width bins, weighted by the candidates in each);
- the reliability of ``/rerank``'s probability (:data:`RELIABILITY`): in each bin of probability, its
  candidates' mean probability against their relevant share (where a document like the obvious
  ``/rerank`` cases, a relevant passage sent alone, lands: about 0.55).

A set whose qrels judge one passage a query (MS MARCO dev-600) shows every probability too high:
its unjudged passages count as not relevant. TREC DL's pooled judgments do not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from heedrank.lab.train.source_choice import Source, serve
from heedrank.scorer import Scorer
from heedrank.signals.rank import NAME as RANK

BINS = 10
"""Equal-width bins of the calibration error."""

RELIABILITY = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 1.0)
"""Edges of the reliability table's probability bins (the last one holds 1.0)."""


def calibration(p: np.ndarray, y: np.ndarray, bins: int = BINS) -> float:
    """Expected calibration error of probabilities ``p`` ``(n,)`` against 0/1 labels ``y`` ``(n,)``."""
    idx = np.minimum((p * bins).astype(int), bins - 1)
    return float(sum(abs(p[idx == b].mean() - y[idx == b].mean()) * (idx == b).sum() for b in range(bins)
                     if (idx == b).any()) / len(p))


def reliability(p: np.ndarray, y: np.ndarray, edges: Sequence[float] = RELIABILITY) -> list[dict[str, float | None]]:
    """Per bin ``[lo, hi)`` of probabilities ``p`` ``(n,)`` (the last bin closed): ``{"lo", "hi", "n",
    "mean p", "relevant"}``, the candidates' mean probability and relevant share (0/1 labels ``y``
    ``(n,)``); ``None`` for an empty bin's."""
    out = []
    for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:])):
        m = (p >= lo) & ((p < hi) if i < len(edges) - 2 else (p <= hi))
        out.append({"lo": lo, "hi": hi, "n": int(m.sum()), "mean p": float(p[m].mean()) if m.any() else None,
                    "relevant": float(y[m].mean()) if m.any() else None})
    return out


def check(scorers: Mapping[str, Scorer], sources: Sequence[Source]) -> dict[str, Any]:
    """Per set, path (``/rerank``, ``/search``) and card: ``{"relevant", "mean p", "top-1 p",
    "top-1 relevant", "ece", "bins"}`` (``bins``: :func:`reliability`)."""
    out: dict[str, Any] = {}
    for s in sources:
        y = s.labels()
        for path, drop in (("/rerank", {RANK}), ("/search", set())):
            for name, scorer in scorers.items():
                uses = [f for f in scorer.features if f not in drop]
                values = [{k: v for k, v in row.items() if k not in drop} for row in s.values]
                logits = serve(scorer, values, uses)
                p = 1.0 / (1.0 + np.exp(-np.concatenate(logits)))
                top = np.concatenate([np.arange(len(z)) == int(np.argmax(z)) for z in logits])
                out.setdefault(s.name, {}).setdefault(path, {})[name] = {
                    "queries": len(s.items), "relevant": float(y.mean()), "mean p": float(p.mean()),
                    "top-1 p": float(p[top].mean()), "top-1 relevant": float(y[top].mean()),
                    "ece": calibration(p, y), "bins": reliability(p, y)}
    return out


def format_check(report: Mapping[str, Any]) -> str:
    """Two markdown tables: a row per set, path and card; then ``/rerank``'s reliability, a row per
    set and card, each bin's relevant share against its mean probability (and its candidates)."""
    lines = ["| set | path | card | queries | relevant share | mean P | top-1 P | top-1 relevant | ECE |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, paths in report.items():
        for path, cards in paths.items():
            for card, r in cards.items():
                lines.append(f"| {name} | {path} | {card} | {r['queries']} | {r['relevant']:.3f} | {r['mean p']:.3f} | "
                             f"{r['top-1 p']:.3f} | {r['top-1 relevant']:.3f} | {r['ece']:.3f} |")
    lines += ["", "/rerank's reliability: relevant share / mean P (candidates) per bin of P", "",
              "| set | card | " + " | ".join(f"P {lo:g}-{hi:g}" for lo, hi in zip(RELIABILITY[:-1], RELIABILITY[1:]))
              + " |", "|---|---|" + "---|" * (len(RELIABILITY) - 1)]
    for name, paths in report.items():
        for card, r in paths.get("/rerank", {}).items():
            cells = [f"{b['relevant']:.2f} / {b['mean p']:.2f} ({b['n']})" if b["n"] else "-" for b in r["bins"]]
            lines.append(f"| {name} | {card} | " + " | ".join(cells) + " |")
    return "\n".join(lines)

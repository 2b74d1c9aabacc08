"""Does the scorer's probability mean what it says? Its calibration on judged candidate lists.

For each set (a feature dump of the served reranker, :func:`heedrank.lab.train.source_choice.load_source`)
and each weights card's scorer, every candidate is served as ``/rerank`` serves it (the attention
and the embedder's cosine, no first-stage rank: the given order is a client's) and as ``/search``
serves it (every signal), and compared with its label (relevant from the set's lowest relevant grade):

- the relevant share of the candidates against their mean probability;
- the top candidate of each list: its mean probability against how often it is relevant;
- the expected calibration error (10 equal-width bins, weighted by the candidates in each).

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


def calibration(p: np.ndarray, y: np.ndarray, bins: int = BINS) -> float:
    """Expected calibration error of probabilities ``p`` ``(n,)`` against 0/1 labels ``y`` ``(n,)``."""
    idx = np.minimum((p * bins).astype(int), bins - 1)
    return float(sum(abs(p[idx == b].mean() - y[idx == b].mean()) * (idx == b).sum() for b in range(bins)
                     if (idx == b).any()) / len(p))


def check(scorers: Mapping[str, Scorer], sources: Sequence[Source]) -> dict[str, Any]:
    """Per set, path (``/rerank``, ``/search``) and card: ``{"relevant", "mean p", "top-1 p",
    "top-1 relevant", "ece"}``."""
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
                    "ece": calibration(p, y)}
    return out


def format_check(report: Mapping[str, Any]) -> str:
    """One markdown table: a row per set, path and card."""
    lines = ["| set | path | card | queries | relevant share | mean P | top-1 P | top-1 relevant | ECE |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, paths in report.items():
        for path, cards in paths.items():
            for card, r in cards.items():
                lines.append(f"| {name} | {path} | {card} | {r['queries']} | {r['relevant']:.3f} | {r['mean p']:.3f} | "
                             f"{r['top-1 p']:.3f} | {r['top-1 relevant']:.3f} | {r['ece']:.3f} |")
    return "\n".join(lines)

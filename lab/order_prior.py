"""How ``/rerank`` should use the order documents are sent in: every candidate form measured on
given (first-stage) lists and on the same lists shuffled, from two runs (``heedrank lab
order-prior``; docs/results/default.md, "/rerank's default: a position prior").

The cached reranker's scores do not depend on the order of its candidates (each block sees only
the instruction and itself), so one pure run (``eval ... --fusion none``) gives its scores for any
order; the forms are then applied to the candidates in the given order or in a seeded shuffle,
exactly as :class:`heedrank.serving.ZFusion` applies them.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from heedrank.serving import PositionPrior, ZFusion

Form = Callable[[Sequence[float]], list[float]]
"""Served scores of one list from the reranker's scores in the given order (same order)."""


def forms() -> dict[str, Form]:
    """The candidate forms, by name: the reranker alone, today's fusion by rank, a log-rank prior
    at several strengths, and the agreement-gated prior (the default) at several settings."""
    pure, by_rank = ZFusion(alpha=None), ZFusion(alpha=0.6, by="rank")
    out: dict[str, Form] = {
        "reranker alone (fusion none)": lambda r: pure.served_scores((), r),
        "fused with the order by rank, alpha 0.6": lambda r: by_rank.served_scores((), r),
    }
    for weight in (0.5, 1.0, 1.5):
        out[f"log-rank prior, weight {weight}, always"] = PositionPrior(weight, onset=-1e9, width=1.0).scores
    for weight, onset, width in ((1.0, 0.5, 1.0), (1.5, 1.0, 0.5), (1.5, 1.5, 1.0)):
        out[f"agreement-gated prior, weight {weight}, onset {onset}, width {width}"] = PositionPrior(
            weight, onset, width).scores
    return out


@dataclass(frozen=True)
class Lists:
    """One evaluation set: each query's candidates in first-stage order and the reranker's scores."""

    candidates: Mapping[str, list[str]]
    scores: Mapping[str, Mapping[str, float]]
    qrels: Mapping[str, Mapping[str, int]]


def from_runs(first: Mapping[str, Mapping[str, float]], reranker: Mapping[str, Mapping[str, float]],
              qrels: Mapping[str, Mapping[str, int]], n: int) -> Lists:
    """The first stage's top ``n`` of each judged query, with the reranker run's scores of them."""
    cands = {}
    for q, hits in first.items():
        if q in qrels and q in reranker:
            top = [d for d, _ in sorted(hits.items(), key=lambda x: (-x[1], x[0]))[:n]]
            if all(d in reranker[q] for d in top):
                cands[q] = top
    return Lists(cands, reranker, qrels)


def ndcg10(lists: Lists, form: Form, shuffle_seed: int | None = None) -> float:
    """nDCG@10 (x100) of ``form`` over ``lists``, in the given order or shuffled with a seed."""
    import ir_measures
    from ir_measures import nDCG

    run = {}
    for q, cands in lists.candidates.items():
        order = list(cands)
        if shuffle_seed is not None:
            random.Random(f"{shuffle_seed}-{q}").shuffle(order)
        served = form([lists.scores[q][d] for d in order])
        run[q] = {d: float(s) for d, s in zip(order, served)}
    qrels = {q: dict(r) for q, r in lists.qrels.items()}  # a judged query without candidates counts 0, as in eval
    return 100.0 * float(ir_measures.calc_aggregate([nDCG @ 10], qrels, run)[nDCG @ 10])


def table(sets: Mapping[str, Lists], shuffles: int = 5) -> list[dict[str, object]]:
    """One row per form: nDCG@10 on each set given and shuffled (mean over ``shuffles`` seeds)."""
    rows: list[dict[str, object]] = []
    for name, form in forms().items():
        row: dict[str, object] = {"form": name}
        for label, lists in sets.items():
            row[f"{label} given"] = round(ndcg10(lists, form), 1)
            row[f"{label} shuffled"] = round(sum(ndcg10(lists, form, k) for k in range(shuffles)) / shuffles, 1)
        rows.append(row)
    return rows

"""Retrieval metrics computed with ``ir_measures`` (``pytrec_eval`` for nDCG/R/RR).

Metric names are ``ir_measures`` strings, e.g. ``"nDCG@10"``, ``"R@100"``, ``"RR@10"``,
``"Judged@10"``, ``"R(rel=2)@100"``. Conventions (the same as ``trec_eval`` unless said):

* **Evaluated queries**: queries that have at least one judgement in the qrels. Queries
  without qrels are *excluded* (they are listed in :attr:`Evaluation.excluded` and logged);
  judged queries with no retrieved document count 0 for every metric (``trec_eval -c``).
  Aggregates are arithmetic means over the evaluated queries.
* **Unjudged documents** count as non-relevant (``Judged@k`` measures how many there are).
* **Graded relevance**: nDCG uses linear gain (``trec_eval``'s ``ndcg_cut``); binary
  measures count grade >= 1 as relevant unless the name says ``rel=N``.
* **Ties**: ``trec_eval`` breaks score ties by doc id *descending*, heedrank ranks by
  ``(-score, doc_id)``. To evaluate exactly the order heedrank returns, every query's run
  is converted to rank-based scores (``n - rank``) before evaluation.

Example:
    >>> qrels = {"q1": {"a": 2, "b": 1, "c": 0}}
    >>> run = {"q1": {"b": 3.0, "c": 2.0, "a": 1.0, "d": 0.5}}
    >>> ev = evaluate_run(run, qrels, ["nDCG@10", "RR@10"])
    >>> round(ev.aggregate["nDCG@10"], 4), ev.aggregate["RR@10"]
    (0.7602, 1.0)
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from heedrank.errors import UnknownNameError, ValidationError
from heedrank.types import Qrels, Ranking

logger = logging.getLogger(__name__)

SUPPORTED_FAMILIES: tuple[str, ...] = ("nDCG", "R", "RR", "P", "AP", "Judged")
"""``ir_measures`` measure families accepted by :func:`parse_metrics`."""

BEIR_METRICS: tuple[str, ...] = ("nDCG@10", "R@100", "RR@10")
"""Metrics of BEIR evaluations (binary measures: grade >= 1 is relevant)."""

TREC_DL_METRICS: tuple[str, ...] = ("nDCG@10", "R(rel=2)@100", "RR(rel=2)@10", "Judged@10")
"""Metrics of TREC DL passage evaluations. Binary measures use grade >= 2 as relevant, as
in the TREC DL overview papers and Pyserini's regressions (grade 1 = "related" only)."""

MSMARCO_DEV_METRICS: tuple[str, ...] = ("nDCG@10", "RR@10", "R@10")
"""Metrics of MS MARCO passage dev samples (``msmarco-passage-dev-600``): binary qrels, grade 1
= the query's MS MARCO positive, so binary measures use grade >= 1 (``RR@10`` is MS MARCO's
official MRR@10). Its lists hold 20 passages, hence ``R@10`` rather than ``R@100`` (always 1
over a list that holds the positive)."""

NOVELEVAL_METRICS: tuple[str, ...] = ("nDCG@10", "nDCG@5", "nDCG@1", "RR@10")
"""Metrics of NovelEval (grades 0 not relevant, 1 partly relevant, 2 relevant): nDCG at the
cut-offs its source reports (RankGPT's NovelEval README: 1, 5, 10), and ``RR@10`` with grade
>= 1 as relevant, as ``trec_eval`` counts graded 0-2 sets such as TREC-COVID (and BEIR does):
a partly relevant passage is relevant. Every candidate is judged, so there is no ``Judged@10``."""

PRIMARY_METRIC = "nDCG@10"
"""The metric reported first and used for headline comparisons."""


@dataclass(frozen=True)
class Evaluation:
    """Metric values of one run.

    Attributes:
        aggregate: ``{metric: mean over evaluated queries}`` (values in [0, 1]).
        per_query: ``{query_id: {metric: value}}`` for every evaluated query.
        query_ids: The evaluated queries (those with qrels), sorted.
        excluded: Requested queries left out because they have no qrels, sorted.
    """

    aggregate: dict[str, float]
    per_query: dict[str, dict[str, float]]
    query_ids: list[str] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)


def _valid_names_message() -> str:
    return (
        f"use an ir_measures name of the families {list(SUPPORTED_FAMILIES)} with a cutoff, "
        f"e.g. {sorted(set(BEIR_METRICS) | set(TREC_DL_METRICS))}"
    )


def parse_metrics(names: Iterable[str]) -> dict[str, Any]:
    """Parse metric names into ``ir_measures`` measures.

    Args:
        names: Metric names such as ``"nDCG@10"`` or ``"R(rel=2)@100"``.

    Returns:
        ``{name: measure}`` in the given order (names exactly as given).

    Raises:
        UnknownNameError: a name that ``ir_measures`` cannot parse or whose family is not
            in :data:`SUPPORTED_FAMILIES`; the message lists valid names.
        ValidationError: no names given.
    """
    import ir_measures

    out: dict[str, Any] = {}
    for name in names:
        try:
            measure = ir_measures.parse_measure(name)
        except (NameError, ValueError, TypeError, AttributeError) as exc:
            raise UnknownNameError(f"unknown metric {name!r} ({exc}); {_valid_names_message()}") from None
        if measure.NAME not in SUPPORTED_FAMILIES:
            raise UnknownNameError(f"unsupported metric {name!r}; {_valid_names_message()}")
        out[name] = measure
    if not out:
        raise ValidationError(f"no metrics given; {_valid_names_message()}")
    return out


def relevance_level(name: str) -> int | None:
    """The lowest grade the binary measure ``name`` counts as relevant (``"RR(rel=2)@10"``: 2,
    ``"RR@10"``: 1, ``trec_eval``'s default), or ``None`` for a measure that is not binary
    (``nDCG``, ``Judged``).

    Raises:
        UnknownNameError: as :func:`parse_metrics`.
    """
    measure = parse_metrics([name])[name]
    if "rel" not in measure.SUPPORTED_PARAMS:
        return None
    return int(measure.params.get("rel", 1))


def rank_scores(run: Mapping[str, Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """Replace scores by ``n - rank`` under heedrank's ``(-score, doc_id)`` order.

    ``trec_eval`` would otherwise break ties by doc id descending; after this, every
    evaluator sees the order heedrank returns. NaN scores rank last.
    """
    out: dict[str, dict[str, float]] = {}
    for qid, scores in run.items():
        ranking = Ranking.from_scores(qid, scores)
        n = len(ranking)
        out[qid] = {h.doc_id: float(n - i) for i, h in enumerate(ranking.hits)}
    return out


def evaluate_run(
    run: Mapping[str, Mapping[str, float]],
    qrels: Qrels,
    metrics: Sequence[str] = BEIR_METRICS,
    *,
    query_ids: Iterable[str] | None = None,
) -> Evaluation:
    """Evaluate a run against qrels, per query and in aggregate.

    Args:
        run: ``{query_id: {doc_id: score}}``; higher score = better. Not modified.
        qrels: ``{query_id: {doc_id: grade}}``; grade 0 = judged non-relevant.
        metrics: Metric names (see :func:`parse_metrics`).
        query_ids: Queries to evaluate; default: the run's queries. Those without qrels
            are excluded (and logged); those with qrels but absent from ``run`` score 0.

    Returns:
        The :class:`Evaluation`. With no evaluable query, ``aggregate`` maps every metric
        to NaN and a warning is logged.

    Raises:
        UnknownNameError: an unknown metric name.
    """
    import ir_measures

    measures = parse_metrics(metrics)
    wanted = sorted(set(run) if query_ids is None else set(query_ids))
    evaluated = [q for q in wanted if qrels.get(q)]
    excluded = [q for q in wanted if not qrels.get(q)]
    if excluded:
        logger.info("%d of %d queries have no qrels and are excluded from evaluation", len(excluded), len(wanted))

    sub_run = rank_scores({q: run[q] for q in evaluated if run.get(q)})
    sub_qrels = {q: dict(qrels[q]) for q in evaluated}
    name_of = {m: name for name, m in measures.items()}
    per_query: dict[str, dict[str, float]] = {q: {name: 0.0 for name in measures} for q in evaluated}
    if sub_run:
        for m in ir_measures.iter_calc(list(measures.values()), sub_qrels, sub_run):
            if m.query_id in per_query:
                per_query[m.query_id][name_of[m.measure]] = float(m.value)
    if not evaluated:
        logger.warning("no query with qrels to evaluate (%d requested)", len(wanted))
    aggregate = {
        name: (math.fsum(per_query[q][name] for q in evaluated) / len(evaluated) if evaluated else math.nan)
        for name in measures
    }
    return Evaluation(aggregate=aggregate, per_query=per_query, query_ids=evaluated, excluded=excluded)

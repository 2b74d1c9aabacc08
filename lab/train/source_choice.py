"""Leave-one-source-out choice of the default's scorer (:mod:`heedrank.scorer`).

Every training source we hold (a feature dump of the served reranker, ``heedrank lab dump
--adapter``: NFCorpus train, SciFact train, TREC DL 2021, MS MARCO dev-600's train fold) is held
out in turn: each configuration is fitted on the other sources, each weighing the same
(:func:`heedrank.lab.train.scorer_fit.source_weights`), and read on the held-out one as the product
serves it (:meth:`heedrank.scorer.Scorer.logits`: a candidate by the model of the signals it holds).
The held-out source stands in for a user's collection the scorer never saw.

A configuration's **margin** on a source is its value there (nDCG@10 x 100; MRR@10 x 100 for
dev-600, whose qrels hold one positive per query) less the source's best single signal (the first
stage alone or the embedder alone, on the same candidates). The chosen configuration has the
highest worst margin; ties go to the highest mean margin.

Configurations (:func:`configurations`):

- ``direction``: one linear score of the attention, the embedder's cosine and the first-stage rank
  whose direction (the signals' shares, on their standardised scales) is the grid point with the
  highest worst margin over the training sources, then Platt-scaled (:func:`fit_direction`): the
  choice's own criterion, applied inside the fit, so that no source's loss is bought by another's gain;
- ``signals``: the scorer over the card's attention log-odds (its ``independent`` entry), the
  embedder's cosine and the first-stage rank, refitted as a logistic regression (the fit of
  :mod:`heedrank.lab.train.scorer_fit`), ``+ length`` with the query's length and its products
  with the attention and the cosine (:data:`LENGTH_TERMS`);
- ``heads``: the same with the attention's head weights refitted too, on the training sources'
  per-head features (:func:`heedrank.lab.train.independent_fit.features`), cross-fitted: the
  scorer's training rows read an attention fitted on the other half of their source's queries
  (:func:`heedrank.lab.train.scorer_fit.held_out`), so the scorer does not learn to trust an
  attention that has seen its labels; the held-out source reads one fitted on every training row;
- ``no attention``: the scorer of the embedder and the rank alone (what the default would be
  without the LM).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from heedrank.lab.study import QueryItem, load_items
from heedrank.lab.train.scorer_fit import dense_cosines, fit_logistic, held_out, index_for, signals
from heedrank.scorer import Scorer, SubsetModel
from heedrank.signals.attention import NAME as ATTENTION
from heedrank.signals.dense import NAME as DENSE
from heedrank.signals.query import NAME as QUERY_WORDS
from heedrank.signals.query import words as count_words
from heedrank.signals.rank import NAME as RANK

logger = logging.getLogger(__name__)

SIGNALS = (ATTENTION, DENSE, RANK)
"""The signals the choice reads."""

CS = (0.0003, 0.001, 0.003, 0.01, 0.1)
"""Inverse L2 strengths of the scorer tried."""

HEAD_CS = (0.001, 0.003, 0.01)
"""Inverse L2 strengths of the refitted head weights tried."""

HEAD_GROUPS = ("q_text", "na_text")
"""Row groups of the refitted head weights (the shipped card's ``independent.fitted_groups``)."""


@dataclass(frozen=True)
class Source:
    """One source's queries, read once.

    Attributes:
        name: Its name in the report (``nf``, ``dl21``, ...).
        items: The dump's queries.
        values: Per query, ``{signal: (N,) float64}`` (:func:`heedrank.lab.train.scorer_fit.signals`,
            and ``query_words``: the query's length on every row, read by a scorer's gate).
        heads: Per query, float64 ``(N, L * H * len(HEAD_GROUPS))`` per-head features.
        qrels: The dump's qrels.
        grade: The lowest relevant grade.
        metric: ``"nDCG@10"`` or ``"RR@10"``.
        query_words: Per query, its length in words (whitespace-separated).
        meta: The dump's record of how it was made (its ``data``, ``run``, ...).
        calibrates: Its labels enter the probability's Platt map (:func:`fit_direction`); ``False``
            for a source whose qrels mark one passage a query and leave the others unjudged
            (MS MARCO dev-600): it chooses the direction but would make every probability low.
    """

    name: str
    items: list[QueryItem]
    values: list[dict[str, np.ndarray]]
    heads: list[np.ndarray]
    qrels: Mapping[str, Mapping[str, int]]
    grade: int
    metric: str
    query_words: tuple[int, ...] = ()
    meta: Mapping[str, Any] = field(default_factory=dict)
    calibrates: bool = True

    def labels(self) -> np.ndarray:
        """``(n,)`` 0/1 relevance of every candidate, queries in order."""
        return np.concatenate([(it.labels >= self.grade).astype(int) for it in self.items])

    def per_query(self, scores: Sequence[np.ndarray]) -> np.ndarray:
        """``(Q,)`` float64 x 100: :attr:`metric` of each query's candidates ordered by
        ``(-score, doc_id)`` against the full qrels (as ``ir_measures`` computes it; a query
        with no relevant document scores 0)."""
        out = np.zeros(len(self.items))
        for k, (it, s) in enumerate(zip(self.items, scores)):
            order = sorted(range(len(s)), key=lambda i: (-s[i], it.doc_ids[i]))[:10]
            rel = self.qrels.get(it.query_id, {})
            if self.metric == "RR@10":
                out[k] = next((100.0 / (r + 1) for r, i in enumerate(order) if rel.get(it.doc_ids[i], 0) >= self.grade),
                              0.0)
                continue
            ideal = sorted((g for g in rel.values() if g > 0), reverse=True)[:10]
            idcg = sum(g / math.log2(r + 2) for r, g in enumerate(ideal))
            dcg = sum(max(rel.get(it.doc_ids[i], 0), 0) / math.log2(r + 2) for r, i in enumerate(order))
            out[k] = 100.0 * dcg / idcg if idcg > 0 else 0.0
        return out


def load_source(name: str, dump: Path, grade: int, metric: str, card: Mapping[str, Any],
                index: Path | None = None) -> Source:
    """Read one source's dump (its dense cosines cached beside it: :func:`dense_cosines`)."""
    from heedrank.lab.train.independent_fit import features
    from heedrank.lab.train.scorer_fit import query_texts
    from heedrank.reranker.cached.independent import IndependentWeights

    iw = IndependentWeights.from_card(card)
    meta, items = load_items(dump)
    dense = dense_cosines(dump, index=index_for(meta, index))
    text = query_texts(meta)
    words = tuple(count_words(text[it.query_id]) for it in items)
    values = [{**signals(it, dense[it.query_id], iw), QUERY_WORDS: np.full(len(it.doc_ids), float(w))}
              for it, w in zip(items, words)]
    heads = [features(it, HEAD_GROUPS) for it in items]
    return Source(name, items, values, heads, meta["qrels"], grade, metric, words, meta)


@dataclass(frozen=True)
class Config:
    """One configuration: ``kind`` (``signals``, ``heads``, ``no attention``), the scorer's ``c``,
    for ``heads`` the head weights' ``head_c``, and ``length``: the scorer also reads the query's
    length (:data:`LENGTH_TERMS`), so the weight of each signal may depend on it."""

    kind: str
    c: float
    head_c: float = 0.0
    length: bool = False

    @property
    def name(self) -> str:
        if self.kind == "direction":
            return "direction (highest worst margin)"
        return (f"{self.kind}{' + length' if self.length else ''} C={self.c:g}"
                + (f" heads C={self.head_c:g}" if self.kind == "heads" else ""))


LENGTH = "length"
"""The query's length, ``log(1 + words)``: a number of the query alone, the same in every list."""

LENGTH_TERMS = (LENGTH, f"{ATTENTION}*{LENGTH}", f"{DENSE}*{LENGTH}")
"""What a ``length`` configuration adds to the scorer's signals: the length and its products with
the attention and the embedder's cosine (their weights become linear in it)."""


def with_length(source: Source, values: Sequence[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    """``values`` (``source``'s queries) with :data:`LENGTH_TERMS` added."""
    out = []
    for v, words in zip(values, source.query_words):
        ell = np.full(len(v[DENSE]), np.log1p(words))
        out.append({**v, LENGTH: ell, f"{ATTENTION}*{LENGTH}": v[ATTENTION] * ell, f"{DENSE}*{LENGTH}": v[DENSE] * ell})
    return out


def configurations() -> list[Config]:
    """Every configuration the choice compares."""
    return ([Config("direction", 0.0)] + [Config("signals", c) for c in CS] + [Config("signals", c, length=True) for c in CS]
            + [Config("heads", c, h) for h in HEAD_CS for c in CS] + [Config("no attention", c) for c in CS])


def fit_heads(sources: Sequence[Source], rows: Sequence[np.ndarray] | None, c: float) -> tuple[np.ndarray, float]:
    """Head weights over the per-head features (:func:`fit_logistic`, each source weighing the same)
    of ``sources``' queries (all, or per source the boolean query mask in ``rows``): ``(w, bias)``."""
    xs, ys, ks = [], [], []
    for k, s in enumerate(sources):
        keep = np.ones(len(s.items), bool) if rows is None else rows[k]
        for q in np.flatnonzero(keep):
            xs.append(s.heads[q])
            ys.append((s.items[q].labels >= s.grade).astype(int))
            ks.append(np.full(len(s.items[q].doc_ids), k))
    return fit_logistic(np.concatenate(xs), np.concatenate(ys), np.concatenate(ks), c)


def stacked(sources: Sequence[Source], values: Sequence[Sequence[dict[str, np.ndarray]]], uses: Sequence[str]
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every candidate of ``sources`` (their signals ``values``, per source, per query) as the
    float64 ``(n, len(uses))`` matrix of ``uses``, its ``(n,)`` 0/1 labels and ``(n,)`` source index."""
    X = np.stack([np.concatenate([v[u] for vs in values for v in vs]) for u in uses], axis=1)
    y = np.concatenate([s.labels() for s in sources])
    k = np.concatenate([np.full(sum(len(v[uses[0]]) for v in vs), i) for i, vs in enumerate(values)])
    return X, y, k


def scorer_of(sources: Sequence[Source], values: Sequence[Sequence[dict[str, np.ndarray]]], uses: Sequence[str],
              c: float) -> Scorer:
    """The scorer's full model over ``uses`` fitted on ``values`` (per source, per query, the
    signals) with each source weighing the same. Only the full model: every candidate of a dump
    holds every signal, so the models of fewer signals (served where one is missing) are never read
    here."""
    X, y, k = stacked(sources, values, uses)
    have = np.isfinite(X).all(axis=1)  # a document without a stored vector has no cosine
    w, b = fit_logistic(X[have], y[have], k[have], c)
    return Scorer((SubsetModel(tuple(uses), tuple(float(x) for x in w), b),), 0.5)


def serve(scorer: Scorer, values: Sequence[dict[str, np.ndarray]], uses: Sequence[str]) -> list[np.ndarray]:
    """Each query's logits as served (:meth:`Scorer.logits`), ``-inf`` where no model applies."""
    out = []
    for v in values:
        X = np.stack([v[u] for u in uses], axis=1)
        s = scorer.logits(X, list(uses))
        out.append(np.where(np.isfinite(s), s, -np.inf))
    return out


def with_attention(source: Source, attention: Sequence[np.ndarray]) -> list[dict[str, np.ndarray]]:
    """``source``'s signals with the attention replaced (a refitted head model's log-odds)."""
    return [{**v, ATTENTION: a} for v, a in zip(source.values, attention)]


Refits = dict[tuple[str, float], tuple[list[list[dict[str, np.ndarray]]], list[dict[str, np.ndarray]]]]
"""Refitted attentions kept by :func:`choose` per (held-out source, ``head_c``)."""


def _refit_attention(train: tuple[Source, ...], test: Source, head_c: float, kept: Refits | None = None
                     ) -> tuple[list[list[dict[str, np.ndarray]]], list[dict[str, np.ndarray]]]:
    """The training sources' signals with a cross-fitted refitted attention, and the held-out
    source's with one fitted on every training row (module docstring); kept in ``kept`` per fold
    and ``head_c`` (the scorer's ``C`` does not change them)."""
    kept = {} if kept is None else kept
    key = (test.name, head_c)
    if key not in kept:
        halves = [np.asarray([held_out(it.query_id) for it in s.items]) for s in train]
        fits = {True: fit_heads(train, [~h for h in halves], head_c), False: fit_heads(train, halves, head_c)}
        train_values = [with_attention(s, [x @ fits[bool(h[q])][0] + fits[bool(h[q])][1] for q, x in enumerate(s.heads)])
                        for s, h in zip(train, halves)]
        w, b = fit_heads(train, None, head_c)
        kept[key] = (train_values, with_attention(test, [x @ w + b for x in test.heads]))
    return kept[key]


DIRECTION_STEP = 0.05
"""Grid step of :func:`fit_direction`'s weights (shares of one, on the standardised signals)."""

SIGNS = {ATTENTION: 1.0, DENSE: 1.0, RANK: -1.0}
"""The sign each signal's weight takes in :func:`fit_direction`: more attention or a higher cosine
is more relevant, a later first-stage place less."""


def simplex(k: int, step: float = DIRECTION_STEP) -> list[tuple[float, ...]]:
    """Every ``k``-tuple of non-negative multiples of ``step`` summing to one."""
    n = round(1 / step)
    return [tuple(round(i * step, 10) for i in c) for c in _compositions(n, k)]


def _compositions(n: int, k: int) -> list[tuple[int, ...]]:
    if k == 1:
        return [(n,)]
    return [(i, *rest) for i in range(n + 1) for rest in _compositions(n - i, k - 1)]


def best_single(source: Source) -> float:
    """The source's best single signal: the first stage alone or the embedder alone (mean x 100)."""
    return max(float(source.per_query([it.first_stage for it in source.items]).mean()),
               float(source.per_query([v[DENSE] for v in source.values]).mean()))


def fit_direction(sources: Sequence[Source], values: Sequence[Sequence[dict[str, np.ndarray]]], uses: Sequence[str],
                  step: float = DIRECTION_STEP) -> tuple[SubsetModel, dict[str, Any]]:
    """The scorer's model over ``uses`` chosen for its worst margin, then calibrated.

    Its direction is a point of :func:`simplex` over the signals standardised by their pooled
    deviation (each source weighing the same), signed by :data:`SIGNS`; the chosen one has the
    highest worst margin over the sources' best single signals (:func:`best_single`; ties: the
    highest mean margin). A Platt map of the chosen score on the candidates of the sources that
    calibrate (:attr:`Source.calibrates`; each weighing the same) makes it log-odds: ``bias + w . x``.

    Returns:
        The model, and ``{"shares": {signal: share}, "margins": {source: margin}}``.
    """
    from sklearn.linear_model import LogisticRegression

    from heedrank.fusion import Standardizer
    from heedrank.lab.train.scorer_fit import source_weights

    X, y, k = stacked(sources, values, uses)
    have = np.isfinite(X).all(axis=1)
    sd = Standardizer.fit(X[have], source_weights(k[have])).std
    best = [best_single(s) for s in sources]
    per_query = [[np.stack([v[u] for u in uses], axis=1) for v in vs] for vs in values]  # once, not per grid point
    chosen: tuple[tuple[float, float], np.ndarray, dict[str, float]] | None = None
    for shares in simplex(len(uses), step):
        w = np.asarray([SIGNS[u] * g for u, g in zip(uses, shares)]) / sd
        margins = {s.name: float(s.per_query([x @ w for x in xs]).mean()) - b
                   for s, xs, b in zip(sources, per_query, best)}
        key = (min(margins.values()), float(np.mean(list(margins.values()))))
        if chosen is None or key > chosen[0]:
            chosen = (key, w, margins)
    assert chosen is not None
    _, w, margins = chosen
    calibrating = [i for i, s in enumerate(sources) if s.calibrates] or list(range(len(sources)))
    fit_rows = have & np.isin(k, calibrating)
    platt = LogisticRegression(C=1e6, max_iter=5000).fit((X[fit_rows] @ w)[:, None], y[fit_rows],
                                                         sample_weight=source_weights(np.unique(k[fit_rows],
                                                                                               return_inverse=True)[1]))
    a, b = float(platt.coef_[0][0]), float(platt.intercept_[0])
    share = {u: round(float(abs(x) * d), 4) for u, x, d in zip(uses, w, sd)}
    return SubsetModel(tuple(uses), tuple(float(a * x) for x in w), b), {"shares": share, "margins": margins}


def held_out_scores(config: Config, train: Sequence[Source], test: Source, kept: Refits | None = None
                    ) -> list[np.ndarray]:
    """``test``'s served logits under ``config`` fitted on ``train`` (module docstring; ``kept``:
    :func:`choose`'s refitted attentions, for one set of sources)."""
    uses: tuple[str, ...] = (DENSE, RANK) if config.kind == "no attention" else SIGNALS
    train_values: list[list[dict[str, np.ndarray]]] = [list(s.values) for s in train]
    test_values = list(test.values)
    if config.kind == "heads":
        train_values, test_values = _refit_attention(tuple(train), test, config.head_c, kept)
    if config.length:
        uses = uses + (LENGTH_TERMS if config.kind != "no attention" else (LENGTH, f"{DENSE}*{LENGTH}"))
        train_values = [with_length(s, v) for s, v in zip(train, train_values)]
        test_values = with_length(test, test_values)
    if config.kind == "direction":
        model, _ = fit_direction(train, train_values, uses)
        return serve(Scorer((model,), 0.5), test_values, uses)
    return serve(scorer_of(train, train_values, uses, config.c), test_values, uses)


def baselines(source: Source) -> dict[str, np.ndarray]:
    """Per-query values of the single signals on ``source``: first stage, embedder, attention."""
    return {"first stage": source.per_query([it.first_stage for it in source.items]),
            "dense": source.per_query([v[DENSE] for v in source.values]),
            "attention": source.per_query([np.nan_to_num(v[ATTENTION], nan=-1e9) for v in source.values])}


def choose(sources: Sequence[Source], configs: Sequence[Config] | None = None) -> dict[str, Any]:
    """Hold each source out in turn and report every configuration's values and margins.

    Returns:
        ``{"sources": {name: {"queries", "metric", "first stage", "dense", "attention"}},
        "configs": {name: {"values": {source: value}, "margins": {source: margin}, "worst", "mean",
        "per_query": {source: [..]}}}, "chosen": name}``.
    """
    configs = list(configs or configurations())
    kept: Refits = {}
    base = {s.name: baselines(s) for s in sources}
    bests = {n: max(float(b["first stage"].mean()), float(b["dense"].mean())) for n, b in base.items()}  # best_single
    report: dict[str, Any] = {"sources": {s.name: {"queries": len(s.items), "metric": s.metric,
                                                   **{k: float(v.mean()) for k, v in base[s.name].items()}}
                                          for s in sources}, "configs": {}}
    for config in configs:
        values, margins, per = {}, {}, {}
        for i, test in enumerate(sources):
            train = [s for j, s in enumerate(sources) if j != i]
            got = test.per_query(held_out_scores(config, train, test, kept))
            best = bests[test.name]
            values[test.name], margins[test.name], per[test.name] = float(got.mean()), float(got.mean()) - best, got
        row = {"values": values, "margins": margins, "worst": min(margins.values()),
               "mean": float(np.mean(list(margins.values()))), "per_query": {k: v.tolist() for k, v in per.items()}}
        report["configs"][config.name] = row
        logger.info("%s: worst %.2f mean %.2f %s", config.name, row["worst"], row["mean"],
                    {k: round(v, 2) for k, v in margins.items()})
    report["chosen"] = max(report["configs"], key=lambda n: (report["configs"][n]["worst"], report["configs"][n]["mean"]))
    return report


def format_choice(report: Mapping[str, Any]) -> str:
    """A markdown table: each configuration's held-out value per source and its worst and mean margin."""
    names = list(report["sources"])
    lines = ["| configuration | " + " | ".join(names) + " | worst margin | mean margin |",
             "|---|" + "---|" * (len(names) + 2)]
    for key in ("first stage", "dense", "attention"):
        lines.append(f"| {key} alone | " + " | ".join(f"{report['sources'][n][key]:.2f}" for n in names) + " | | |")
    for name, row in sorted(report["configs"].items(), key=lambda kv: (-kv[1]["worst"], -kv[1]["mean"])):
        lines.append(f"| {name} | " + " | ".join(f"{row['values'][n]:.2f} ({row['margins'][n]:+.2f})" for n in names)
                     + f" | {row['worst']:+.2f} | {row['mean']:+.2f} |")
    return "\n".join(lines) + f"\n\nchosen: {report['chosen']}"


def scorer_entry(sources: Sequence[Source], dumps: Sequence[Path], dev: Source | None, report: Mapping[str, Any]
                 ) -> dict[str, Any]:
    """The card's ``scorer`` entry of the ``direction`` configuration fitted on every source: one
    model per subset of :data:`SIGNALS` holding ``dense`` or ``attention`` (:func:`fit_direction`
    over that subset's signals, the path of a candidate missing one), the largest first; the
    ``"auto"`` cut-off's probability chosen on ``dev`` by mean F1 (0.5 without one).

    Args:
        sources: The training sources (:func:`load_source`).
        dumps: Their dumps, in the same order (recorded by name).
        dev: The dev source (NFCorpus dev) of the cut-off, or ``None``.
        report: :func:`choose`'s report, summarised into the entry's ``choice``.
    """
    from heedrank.lab.train.independent_fit import THRESHOLDS, mean_f1
    from heedrank.lab.train.scorer_fit import subsets

    fitted = [fit_direction(sources, [s.values for s in sources], subset) for subset in subsets(SIGNALS)]
    fitted.sort(key=lambda mi: (-len(mi[0].uses), -min(mi[1]["margins"].values())))
    models = [m for m, _ in fitted]
    threshold = 0.5
    if dev is not None:
        served = dict(zip((it.query_id for it in dev.items), serve(Scorer(tuple(models), 0.5), dev.values, SIGNALS)))
        threshold = max(THRESHOLDS, key=lambda t: mean_f1(dev.items, served, t, dev.grade))
    return {
        "features": list(SIGNALS), "fit": "direction",
        "models": [{"uses": list(m.uses), "weights": list(m.weights), "bias": m.bias, **info} for m, info in fitted],
        "threshold": threshold,
        "train": {"dumps": [str(p) for p in dumps], "split": [], "min_grade": [s.grade for s in sources],
                  "sources": {s.name: {"queries": len(s.items), "metric": s.metric, "calibrates": s.calibrates}
                              for s in sources}},
        "choice": {"chosen": report["chosen"], "sources": report["sources"],
                   "configs": {n: {k: r[k] for k in ("values", "margins", "worst", "mean")}
                               for n, r in report["configs"].items()}},
    }

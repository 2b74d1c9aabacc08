"""Leave-one-source-out choice of the scorer (:mod:`heedrank.lab.train.source_choice`) on tiny
inline sources: its metrics agree with the evaluator's, each source is read by configurations
fitted on the others only, and the choice is the highest worst margin."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from heedrank.eval.metrics import evaluate_run
from heedrank.lab.study import QueryItem
from heedrank.lab.train.source_choice import Config, Source, choose, format_choice, held_out_scores
from heedrank.scorer import Scorer
from heedrank.signals.rank import feature as rank_feature


def _source(name: str, seed: int, attention_strength: float, metric: str = "nDCG@10", n_queries: int = 40,
            n: int = 10) -> Source:
    """Relevance seen by the dense cosine in every source; by the per-head features (and the
    attention log-odds) with ``attention_strength``."""
    rng = np.random.default_rng(seed)
    items, values, heads, qrels = [], [], [], {}
    for q in range(n_queries):
        labels = (rng.random(n) < 0.3).astype(np.int64) * (1 + (rng.random(n) < 0.5))
        first = rng.normal(size=n) + 0.5 * (labels > 0)
        order = np.argsort(-first, kind="stable")
        h = rng.normal(size=(n, 4))
        h[:, 0] += attention_strength * (labels > 0)
        qid = f"{name}q{q}"
        ids = [f"{qid}d{i}" for i in range(n)]
        items.append(QueryItem(qid, [ids[i] for i in order], first[order], labels[order], {}))
        values.append({"attention": h[order, 0] - 1.0, "dense": (0.3 + 0.1 * rng.normal(size=n) + 0.1 * (labels > 0))[order],
                       "rank": np.asarray([rank_feature(i) for i in range(n)])})
        heads.append(h[order])
        qrels[qid] = {ids[i]: int(labels[i]) for i in range(n) if labels[i]}
    return Source(name, items, values, heads, qrels, 1, metric)


def test_metrics_agree_with_the_evaluator() -> None:
    for metric in ("nDCG@10", "RR@10"):
        s = _source("a", 0, 1.0, metric)
        scores = [v["dense"] for v in s.values]
        ours = s.per_query(scores)
        run = {it.query_id: {d: float(x) for d, x in zip(it.doc_ids, sc)} for it, sc in zip(s.items, scores)}
        ev = evaluate_run(run, s.qrels, [metric], query_ids=[it.query_id for it in s.items])
        # a query with no relevant candidate is not in the evaluator's qrels: 0 in ours
        want = [100.0 * ev.per_query.get(it.query_id, {metric: 0.0})[metric] for it in s.items]
        assert ours == pytest.approx(want, abs=1e-9) and 0 < sum(want)


def test_a_held_out_source_is_read_by_a_fit_on_the_others_only() -> None:
    a, b, c = _source("a", 1, 2.0), _source("b", 2, 2.0), _source("c", 3, 2.0)
    config = Config("signals", 0.1)
    before = held_out_scores(config, [a, b], c)
    # changing the held-out source's labels changes nothing it is scored with
    flipped = Source(c.name, [QueryItem(it.query_id, it.doc_ids, it.first_stage, 2 - it.labels, it.features)
                              for it in c.items], c.values, c.heads, c.qrels, c.grade, c.metric)
    after = held_out_scores(config, [a, b], flipped)
    assert all(np.array_equal(x, y) for x, y in zip(before, after))
    heads = held_out_scores(Config("heads", 0.1, 0.1), [a, b], c)
    assert len(heads) == len(c.items) and all(np.isfinite(x).all() for x in heads)


def test_the_choice_is_the_highest_worst_margin() -> None:
    # attention informative in two sources, noise in the third: a configuration that trusts it
    # everywhere loses the third
    sources = [_source("a", 4, 2.5), _source("b", 5, 2.5), _source("web", 6, 0.0, "RR@10")]
    configs = [Config("signals", 0.1), Config("no attention", 0.1), Config("heads", 0.1, 0.01)]
    report = choose(sources, configs)
    rows = report["configs"]
    assert set(rows) == {c.name for c in configs}
    for row in rows.values():
        for name, margin in row["margins"].items():
            src = report["sources"][name]
            assert margin == pytest.approx(row["values"][name] - max(src["first stage"], src["dense"]))
        assert row["worst"] == min(row["margins"].values())
    best = max(rows, key=lambda n: (rows[n]["worst"], rows[n]["mean"]))
    assert report["chosen"] == best
    # where attention carries the relevance, the scorer that reads it beats the one without it
    assert rows["signals C=0.1"]["values"]["a"] > rows["no attention C=0.1"]["values"]["a"] + 5.0
    assert "| no attention C=0.1 |" in format_choice(report)


def test_the_direction_is_the_simplex_point_of_the_highest_worst_margin() -> None:
    from heedrank.fusion import Standardizer
    from heedrank.lab.train.scorer_fit import source_weights
    from heedrank.lab.train.source_choice import SIGNALS, best_single, fit_direction, scorer_entry, serve, simplex

    assert len(simplex(3)) == 231 and all(abs(sum(g) - 1.0) < 1e-9 for g in simplex(3))
    sources = [_source("a", 7, 2.5), _source("web", 8, 0.0, "RR@10")]
    model, info = fit_direction(sources, [s.values for s in sources], SIGNALS)
    assert model.uses == SIGNALS and sum(info["shares"].values()) == pytest.approx(1.0, abs=1e-3)
    # the margins it reports are those of its own scores (a monotone Platt map changes no order)
    for s in sources:
        got = s.per_query(serve(Scorer((model,), 0.5), s.values, SIGNALS)).mean()
        assert info["margins"][s.name] == pytest.approx(got - best_single(s))
    # no other point of the grid has a higher worst margin
    worst = min(info["margins"].values())
    X = np.concatenate([np.stack([np.concatenate([v[u] for v in s.values]) for u in SIGNALS], 1) for s in sources])
    k = np.concatenate([np.full(sum(len(v["dense"]) for v in s.values), i) for i, s in enumerate(sources)])
    sd = Standardizer.fit(X, source_weights(k)).std  # pooled, each source weighing the same
    for shares in simplex(3, 0.25):  # points of the fit's grid
        w = np.asarray([1.0, 1.0, -1.0]) * np.asarray(shares) / sd
        other = min(s.per_query([np.stack([v[u] for u in SIGNALS], 1) @ w for v in s.values]).mean() - best_single(s)
                    for s in sources)
        assert other <= worst + 1e-9
    # the attention, noise on the web source, gets a small share; the probability is calibrated
    assert info["shares"]["attention"] <= 0.5 and model.weights[0] > 0 and model.weights[2] <= 0
    entry = scorer_entry(sources, [Path("a.npz"), Path("web.npz")], None, choose(sources, [Config("direction", 0.0)]))
    assert [m["uses"] for m in entry["models"]][0] == list(SIGNALS) and len(entry["models"]) == 6
    assert Scorer.from_card({"scorer": entry}) is not None and entry["train"]["dumps"] == ["a.npz", "web.npz"]


def test_a_rank_only_source_chooses_the_direction_but_not_the_probability() -> None:
    from dataclasses import replace

    from heedrank.lab.train.source_choice import SIGNALS, fit_direction

    a, b = _source("a", 1, 2.0), _source("b", 2, 2.0)
    sparse = _source("sparse", 3, 2.0)
    # one positive a query, the rest unjudged: its labels say far fewer documents are relevant
    sparse = replace(sparse, items=[replace(it, labels=np.where(np.arange(len(it.labels)) == int(np.argmax(it.labels)),
                                                                  it.labels, 0)) for it in sparse.items])
    every, info = fit_direction([a, b, sparse], [s.values for s in (a, b, sparse)], SIGNALS)
    ranked, info_ranked = fit_direction([a, b, replace(sparse, calibrates=False)], [s.values for s in (a, b, sparse)],
                                        SIGNALS)
    assert info["shares"] == info_ranked["shares"] and info["margins"] == info_ranked["margins"]  # the same direction
    ratio = np.asarray(ranked.weights) / np.asarray(every.weights)
    assert np.allclose(ratio, ratio[0])  # one score, mapped again

    def mean_p(model) -> float:  # type: ignore[no-untyped-def]
        X = np.concatenate([np.stack([v[u] for u in SIGNALS], axis=1) for s in (a, b) for v in s.values])
        return float(np.mean(1 / (1 + np.exp(-(X @ np.asarray(model.weights) + model.bias)))))

    base = float(np.mean(np.concatenate([a.labels(), b.labels()])))
    # the sparse labels no longer pull every probability down: a and b's mean probability is their base rate
    assert mean_p(every) < base - 0.02 and mean_p(ranked) == pytest.approx(base, abs=0.01)

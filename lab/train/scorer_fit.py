"""The fit of the default's scorer (:mod:`heedrank.scorer`): one logistic model over every signal a
path holds, with one model per subset of the signals (the missing-feature path).

Input: feature dumps (``heedrank lab dump``) of the served reranker (the query adapter on), whose
items carry the ``independent`` attention features; the attention feature is the card's
list-independent log-odds of them (:class:`heedrank.reranker.cached.independent.IndependentWeights`).
The dense cosine of each candidate is computed here once per dump and kept beside it
(``<dump>.dense.npz``): read from the index's stored vectors for a BEIR dump made with ``--index``
(:func:`heedrank.index.cosines.stored_cosines`, as ``/search`` reads them), else encoded by the
packaged embedder (as ``/rerank`` and ``eval trec-dl`` encode texts).

Every subset of :data:`FEATURES` that holds ``dense`` or ``attention`` gets its own
model (a missing signal is missing, not fatal), fitted on the training candidates that hold every
signal of the subset. Each is a logistic regression (scikit-learn, L2,
pointwise: relevant = grade >= each dump's lowest relevant grade) on the features standardised by
their training means and deviations (fixed numbers, never a list's), its log-odds Platt-scaled on
the training pairs (the L2 shrinks them), and the statistics folded into the weights so that
the card holds ``s = bias + w . x`` of the raw features (log-odds of P(relevant)). Each training
source weighs the same. Its ``C`` is chosen by the full model's mean nDCG@10 over NFCorpus dev and
the held-out half of each split source (TREC DL 2021), and the ``"auto"`` cut-off's probability on
dev by mean F1. Reported per set: nDCG@10 of every single signal and of
each model, ROC AUC and ECE of the full model's probability.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from heedrank.fusion import Standardizer, sigmoid
from heedrank.lab.study import QueryItem, load_items, ndcg10
from heedrank.lab.train.independent_fit import THRESHOLDS, auc, ece, mean_f1
from heedrank.scorer import Scorer, SubsetModel
from heedrank.signals import BUILT_IN
from heedrank.signals.attention import NAME as ATTENTION
from heedrank.signals.dense import NAME as DENSE
from heedrank.signals.rank import NAME as RANK
from heedrank.signals.rank import feature as rank_feature

FEATURES = tuple(s.name for s in BUILT_IN)
"""The signals a dump holds, in the card's order (:mod:`heedrank.signals`)."""

logger = logging.getLogger(__name__)

Rows = list[tuple[QueryItem, dict[str, np.ndarray]]]
"""One dump's queries with their signals (:func:`signals`)."""

CS = (0.0001, 0.0003, 0.001, 0.003, 0.01, 0.1, 1.0)
"""Inverse L2 strengths tried (chosen on dev)."""


def _dense_path(dump: Path) -> Path:
    return dump.with_name(dump.name.removesuffix(".npz") + ".dense.npz")


def index_for(meta: Mapping[str, Any], index: Path | None) -> Path | None:
    """``index`` when it is the index of the dump's data (its ``params.json`` names that corpus),
    else ``None``: a dump of another collection (SciFact beside an NFCorpus index, a candidate-list
    folder) has its texts encoded instead."""
    import json

    if index is None or meta.get("run"):
        return None
    params = Path(index) / "params.json"
    if not params.is_file():  # not a built index (a test's stand-in): taken at its word
        return index
    corpus = json.loads(params.read_text(encoding="utf-8")).get("corpus", {}).get("path")
    if not corpus:
        return None
    if Path(corpus).resolve() == Path(meta["data"]).resolve():
        return index
    indexed = _corpus_file(corpus)
    return index if indexed is not None and indexed == _corpus_file(meta["data"]) else None


def _corpus_file(path: str | Path) -> Path | None:
    """The resolved corpus file of a BEIR folder or file (a link followed: the long-query source links
    NFCorpus's), or ``None``."""
    from heedrank.data import find_beir_corpus
    from heedrank.errors import NotFoundError

    try:
        return find_beir_corpus(path).resolve()
    except (NotFoundError, OSError):
        return None


def query_texts(meta: Mapping[str, Any]) -> dict[str, str]:
    """``{query_id: text}`` of a dump's data (its ``meta``): a candidate-list folder's queries (TREC
    DL, dev-600, NovelEval: every query of it) or a BEIR folder's."""
    from heedrank.data import load_beir_queries
    from heedrank.eval.sets import load_candidate_set

    if meta.get("run"):
        return {q: t.text for q, t in load_candidate_set(meta["data"], meta["run"], split="all").queries.items()}
    return {q: t.text for q, t in load_beir_queries(meta["data"]).items()}


def candidates_digest(meta: Mapping[str, Any], items: Sequence[QueryItem]) -> str:
    """16 hex digits of what a dump's cosines depend on: its data, its run and each query's candidates."""
    key = [meta.get("data"), meta.get("run"), [[it.query_id, list(it.doc_ids)] for it in items]]
    return hashlib.sha256(json.dumps(key).encode()).hexdigest()[:16]


def dense_cosines(dump: Path, *, index: Path | None = None) -> dict[str, np.ndarray]:
    """``{query_id: (N,) float64 cosine}`` of a dump's candidates (module docstring), cached in
    ``<dump>.dense.npz`` under :func:`candidates_digest` (recomputed when the candidates changed; read
    from a sibling dump's cache of the same candidates, e.g. the same lists dumped with another adapter)."""
    from heedrank.eval.sets import load_candidate_set

    meta, items = load_items(dump)
    digest = candidates_digest(meta, items)
    cache = _dense_path(dump)
    # the cosines depend on the candidates only: a dump of the same lists by another adapter shares them
    for known in [cache, *sorted(Path(dump).parent.glob("*.dense.npz"))]:
        if known.exists():
            z = np.load(known)
            if str(z["__sha__"]) == digest:
                out = {it.query_id: z[it.query_id] for it in items}
                if known != cache:
                    np.savez(cache, __sha__=np.asarray(digest), **out)
                return out
    qtext = query_texts(meta)
    docs = load_candidate_set(meta["data"], meta["run"], split="all").docs if meta.get("run") else None
    from heedrank.index.encoder import SentenceTransformerEncoder

    if docs is None and index is not None:
        from heedrank.index.cosines import stored_cosines
        from heedrank.index.store import Index

        idx = Index.open(index)
        qv = idx.encoder.encode_queries([qtext[it.query_id] for it in items])
        out = {}
        for it, v in zip(items, qv):
            cos = stored_cosines(idx, v, it.doc_ids)
            out[it.query_id] = np.asarray([cos.get(d, np.nan) for d in it.doc_ids], dtype=np.float64)
        idx.close()
    else:
        if docs is None:
            from heedrank.data import iter_beir_documents

            wanted = {d for it in items for d in it.doc_ids}
            docs = {d.doc_id: d for d in iter_beir_documents(meta["data"]) if d.doc_id in wanted}
        enc = SentenceTransformerEncoder()
        qv = enc.encode_queries([qtext[it.query_id] for it in items])
        ids = sorted({d for it in items for d in it.doc_ids})
        dv = dict(zip(ids, enc.encode_documents([docs[d].content for d in ids], show_progress=True)))
        out = {it.query_id: np.asarray([float(dv[d] @ v) for d in it.doc_ids]) for it, v in zip(items, qv)}
    np.savez(cache, __sha__=np.asarray(digest), **out)
    return out


def signals(item: QueryItem, dense_values: np.ndarray, independent: Any,
            head_weights: Sequence[float] | None = None) -> dict[str, np.ndarray]:
    """The scorer's raw features of one dump query: ``{name: (N,) float64}`` (:data:`FEATURES`),
    plus ``learned`` (the card's list-relative head score, z-scores over the query's candidates:
    :func:`heedrank.reranker.scoring.linear_head_scores`) when ``head_weights`` are given, for the
    study of whether a list-relative signal earns its place."""
    from heedrank.reranker.cached.independent import GROUPS
    from heedrank.reranker.scoring import linear_head_scores

    F = item.features["independent"].astype(np.float64)
    w = np.asarray(independent.weights, dtype=np.float64).reshape(F.shape[1], F.shape[2], len(GROUPS))
    n = len(item.doc_ids)
    out = {ATTENTION: np.einsum("nlhg,lhg->n", F, w) + independent.bias, DENSE: dense_values,
           RANK: np.asarray([rank_feature(i) for i in range(n)], dtype=np.float64)}
    if head_weights is not None and "calibrated" in item.features:
        out["learned"] = linear_head_scores(item.features["calibrated"].astype(np.float64),
                                            np.asarray(head_weights, dtype=np.float64))
    return out


def _per_query(items: Sequence[QueryItem], scores: Mapping[str, np.ndarray], qrels: Mapping[str, Any]
               ) -> dict[str, float]:
    run = {it.query_id: {d: float(s) for d, s in zip(it.doc_ids, scores[it.query_id])} for it in items}
    return ndcg10(items, run, qrels)


def _ndcg(items: Sequence[QueryItem], scores: Mapping[str, np.ndarray], qrels: Mapping[str, Any]) -> float:
    per = _per_query(items, scores, qrels)
    return float(np.mean(list(per.values()))) if per else 0.0


def _p(a: Mapping[str, float], b: Mapping[str, float]) -> float:
    """Two-sided paired randomization test of per-query nDCG@10 (:func:`heedrank.eval.compare.randomization_test`)."""
    from heedrank.eval.compare import randomization_test

    return float(randomization_test([a[q] - b[q] for q in sorted(a)]))


def subsets(features: Sequence[str] = FEATURES) -> list[tuple[str, ...]]:
    """Every subset of ``features`` that holds ``dense`` or ``attention`` (a model each), largest first."""
    out = [s for r in range(len(features), 0, -1) for s in itertools.combinations(features, r)
           if DENSE in s or ATTENTION in s]
    return out


def held_out(query_id: str) -> bool:
    """Whether a query of a split training dump is held out for the choice (half of them, by the
    first byte of its id's sha256: the same queries on every run)."""
    return hashlib.sha256(query_id.encode("utf-8")).digest()[0] % 2 == 1


def source_weights(source: np.ndarray) -> np.ndarray:
    """``(n,)`` float64 sample weights under which each training source weighs the same: a row of
    source ``k`` gets ``1 / (rows of k)``, scaled so that the weights sum to ``n``."""
    counts = np.bincount(source).astype(np.float64)
    weight = 1.0 / counts[source]
    return weight * (len(weight) / weight.sum())


def fit_logistic(raw_x: np.ndarray, y: np.ndarray, source: np.ndarray, c: float) -> tuple[np.ndarray, float]:
    """One logistic model of the raw features, its statistics folded in: ``(w, bias)`` with
    ``bias + raw_x @ w`` the log-odds of P(relevant).

    The features are standardised by their weighted means and deviations, a logistic regression
    (scikit-learn, L2 with inverse strength ``c``) is fitted with each source weighing the same
    (:func:`source_weights`), and its score is Platt-scaled on the same rows (unregularised): the
    L2 that ranks best shrinks the log-odds, and the probability must mean what it says.

    Args:
        raw_x: float64 ``(n, F)`` features of the training candidates.
        y: ``(n,)`` 0/1 relevance.
        source: ``(n,)`` int, each row's training source.
        c: Inverse L2 strength.
    """
    from sklearn.linear_model import LogisticRegression

    weight = source_weights(source)
    st = Standardizer.fit(raw_x, weight)
    X = st(raw_x)
    m = LogisticRegression(C=c, max_iter=5000).fit(X, y, sample_weight=weight)
    raw = m.decision_function(X)
    platt = LogisticRegression(C=1e6, max_iter=5000).fit(raw[:, None], y, sample_weight=weight)
    a, b = float(platt.coef_[0][0]), float(platt.intercept_[0])
    w = a * m.coef_[0] / st.std
    return w, float(a * m.intercept_[0] + b - np.dot(w, st.mean))


def fit_scorer(train: Sequence[tuple[Path, int]], dev: Path, tests: Mapping[str, tuple[Path, int]], *,
               card: Mapping[str, Any], index: Path | None = None, cs: Sequence[float] = CS,
               features: Sequence[str] = FEATURES, split: Sequence[tuple[Path, int]] = ()) -> dict[str, Any]:
    """Fit, choose, report (module docstring). Returns the card's ``scorer`` entry
    (``{"features", "models": [{"uses", "weights", "bias"}], "C", "threshold", "train", "figures"}``).

    Each training source weighs the same in the loss (its pairs weighted by ``1 / its pairs``), so
    a large source does not set the weights of a signal whose strength differs between sources
    (the first-stage rank: strong in NFCorpus's hybrid lists, weak in TREC DL's BM25 ones).

    Args:
        train: ``(dump, lowest relevant grade)`` training sources.
        dev: The dev dump (NFCorpus dev): ``C`` and the cut-off are chosen on it (with ``split``).
        tests: ``{name: (dump, grade)}`` reported only.
        card: The weights card (its ``independent`` entry makes the attention signal).
        index: The index of the BEIR dumps (stored vectors).
        cs: Inverse L2 strengths tried.
        features: The signals (:data:`FEATURES`).
        split: Training sources of which half the queries (:func:`held_out`) are held out: ``C``
            is chosen by the mean nDCG@10 of the dev dump and these held-out halves.

    Raises:
        ValueError: the training dumps hold no relevant or no non-relevant candidate.
    """
    from heedrank.reranker.cached.independent import IndependentWeights

    iw = IndependentWeights.from_card(card)

    def load(path: Path) -> tuple[dict[str, Any], list[tuple[QueryItem, dict[str, np.ndarray]]]]:
        meta, items = load_items(path)
        own = index_for(meta, index)
        dense = dense_cosines(path, index=own)
        return meta, [(it, signals(it, dense[it.query_id], iw, card.get("weights"))) for it in items]

    sets: dict[str, tuple[Rows, Mapping[str, Any], int]] = {}
    sources: list[tuple[Rows, int]] = [(load(p)[1], grade) for p, grade in train]
    choose = ["dev"]
    for p, grade in split:
        meta, all_rows = load(p)
        sources.append(([r for r in all_rows if not held_out(r[0].query_id)], grade))
        name = f"held-out {Path(p).name.removesuffix('.npz')}"
        sets[name] = ([r for r in all_rows if held_out(r[0].query_id)], meta["qrels"], grade)
        choose.append(name)
    rows = [(it, f, grade, k) for k, (src, grade) in enumerate(sources) for it, f in src]
    y = np.concatenate([(it.labels >= grade).astype(int) for it, _, grade, _ in rows])
    source = np.concatenate([np.full(len(it.doc_ids), k) for it, _, _, k in rows])
    if not 0 < int(y.sum()) < len(y):
        raise ValueError("the training dumps need relevant and non-relevant candidates")
    meta, dev_rows = load(dev)
    sets = {"dev": (dev_rows, meta["qrels"], 1), **sets}
    for name, (path, rel) in tests.items():
        meta, its = load(path)
        sets[name] = (its, meta["qrels"], rel)

    X_all = {u: np.concatenate([f[u] for _, f, _, _ in rows]) for u in features}

    def fit(uses: Sequence[str], c: float) -> tuple[np.ndarray, float]:
        """One subset's model, on the training candidates that hold its signals."""
        have = np.all([np.isfinite(X_all[u]) for u in uses], axis=0)
        return fit_logistic(np.stack([X_all[u][have] for u in uses], axis=1), y[have], source[have], c)

    def scores_of(rows_: Rows, models_: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
        """Each candidate's logit by the model of the largest subset of ``models_`` whose signals it
        holds, as the product serves it (:meth:`heedrank.scorer.Scorer.logit`); -inf: none."""
        scorer = Scorer(tuple(SubsetModel(tuple(m["uses"]), tuple(m["weights"]), float(m["bias"])) for m in models_), 0.5)
        out = {}
        for it, f in rows_:
            got = [scorer.logit({u: f[u][i] for u in features}) for i in range(len(it.doc_ids))]
            out[it.query_id] = np.asarray([-np.inf if g is None else g[0] for g in got])
        return out

    def as_model(uses: Sequence[str], c: float) -> dict[str, Any]:
        w, b = fit(uses, c)
        return {"uses": list(uses), "weights": [float(v) for v in w], "bias": b}

    def chosen_value(models_: Sequence[Mapping[str, Any]]) -> float:
        return float(np.mean([_ndcg([it for it, _ in sets[n][0]], scores_of(sets[n][0], models_), sets[n][1])
                              for n in choose]))

    base = tuple(u for u in features if np.isfinite(X_all[u]).any())
    best_c = max(cs, key=lambda c: chosen_value([as_model(base, c)]))
    models: list[dict[str, Any]] = [as_model(uses, best_c) for uses in subsets(features) if set(uses) <= set(base)]
    dev_rows, dev_qrels = sets["dev"][0], sets["dev"][1]
    dev_items = [it for it, _ in dev_rows]
    dev_value = {}
    for m in models:
        rows_m = [(it, f) for it, f in dev_rows if np.all([np.isfinite(f[u]) for u in m["uses"]])]
        dev_value[tuple(m["uses"])] = _ndcg([it for it, _ in rows_m], scores_of(rows_m, [m]), dev_qrels) \
            if rows_m else -1.0
    # served: the largest model whose signals a candidate holds; among as large ones, dev's best
    models = sorted(models, key=lambda m: (-len(m["uses"]), -dev_value[tuple(m["uses"])]))
    threshold = max(THRESHOLDS, key=lambda t: mean_f1(dev_items, scores_of(dev_rows, models), t))
    figures: dict[str, Any] = {}
    for name, (rows_, qrels, rel) in sets.items():
        listed = [it for it, _ in rows_]
        first = _per_query(listed, {it.query_id: it.first_stage for it in listed}, qrels)
        fig: dict[str, Any] = {"first stage": float(np.mean(list(first.values())))}
        single = {}
        for u in [f for f in (ATTENTION, DENSE, "learned")
                  if f in rows_[0][1] and np.isfinite(rows_[0][1][f]).any()]:
            single[u] = _per_query(listed, {it.query_id: np.nan_to_num(f[u], nan=-9.0) for it, f in rows_}, qrels)
            fig[u] = float(np.mean(list(single[u].values())))
        for m in models:
            if not all(np.isfinite(f[u]).any() for _, f in rows_ for u in m["uses"]):
                continue  # the set does not hold this model's signals
            sc = scores_of(rows_, [m])
            per = _per_query(listed, sc, qrels)
            fig["+".join(m["uses"])] = float(np.mean(list(per.values())))
        served = scores_of(rows_, models)  # every candidate by the largest model it holds, as served
        per = _per_query(listed, served, qrels)
        fig["served"] = float(np.mean(list(per.values())))
        fig["p_vs_first_stage"] = _p(per, first)
        if DENSE in single:
            fig[f"p_vs_{DENSE}"] = _p(per, single[DENSE])
        prob = sigmoid(np.concatenate([served[it.query_id] for it in listed]))
        labels = np.concatenate([(it.labels >= rel).astype(int) for it in listed])
        fig.update(auc=auc(prob, labels), ece=ece(prob, labels), mean_p=float(prob.mean()),
                   base_rate=float(labels.mean()))
        figures[name] = fig
        logger.info("scorer fit %s: %s", name, {k: round(v, 2) for k, v in fig.items()})
    return {"features": list(features), "models": models, "C": best_c, "threshold": threshold,
            "train": {"dumps": [str(p) for p, _ in train], "split": [str(p) for p, _ in split],
                      "min_grade": [g for _, g in train] + [g for _, g in split], "pairs": int(len(y)),
                      "relevant": int(y.sum()), "chosen_on": choose},
            "figures": figures}


def format_fit(entry: Mapping[str, Any]) -> str:
    """A table of the fit's figures: one row per set, nDCG@10 x 100 of each signal and model."""
    figures = entry["figures"]
    cols = sorted({k for f in figures.values() for k in f
                   if k not in ("auc", "ece", "mean_p", "base_rate") and not k.startswith("p_")},
                  key=lambda k: (k.count("+"), k))
    lines = ["| set | " + " | ".join(cols) + " | p vs first stage | p vs dense | AUC | ECE |",
             "|---|" + "---|" * (len(cols) + 4)]
    for name, f in figures.items():
        lines.append(f"| {name} | " + " | ".join((f"{f[c]:.2f}" if c in f else "-") for c in cols)
                     + f" | {f.get('p_vs_first_stage', float('nan')):.4f} | {f.get('p_vs_dense', float('nan')):.4f}"
                     + f" | {f.get('auc', float('nan')):.3f} | {f.get('ece', float('nan')):.3f} |")
    return "\n".join(lines) + f"\nC = {entry['C']:g}; threshold {entry.get('threshold')}"

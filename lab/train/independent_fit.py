"""The fit of cached BlockRank's list-independent scorer (:mod:`heedrank.reranker.cached.independent`).

Input: feature dumps (``heedrank lab dump``) whose items carry ``independent`` features, float32
``(N, L, H, G)`` per query (:func:`heedrank.reranker.cached.independent.document_features`).
Every (layer, head, group) feature is standardised by its mean and standard deviation over the
training pairs (fixed numbers, never the list's), and a logistic regression (scikit-learn,
L2, pointwise: relevant = grade >= each dump's lowest relevant grade) is fitted on them; its inverse regularisation ``C`` and the row groups it reads
(:data:`GROUP_SETS`) are chosen on dev by the score's own nDCG@10, its log-odds are Platt-scaled on
the training pairs (the L2 shrinks them), then the fusion weight with the first stage on dev (0.0-1.0 in
steps of 0.1), and a Platt map of the fused score on dev (``/search``'s probability, monotone in
its order). The statistics are folded into the weights, so the card holds one affine map of
the raw features: ``s = bias + W . F`` (log-odds of P(relevant)).

Reported on dev and every test dump: nDCG@10 of the score alone and fused, beside the first
stage; ROC AUC and expected calibration error (10 equal-width bins) of ``sigmoid(s)`` over every
(query, candidate) pair of the dump, with the dump's base rate.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from heedrank.fusion import Standardizer, fuse, sigmoid
from heedrank.lab.study import QueryItem, load_items, ndcg10
from heedrank.reranker.cached.independent import GROUPS

logger = logging.getLogger(__name__)

CS = (0.001, 0.003, 0.01, 0.03, 0.1)
"""Inverse L2 strengths tried (chosen on dev)."""
ALPHAS = tuple(round(0.1 * i, 1) for i in range(11))
"""Fusion weights of the first stage tried (chosen on dev)."""
THRESHOLDS = tuple(round(0.05 * i, 2) for i in range(1, 20))
"""Probabilities tried as the ``"auto"`` cut-off (chosen on dev for mean F1)."""


@dataclass(frozen=True)
class IndependentFit:
    """A fit: the card's ``independent`` entry and the report.

    Attributes:
        entry: ``{"layers", "heads", "groups", "weights", "bias", "C", "fusion_alpha", ...}``
            (:meth:`heedrank.reranker.cached.independent.IndependentWeights.from_card` reads it).
        report: Figures per set (dev and tests): nDCG@10 first stage / alone / fused, AUC, ECE,
            mean probability, base rate.
    """

    entry: dict[str, Any]
    report: dict[str, Any]


GROUP_SETS = (("q_text", "na_text"), ("q_text", "q_suffix", "na_text", "na_suffix"), GROUPS)
"""Row groups tried (chosen on dev); the card's weights are 0 on the groups left out."""


def features(item: QueryItem, groups: Sequence[str] = GROUPS) -> np.ndarray:
    """float64 ``(N, L * H * len(groups))`` of one query's candidates.

    Raises:
        KeyError: the dump has no ``independent`` features (dumped by an older version).
    """
    f = item.features["independent"][..., [GROUPS.index(g) for g in groups]]
    return f.reshape(f.shape[0], -1).astype(np.float64)


def auc(p: np.ndarray, y: np.ndarray) -> float:
    """ROC AUC of ``p`` against binary ``y`` (NaN with one class only)."""
    from sklearn.metrics import roc_auc_score

    return float(roc_auc_score(y, p)) if 0 < int(y.sum()) < len(y) else float("nan")


def ece(p: np.ndarray, y: np.ndarray, bins: int = 10) -> float:
    """Expected calibration error of probabilities ``p`` against binary ``y``, ``bins``
    equal-width bins."""
    b = np.minimum((p * bins).astype(int), bins - 1)
    total = 0.0
    for i in range(bins):
        m = b == i
        if m.any():
            total += abs(float(p[m].mean()) - float(y[m].mean())) * int(m.sum())
    return total / max(1, len(p))


def _mean_ndcg(items: Sequence[QueryItem], scores: Mapping[str, np.ndarray], qrels: Mapping[str, Any]) -> float:
    run = {it.query_id: {d: float(s) for d, s in zip(it.doc_ids, scores[it.query_id])} for it in items}
    return float(np.mean(list(ndcg10(items, run, qrels).values())))


def _fused(items: Sequence[QueryItem], scores: Mapping[str, np.ndarray], alpha: float) -> dict[str, np.ndarray]:
    return {it.query_id: np.asarray(fuse(it.first_stage, scores[it.query_id], alpha)) if len(it.doc_ids) > 1
            else scores[it.query_id] for it in items}


def mean_f1(items: Sequence[QueryItem], scores: Mapping[str, np.ndarray], threshold: float, rel: int = 1) -> float:
    """Mean over queries of the F1 of the candidates with ``sigmoid(score) >= threshold`` against
    the relevant ones (grade >= ``rel``); a query with neither scores 1, with one of them 0."""
    out = []
    for it in items:
        keep = sigmoid(scores[it.query_id]) >= threshold
        relevant = it.labels >= rel
        tp = int((keep & relevant).sum())
        denominator = int(keep.sum()) + int(relevant.sum())
        out.append(1.0 if denominator == 0 else 2.0 * tp / denominator)
    return float(np.mean(out))


def fit_independent(train: Sequence[tuple[Path, int]], dev: Path, tests: Mapping[str, tuple[Path, int]], *,
                    cs: Sequence[float] = CS, group_sets: Sequence[Sequence[str]] = GROUP_SETS) -> IndependentFit:
    """Fit, choose on dev, report (module docstring).

    Args:
        train: Training dumps with the lowest grade counted relevant in each (their queries must not
            be dev's or a test's).
        dev: The dev dump.
        tests: ``{name: (dump, lowest relevant grade)}``.
        cs: Inverse L2 strengths to try.
        group_sets: Row groups to try (each a subset of :data:`GROUPS`).

    Raises:
        ValueError: the training dumps hold no relevant or no non-relevant candidate.
    """
    from sklearn.linear_model import LogisticRegression

    loaded = [(it, grade) for p, grade in train for it in load_items(p)[1]]
    items = [it for it, _ in loaded]
    y = np.concatenate([(it.labels >= grade).astype(int) for it, grade in loaded])
    if not 0 < int(y.sum()) < len(y):
        raise ValueError("the training dumps need relevant and non-relevant candidates")
    dev_meta, dev_items = load_items(dev)
    sets: dict[str, tuple[list[QueryItem], Mapping[str, Any], int]] = {"dev": (dev_items, dev_meta["qrels"], 1)}
    for name, (path, rel) in tests.items():
        meta, its = load_items(path)
        sets[name] = (its, meta["qrels"], rel)
    best: tuple[float, float, Sequence[str], Any, Standardizer] | None = None
    for groups in group_sets:
        X = np.concatenate([features(it, groups) for it in items])
        st = Standardizer.fit(X)
        Z = st(X)
        for c in cs:
            model = LogisticRegression(C=c, max_iter=5000).fit(Z, y)
            s = {it.query_id: model.decision_function(st(features(it, groups))) for it in dev_items}
            value = _mean_ndcg(dev_items, s, sets["dev"][1])
            logger.info("independent fit: groups %s C=%g dev nDCG@10 %.2f", ",".join(groups), c, value)
            if best is None or value > best[0]:
                best = (value, c, groups, model, st)
    assert best is not None
    _, c, chosen, model, st = best
    mu, sd = st.mean, st.std
    # Platt scaling of the chosen score on the training pairs (unregularised): the L2 that ranks
    # best on dev shrinks the log-odds, and the probability must mean what it says
    X = np.concatenate([features(it, chosen) for it in items])
    raw = model.decision_function(st(X))
    platt = LogisticRegression(C=1e6, max_iter=5000).fit(raw[:, None], y)
    a, b = float(platt.coef_[0][0]), float(platt.intercept_[0])
    layers, heads = dev_items[0].features["independent"].shape[1:3]
    w_groups = (a * model.coef_[0] / sd).reshape(layers, heads, len(chosen))
    w = np.zeros((layers, heads, len(GROUPS)))
    for i, g in enumerate(chosen):
        w[:, :, GROUPS.index(g)] = w_groups[:, :, i]
    w = w.reshape(-1)
    bias = float(a * (model.intercept_[0] - np.dot(model.coef_[0], mu / sd)) + b)

    def score(it: QueryItem) -> np.ndarray:
        return features(it) @ w + bias

    scores = {name: {it.query_id: score(it) for it in its} for name, (its, _, _) in sets.items()}
    alpha = max(ALPHAS, key=lambda a: _mean_ndcg(dev_items, _fused(dev_items, scores["dev"], a), sets["dev"][1]))
    threshold = max(THRESHOLDS, key=lambda t: mean_f1(dev_items, scores["dev"], t))
    # the fused score's probability (/search): a Platt map of the fused score, fitted on dev
    fused = {name: _fused(its, scores[name], alpha) for name, (its, _, _) in sets.items()}
    fd = np.concatenate([fused["dev"][it.query_id] for it in dev_items])
    yd = np.concatenate([(it.labels >= 1).astype(int) for it in dev_items])
    fmap = LogisticRegression(C=1e6, max_iter=5000).fit(fd[:, None], yd)
    fa, fb = float(fmap.coef_[0][0]), float(fmap.intercept_[0])
    fused_logits = {name: {q: fa * v + fb for q, v in f.items()} for name, f in fused.items()}
    fused_threshold = max(THRESHOLDS, key=lambda t: mean_f1(dev_items, fused_logits["dev"], t))
    report: dict[str, Any] = {}
    for name, (its, qrels, rel) in sets.items():
        first = {it.query_id: it.first_stage for it in its}
        p = sigmoid(np.concatenate([scores[name][it.query_id] for it in its]))
        pf = sigmoid(np.concatenate([fused_logits[name][it.query_id] for it in its]))
        labels = np.concatenate([(it.labels >= rel).astype(int) for it in its])
        report[name] = {
            "first stage": _mean_ndcg(its, first, qrels),
            "independent": _mean_ndcg(its, scores[name], qrels),
            "fused": _mean_ndcg(its, fused[name], qrels),
            "auc": auc(p, labels), "ece": ece(p, labels), "mean_p": float(p.mean()), "base_rate": float(labels.mean()),
            "f1@threshold": mean_f1(its, scores[name], threshold, rel),
            "fused_auc": auc(pf, labels), "fused_ece": ece(pf, labels),
            "fused_f1@threshold": mean_f1(its, fused_logits[name], fused_threshold, rel),
        }
    entry = {"layers": int(layers), "heads": int(heads), "groups": list(GROUPS), "weights": w.tolist(), "bias": bias,
             "C": c, "fitted_groups": list(chosen), "platt": [a, b], "fusion_alpha": alpha, "threshold": threshold,
             "fused_map": [fa, fb], "fused_threshold": fused_threshold,
             "train": {"dumps": [str(p) for p, _ in train], "min_grade": [g for _, g in train], "pairs": int(len(y)), "relevant": int(y.sum())},
             "figures": report}
    return IndependentFit(entry, report)


def format_fit(fit: IndependentFit) -> str:
    """The report as a markdown table."""
    rows = ["| set | first stage | independent | fused | AUC | ECE | mean p | base rate | F1 at cut-off | "
            "fused AUC | fused ECE | fused F1 at cut-off |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in fit.report.items():
        rows.append(f"| {name} | {r['first stage']:.2f} | {r['independent']:.2f} | {r['fused']:.2f} | {r['auc']:.3f} | "
                    f"{r['ece']:.3f} | {r['mean_p']:.3f} | {r['base_rate']:.3f} | {r['f1@threshold']:.3f} | "
                    f"{r['fused_auc']:.3f} | {r['fused_ece']:.3f} | {r['fused_f1@threshold']:.3f} |")
    e = fit.entry
    rows.append(f"\nrow groups {', '.join(e['fitted_groups'])}; C {e['C']:g}; fusion weight of the first stage "
                f"{e['fusion_alpha']:g}; cut-offs {e['threshold']:g} (alone) and {e['fused_threshold']:g} (fused), dev")
    return "\n".join(rows)

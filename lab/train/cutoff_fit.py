"""Fitting the relevance cut-off (:mod:`heedrank.calibration`, the serving side) on study dumps.

For every query of a dump, each candidate count ``N`` of ``counts`` (the first stage's top
``N``, re-scored as the service would score that many) and each serving mode (fused with
first-stage scores, fused with the reciprocal rank of the given order, the reranker alone),
the served scores are computed exactly as the service computes them
(:func:`heedrank.lab.cutoff_eval.served`). One logistic (Platt) map per mode is fitted on
calibration queries (which the reranker must not have been trained on), its threshold and
the best fixed top-k are chosen on dev for the mean F1 over the counts
(:func:`fit_calibration`), and both are measured on test sets
(:func:`heedrank.lab.cutoff_eval.evaluate_cutoff`): :func:`calibrate_cutoff` runs it all
from dump files and returns the card's ``"calibration"`` entry.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from heedrank.calibration import MODES, Calibration, PlattMap
from heedrank.errors import ValidationError
from heedrank.lab.cutoff_eval import Served, head_variant, keep_above, per_query, served
from heedrank.lab.dumps import read_query_ids
from heedrank.lab.study import QueryItem
from heedrank.reranker.cards import WeightsCard

logger = logging.getLogger(__name__)

THRESHOLDS = tuple(float(t) for t in np.round(np.arange(0.02, 0.905, 0.02), 3))
"""Thresholds tried on dev (probabilities)."""


MONOTONE = {0: 1.0, 1: -1.0}
"""Signs the map's weights are held to (indices into :data:`heedrank.calibration.FEATURES`):
the score's weight non-negative, ``log(1 + i)``'s non-positive. Within a query the other two
inputs are constant, so a map that keeps them is non-increasing down the served order by
itself, and two hits share a probability only when they share a score (without the signs,
the running minimum of :meth:`heedrank.calibration.PlattMap.probabilities` flattened runs
of hits to one value)."""


def fit_map(rows: Sequence[Served], *, c: float = 1.0) -> tuple[tuple[float, ...], float]:
    """Logistic regression (scikit-learn, L2 with inverse strength ``c``) of relevance on the
    map inputs of every candidate of ``rows``, with the signs of :data:`MONOTONE`: an input
    whose weight comes out with the wrong sign is held at 0 and the rest refitted (the
    active-set step of sign-constrained least squares, Lawson and Hanson 1974, ch. 23).
    Returns ``(coef (4,), intercept)``."""
    from sklearn.linear_model import LogisticRegression

    x = np.concatenate([r.x for r in rows if len(r.labels)])
    y = np.concatenate([r.labels for r in rows if len(r.labels)])
    free = list(range(x.shape[1]))
    while True:
        model = LogisticRegression(C=c, max_iter=2000).fit(x[:, free], y)
        coef = dict(zip(free, (float(v) for v in model.coef_[0])))
        wrong = [j for j, sign in MONOTONE.items() if j in coef and coef[j] * sign < 0]
        if not wrong:
            return tuple(coef.get(j, 0.0) for j in range(x.shape[1])), float(model.intercept_[0])
        free.remove(max(wrong, key=lambda j: abs(coef[j])))


def fit_calibration(calibrate: Sequence[QueryItem], calibrate_qrels: Mapping[str, Mapping[str, int]],
                    dev: Sequence[QueryItem], dev_qrels: Mapping[str, Mapping[str, int]], card: WeightsCard, *,
                    counts: Sequence[int] = (10, 20, 30, 50), modes: Sequence[str] = MODES,
                    show_progress: bool = True) -> tuple[Calibration, dict[str, Any]]:
    """Fit one map per mode on ``calibrate`` (all ``counts``), choose its threshold and the
    best fixed top-k on dev (mean F1 averaged over ``counts``).

    Args:
        calibrate: Dump items of queries the reranker was not trained on.
        card: The weights card whose learned scorer and fusion weight (``fusion.alpha``) are
            calibrated, as :func:`heedrank.reranker.cards.read_card` reads it.

    Returns:
        ``(calibration, report)``: the report has per mode the dev F1 per threshold, the
        chosen threshold, the best fixed k and the dev Brier score against the base rate.

    Raises:
        ValidationError: the card records no fusion weight, no weights or no layer.
    """
    from tqdm.auto import tqdm

    variant = head_variant(card)
    if card.fusion_alpha is None:
        raise ValidationError(f"weights card {card.path} records no fusion weight (fusion.alpha), which the fused "
                              "modes' maps are fitted at: export it with `heedrank lab fit --export` (it chooses "
                              "the weight on dev) or add fusion.alpha to the card")
    alpha = card.fusion_alpha
    maps, report = {}, {}
    for mode in tqdm(modes, desc="calibrate", unit="mode", disable=not show_progress):
        rows = [r for n in counts for r in served(calibrate, calibrate_qrels, variant, alpha, mode, n)]
        coef, intercept = fit_map(rows)
        dev_rows = {n: served(dev, dev_qrels, variant, alpha, mode, n) for n in counts}
        probe = PlattMap(coef, intercept, 0.5)
        f1 = {t: float(np.mean([per_query(dev_rows[n], keep_above(probe, t))[:, 2].mean() for n in counts]))
              for t in THRESHOLDS}
        t_best = max(f1, key=lambda t: (f1[t], -t))
        k_f1 = {k: float(np.mean([per_query(dev_rows[n], lambda r, k=k: min(k, len(r.labels)))[:, 2].mean()
                                  for n in counts])) for k in range(1, max(counts) + 1)}
        k_best = max(k_f1, key=lambda k: (k_f1[k], -k))
        xd = [r for n in counts for r in dev_rows[n] if len(r.labels)]
        pd = np.concatenate([probe.probabilities(list(r.scores)) for r in xd])
        yd = np.concatenate([r.labels for r in xd])
        maps[mode] = PlattMap(coef, intercept, t_best)
        report[mode] = {"threshold": t_best, "dev_f1": f1[t_best], "top_k": k_best, "dev_f1_top_k": k_f1[k_best],
                        "dev_brier": float(np.mean((pd - yd) ** 2)), "dev_brier_base_rate": float(np.var(yd)),
                        "calibration_candidates": int(sum(len(r.labels) for r in rows))}
        logger.info("calibration %s: threshold %.2f (dev F1 %.4f), top-%d (dev F1 %.4f)", mode, t_best, f1[t_best],
                    k_best, k_f1[k_best])
    info = {"counts": list(counts), "calibration_queries": len(calibrate), "dev": report}
    return Calibration(alpha, maps, info), report


@dataclass(frozen=True)
class CutoffCalibration:
    """What :func:`calibrate_cutoff` found.

    Attributes:
        entry: The card's ``"calibration"`` entry: the maps, their dev choices, the test
            figures and the ``command`` that wrote it.
        results: ``{set: {mode: {count: record}}}`` of
            :func:`heedrank.lab.cutoff_eval.evaluate_cutoff`, dev first.
        calibration_queries: Queries the maps were fitted on.
        excluded: Queries dropped from them (the reranker's training queries).
        counts: Candidate counts the maps were fitted and chosen at.
    """

    entry: dict[str, Any]
    results: dict[str, Any]
    calibration_queries: int
    excluded: int
    counts: list[int]


def calibrate_cutoff(
    card: WeightsCard, calibrate: Sequence[Path], dev: Path, tests: Mapping[str, str], *,
    exclude: Sequence[Path] = (), counts: Sequence[int] = (10, 20, 30, 50), test_counts: Sequence[str] = ("20", "all"),
    command: str = "",
) -> CutoffCalibration:
    """Fit the relevance cut-off of ``card``'s learned scorer on the ``calibrate`` dumps (less
    the queries of the ``exclude`` dumps), choose its thresholds and the fixed top-k on
    ``dev``, and measure both on dev and on each test set (``{name: "DUMP[@MIN_GRADE]"}``)
    at each of ``test_counts`` (``"all"``: every candidate of the dump).

    Raises:
        NotFoundError, ValueError: a dump that cannot be read.
        ValidationError: see :func:`fit_calibration`.
    """
    from heedrank.lab.cutoff_eval import evaluate_cutoff
    from heedrank.lab.study import load_items

    seen = read_query_ids(list(exclude))

    def load(path: Path, drop: Set[str] = frozenset()) -> tuple[list[QueryItem], dict[str, Any], dict[str, Any]]:
        meta, items = load_items(path)
        return ([it for it in items if it.query_id not in drop],
                {q: r for q, r in meta["qrels"].items() if q not in drop}, meta)

    cal_items: list[QueryItem] = []
    cal_qrels: dict[str, Any] = {}
    for path in calibrate:
        items, qrels, _ = load(path, seen)
        cal_items += items
        cal_qrels.update({q: qrels[q] for q in {it.query_id for it in items} if q in qrels})
    dev_items, dev_qrels, dev_meta = load(dev)
    calibration, report = fit_calibration(cal_items, cal_qrels, dev_items, dev_qrels, card, counts=list(counts))
    sets = {"dev": (dev_items, dev_qrels, 1)}
    for name, spec in tests.items():
        dump, _, min_grade = spec.partition("@")
        items, qrels, _ = load(Path(dump))
        sets[name] = (items, qrels, int(min_grade) if min_grade else 1)
    results: dict[str, Any] = {}
    for name, (items, qrels, grade) in sets.items():
        for mode in MODES:
            k = int(report[mode]["top_k"])
            for c in test_counts:
                results.setdefault(name, {}).setdefault(mode, {})[c] = evaluate_cutoff(
                    items, qrels, card, calibration, mode, None if c == "all" else int(c), k, min_grade=grade)
    entry = calibration.to_json()
    adapter = (dev_meta.get("adapter") or {}).get("sha256")  # the query adapter of the dumps (lab dump --adapter)
    if adapter:
        entry["query_adapter_sha256"] = adapter  # the maps hold only with the adapter the dumps used
    entry.update({"test": {n: v for n, v in results.items() if n != "dev"}, "command": command})
    return CutoffCalibration(entry, results, len(cal_items), len(seen), list(counts))


def format_cutoff(run: CutoffCalibration) -> str:
    """The markdown table of a :class:`CutoffCalibration`: per set, mode and candidate count,
    the fixed top-k (k chosen on dev) against the cut-off ``"auto"`` (precision, recall, F1,
    documents returned), the F1 difference with its p, and the best k on the set itself."""
    lines = [f"calibration: {run.calibration_queries} queries ({run.excluded} excluded), counts {run.counts}", "",
             "| set | mode | candidates | fixed top-k (k from dev): P / R / F1 | cut-off 'auto': P / R / F1 / hits | "
             "F1 delta (p) | best k on the set: F1 (auto vs it, p) |", "|---|---|---|---|---|---|---|"]
    for name, by_mode in run.results.items():
        for mode, by_count in by_mode.items():
            for c, r in by_count.items():
                a, f, best = r["auto"], r["fixed"], r["fixed_best_k"]
                lines.append(
                    f"| {name} ({r['queries']} q) | {mode} | {c} | {100 * f[0]:.1f} / {100 * f[1]:.1f} / "
                    f"{100 * f[2]:.1f} (k {r['top_k']}) | {100 * a[0]:.1f} / {100 * a[1]:.1f} / **{100 * a[2]:.1f}** / "
                    f"{a[3]:.1f} | {100 * r['delta_f1']:+.1f} (p {r['p']:.3f}) | {100 * best[2]:.1f} (k "
                    f"{r['best_k_on_this_set']}; {100 * (a[2] - best[2]):+.1f}, p {r['p_vs_best_k']:.3f}) |")
    return "\n".join(lines)

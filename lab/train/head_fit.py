"""The head-weight fit of cached BlockRank's learned scorer, and the study that chooses it
(docs/results/training.md, "The training and fusion study").

Learned weights follow QRRanker's idea: per-(layer, head) calibrated attention scores
combined by a linear model, here trained with a listwise softmax loss counting every
positive (Gupta et al. 2025's ``L_aux``), RankNet's pairwise loss or LambdaRank
(:func:`fit_listwise`). They are fitted offline on the study's feature dumps
(:func:`heedrank.lab.study.dump_features`: one LM pass per query), every choice is made
on dev, and each variant is scored on the test sets (:func:`run_study`, :func:`fit_study`,
the variants and nDCG@10 of :mod:`heedrank.lab.study`). :func:`weights_card` writes the
chosen weights as the card that ``--opt scoring=learned`` serves
(:func:`heedrank.reranker.scoring.linear_head_scores`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from heedrank.errors import NotFoundError, ValidationError
from heedrank.lab.study import QueryItem, design, ndcg10, variant_run
from heedrank.lab.train.losses import weighted_listwise_loss

logger = logging.getLogger(__name__)

LOSSES = ("listwise", "pairwise", "lambdarank")
"""Losses of :func:`fit_listwise` and :func:`fit_study`."""


def fit_listwise(
    items: Sequence[QueryItem], spec: str, *, l2: float = 1e-3, epochs: int = 200, lr: float = 0.05,
    temperature: float = 1.0, layers: Sequence[int] | None = None, seed: int = 0, loss: str = "listwise",
) -> np.ndarray:
    """Linear weights ``(F,)`` minimising, plus ``l2 * |w|^2`` (full-batch Adam in torch, float64):

    ``loss="listwise"``: the softmax loss over each query's candidates with every positive
    counted (``-log sum_pos softmax(s / temperature)``; graded labels weight positives by
    ``2^grade - 1``); ``loss="pairwise"``: RankNet's logistic loss
    ``log(1 + exp(-(s_i - s_j) / temperature))`` over every pair with ``grade_i > grade_j``,
    averaged per query (Burges et al. 2005); ``loss="lambdarank"``: the same pairs weighted
    by ``|delta nDCG@10|`` of swapping them in the current ranking (Burges 2010, "From
    RankNet to LambdaRank to LambdaMART", Section 4), normalised per query.

    Queries without a positive or without a negative among the candidates are skipped.
    ``F`` is the width of :func:`heedrank.lab.study.design` for ``spec`` (``"heads"``:
    ``len(layers) * heads`` in (layer, head) order).

    Raises:
        ValueError: no query with both a positive and a negative, or an unknown ``loss``.
    """
    import torch

    torch.manual_seed(seed)
    Xs, Ys = [], []
    for it in items:
        y = it.labels.astype(np.float64)
        if (y > 0).any() and (y <= 0).any():
            Xs.append(torch.tensor(design(it, spec, layers), dtype=torch.float64))
            Ys.append(torch.tensor(np.where(y > 0, 2.0 ** y - 1.0, 0.0)))
    if not Xs:
        raise ValueError("no query with both a positive and a negative candidate")
    F = Xs[0].shape[1]
    w = torch.zeros(F, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([w], lr=lr)
    if loss not in ("listwise", "pairwise", "lambdarank"):
        raise ValueError(f"loss must be 'listwise', 'pairwise' or 'lambdarank', got {loss!r}")
    pairs = [(y[:, None] > y[None, :]) for y in Ys]

    def delta_ndcg(s: Any, gain: Any) -> Any:
        """|delta nDCG@10| of swapping each pair in the ranking by ``s`` (no gradient)."""
        rank = torch.empty_like(s, dtype=torch.long)
        rank[torch.argsort(-s)] = torch.arange(len(s))
        disc = torch.where(rank < 10, 1.0 / torch.log2(rank.double() + 2.0), torch.zeros_like(s))
        ideal = torch.sort(gain, descending=True).values[:10]
        idcg = float((ideal / torch.log2(torch.arange(len(ideal), dtype=torch.float64) + 2.0)).sum())
        return ((gain[:, None] - gain[None, :]) * (disc[:, None] - disc[None, :])).abs() / max(idcg, 1e-12)

    for _ in range(epochs):
        opt.zero_grad()
        total = torch.zeros((), dtype=torch.float64)
        for X, y, better in zip(Xs, Ys, pairs):
            s = X @ w / temperature
            if loss == "pairwise":
                total = total + torch.nn.functional.softplus(-(s[:, None] - s[None, :]))[better].mean()
            elif loss == "lambdarank":
                lam = delta_ndcg(s.detach(), y)[better]
                pair = torch.nn.functional.softplus(-(s[:, None] - s[None, :]))[better]
                total = total + (lam * pair).sum() / lam.sum().clamp_min(1e-12)
            else:
                total = total + weighted_listwise_loss(s, y)
        total = total / len(Xs) + l2 * (w * w).sum()
        total.backward()
        opt.step()
    return w.detach().numpy()

def _mean(d: Mapping[str, float]) -> float:
    return float(np.mean(list(d.values()))) if d else float("nan")


def run_study(
    train: Sequence[QueryItem], dev: Sequence[QueryItem], dev_qrels: Mapping[str, Mapping[str, int]],
    tests: Mapping[str, tuple[Sequence[QueryItem], Mapping[str, Mapping[str, int]]]], *,
    l2s: Sequence[float] = (1e-3, 1e-2, 1e-1, 1.0), layers: Sequence[int] | None = None, epochs: int = 150,
    loss: str = "listwise", temperature: float = 1.0, fixed: Mapping[str, Sequence[float]] | None = None,
) -> dict[str, Any]:
    """Every variant chosen on ``dev`` only, then scored on each test set: nDCG@10 (x100),
    delta against the first stage and a paired randomization test.

    Variants: the first stage; zero-shot ``masked`` (the served calibrated scorer),
    ``signal``, ``calibrated`` (all layers); learned per-(layer, head) weights on
    calibrated attention (``heads``: the pure reranker, no first-stage input); the same with
    the first stage's score and rank as features (``heads+first``: fused); and a
    dev-tuned interpolation ``alpha z(first) + (1 - alpha) z(reranker)`` of each pure scorer.
    ``fixed``: named head weights ``((l* + 1) * heads,)`` scored as given (e.g. a weights card,
    or a query adapter's), each with its own dev-tuned interpolation; with ``train`` empty only
    these and the zero-shot variants are scored.

    Returns:
        ``{"chosen_on_dev": {variant: {"l2" or "alpha", "dev"}}, "dev": {variant: nDCG@10},
        "tests": {set: {variant: {"ndcg@10", "delta", "p"}}}, "variants": {variant: spec}}``.

    Raises:
        ValueError: ``train`` has no query with both a positive and a negative candidate.
    """
    from heedrank.eval.compare import randomization_test

    variants: dict[str, dict[str, Any]] = {
        "first stage": {"kind": "first"},
        "zero-shot calibrated, masked (served scorer)": {"kind": "feature", "name": "masked"},
        "zero-shot signal tokens at l*": {"kind": "feature", "name": "signal"},
        "zero-shot calibrated, sum of layers": {"kind": "feature", "name": "calibrated"},
    }
    chosen: dict[str, Any] = {}
    pure = []
    for name, weights in (fixed or {}).items():
        variants[f"{name} (pure reranker)"] = {"kind": "linear", "spec": "heads", "weights": list(weights),
                                               "layers": list(layers) if layers else None}
        pure.append(f"{name} (pure reranker)")
    specs = (("heads", "learned head weights (pure reranker)"),
             ("heads+raw+signal", "learned weights on calibrated, raw and signal attention (pure reranker)"),
             ("heads+first", "learned head weights + first stage (fused)"),
             ("heads+raw+signal+first", "learned weights on all attention features + first stage (fused)"))
    for spec, label in specs if train else ():
        best = None
        for l2 in l2s:
            w = fit_listwise(train, spec, l2=l2, epochs=epochs, layers=layers, loss=loss, temperature=temperature)
            v = {"kind": "linear", "spec": spec, "weights": w.tolist(), "layers": list(layers) if layers else None}
            score = _mean(ndcg10(dev, variant_run(dev, v), dev_qrels))
            logger.info("study: %s l2=%g dev nDCG@10 %.2f", spec, l2, score)
            if best is None or score > best[0]:
                best = (score, l2, v)
        assert best is not None
        variants[label] = best[2]
        chosen[label] = {"l2": best[1], "dev": best[0]}
    if train:
        pure.append("learned head weights (pure reranker)")
    for base in ("zero-shot calibrated, masked (served scorer)", *pure):
        best = None
        for a in np.linspace(0.0, 1.0, 11):
            v = {"kind": "interpolate", "alpha": float(a), "of": variants[base]}
            score = _mean(ndcg10(dev, variant_run(dev, v), dev_qrels))
            if best is None or score > best[0]:
                best = (score, float(a), v)
        assert best is not None
        label = f"interpolation: first stage + {base.split(' (')[0]} (fused)"
        variants[label] = best[2]
        chosen[label] = {"alpha": best[1], "dev": best[0]}
    report: dict[str, Any] = {"chosen_on_dev": chosen, "dev": {}, "tests": {}}
    for name, v in variants.items():
        report["dev"][name] = _mean(ndcg10(dev, variant_run(dev, v), dev_qrels))
    for tname, (items, qrels) in tests.items():
        base = ndcg10(items, variant_run(items, variants["first stage"]), qrels)
        rows = {}
        for name, v in variants.items():
            per = ndcg10(items, variant_run(items, v), qrels)
            diffs = [per[q] - base[q] for q in base]
            rows[name] = {"ndcg@10": _mean(per), "delta": _mean(per) - _mean(base),
                          "p": None if name == "first stage" else randomization_test(diffs)}
        report["tests"][tname] = rows
    report["variants"] = variants
    return report


def format_study(report: Mapping[str, Any]) -> str:
    """Markdown table: one row per variant, dev and each test set (nDCG@10, delta, p)."""
    tests = list(report["tests"])
    head = "| variant | dev | " + " | ".join(f"{t} (delta, p)" for t in tests) + " |"
    lines = [head, "|" + "---|" * (2 + len(tests))]
    for name in report["dev"]:
        cells = []
        for t in tests:
            r = report["tests"][t][name]
            cells.append(f"{r['ndcg@10']:.1f}" if r["p"] is None else f"{r['ndcg@10']:.1f} ({r['delta']:+.1f}, p {r['p']:.3f})")
        lines.append(f"| {name} | {report['dev'][name]:.1f} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


PURE = "learned head weights (pure reranker)"


def weights_card(report: Mapping[str, Any], meta: Mapping[str, Any], *, command: str) -> dict[str, Any]:
    """The weights card of the study's pure learned reranker (``scoring='learned'`` of cached
    BlockRank): weights ``(l* + 1) * heads`` in (layer, head) order, what they fit (model
    hash, ``l*``, block budget, template), how (train data, ``l2`` chosen on dev, the fit's
    loss and layers) and their dev and test nDCG@10 with the first stage beside them;
    ``command`` is the command line that wrote it.

    Raises:
        ValidationError: nothing was trained (``report`` has no learned weights), or the fit
            weighed other layers than ``0..l*`` of the dumps ``meta`` describes.
    """
    from heedrank.reranker.doccache import CACHE_TEMPLATE_VERSION

    if PURE not in report["variants"]:
        raise ValidationError("a weights card holds learned head weights: give training dumps (--train)")
    layers = (report.get("fit") or {}).get("layers")
    if layers is not None and layers != list(range(int(meta.get("layer", 0)) + 1)):
        raise ValidationError("a weights card weighs layers 0..l* of its dumps: for another l*, dump with --layer N "
                              "(not --max-layer)")
    variant = report["variants"][PURE]
    model = (meta.get("reranker") or {}).get("model") or {}
    return {
        "format": 1, "kind": "blockrank-cached-learned-heads", "template": CACHE_TEMPLATE_VERSION,
        "model": model.get("name"), "model_sha256": model.get("sha256"), "layer": meta.get("layer"),
        "max_doc_tokens": meta.get("max_doc_tokens"), "spec": "heads", "weights": variant["weights"],
        "l2": report["chosen_on_dev"][PURE]["l2"], "train": report.get("train"),
        "dev_ndcg@10": {"first stage": report["dev"]["first stage"], "learned": report["dev"][PURE]},
        "test_ndcg@10": {t: {"first stage": rows["first stage"]["ndcg@10"], "learned": rows[PURE]["ndcg@10"],
                             "p": rows[PURE]["p"]} for t, rows in report["tests"].items()},
        "fusion": _fused_summary(report),
        "command": command,
        "fit": report.get("fit"),
    }


FUSED = "interpolation: first stage + learned head weights (fused)"


def _fused_summary(report: Mapping[str, Any]) -> dict[str, Any] | None:
    """The dev-chosen interpolation of these weights with the first stage: ``alpha`` (the
    value of ``/search``'s ``rerank.fusion`` and ``eval --fusion``) and its figures."""
    chosen = report["chosen_on_dev"].get(FUSED)
    if chosen is None:
        return None
    return {"alpha": round(float(chosen["alpha"]), 4), "dev_ndcg@10": chosen["dev"],
            "test_ndcg@10": {t: {"first stage": rows["first stage"]["ndcg@10"], "fused": rows[FUSED]["ndcg@10"],
                                 "p": rows[FUSED]["p"]} for t, rows in report["tests"].items()}}

def fixed_weights(path: Path) -> list[float]:
    """Head weights of a weights card (``.json``) or of a query adapter folder (its trained
    ``scorer.weights``, else the shipped card of its model).

    Raises:
        NotFoundError: no card at ``path``.
        ValidationError: a card without weights.
    """
    from heedrank.reranker.cards import packaged_card_path, read_card

    if path.is_dir():
        from safetensors.numpy import load_file

        tensors = load_file(str(path / "adapter.safetensors"))
        if "scorer.weights" in tensors:
            return tensors["scorer.weights"].astype(float).tolist()
        adapter = json.loads((path / "adapter.json").read_text())
        path = packaged_card_path(adapter["model"]["name"])
    if not path.is_file():
        raise NotFoundError(f"no weights at {path}: pass a weights card (.json) or a query adapter folder")
    card = read_card(path)
    if card.weights is None:
        raise ValidationError(f"weights card {path} has no weights: refit it with `heedrank lab fit --export`")
    return [float(x) for x in card.weights]

@dataclass(frozen=True)
class StudyFit:
    """What :func:`fit_study` found.

    Attributes:
        report: :func:`run_study`'s report, with ``"fit"`` (loss,
            temperature, layers) and ``"train"`` (dumps, queries) added.
        dev_meta: The dev dump's metadata (its reranker, ``l*``, block budget, qrels).
    """

    report: dict[str, Any]
    dev_meta: dict[str, Any]


def fit_study(
    train: Sequence[Path], dev: Path, tests: Mapping[str, Path], *, epochs: int = 150, loss: str = "listwise",
    temperature: float = 1.0, max_layer: int | None = None, fixed: Mapping[str, Path] | None = None,
) -> StudyFit:
    """Fit and compare the study's variants on feature dumps: learned head weights fitted on
    ``train`` (none: only the zero-shot scorers and the ``fixed`` weights, read with
    :func:`fixed_weights`), every choice made on ``dev``, then nDCG@10 with paired tests on
    each of ``tests``; layers ``0..max_layer`` only when given.

    Raises:
        ValidationError: an unknown ``loss``.
    """
    from heedrank.lab.study import load_items

    if loss not in LOSSES:
        raise ValidationError(f"--loss: expected one of {', '.join(LOSSES)}, got {loss!r}")
    train_items = [it for path in train for it in load_items(path)[1]]
    weights = {name: fixed_weights(path) for name, path in (fixed or {}).items()}
    dev_meta, dev_items = load_items(dev)
    test_sets = {}
    for name, path in tests.items():
        meta, items = load_items(path)
        test_sets[name] = (items, meta["qrels"])
    layers = list(range(max_layer + 1)) if max_layer is not None else None
    report = run_study(train_items, dev_items, dev_meta["qrels"], test_sets, epochs=epochs, loss=loss,
                       temperature=temperature, layers=layers, fixed=weights)
    report["fit"] = {"loss": loss, "temperature": temperature, "layers": layers}
    report["train"] = {"dumps": [str(p) for p in train], "queries": len(train_items)}
    return StudyFit(report, dev_meta)

"""The reranker training and fusion study on cached BlockRank (docs/RESULTS.md, "Training and fusion study"), from ONE pass per query.

Per query, :func:`block_features` runs cached BlockRank's query block (and the ``N/A``
calibration block) once against the candidates' stored blocks and keeps, per candidate:

* ``calibrated``: float32 ``(N, L, H)``: ICR-style calibrated attention mass of the query
  block's rows on the candidate's tokens, per layer ``0..l*`` and head (query minus
  ``N/A``; Chen et al. ICLR 2025 section 3, read through BlockRank's block structure);
* ``raw``: float32 ``(N, L, H)``: the same without calibration;
* ``signal``: float32 ``(N, H)``: signal-token attention at ``l*`` per head, softmax over
  candidate tokens only (Gupta et al. 2025 section 4);
* ``masked``: float32 ``(N,)``: the calibrated scorer as served (sum over layers and heads,
  per-document ``mean - 2 std`` token mask);
* the first-stage scores and ranks, and the qrels grades.

Every variant of the study (zero-shot scorers, learned per-(layer, head) weights, fusion with
the first stage) is then computed offline from these arrays (:func:`fit_listwise`,
:func:`variant_run`), so the LM runs once per query whatever is tried. Learned weights follow
QRRanker's idea (per-head attention scores combined by a learned linear model, here trained
with a listwise softmax loss counting every positive, Gupta et al. 2025's ``L_aux``).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from heedrank.fusion import fuse, standardize
from heedrank.reranker.scoring import linear_head_scores

from heedrank.types import Document

logger = logging.getLogger(__name__)


def block_features(reranker: Any, query: str, docs: Sequence[Document], *, block_store: Any = None) -> dict[str, Any]:
    """Per-candidate attention features of one query from one cached BlockRank pass.

    Args:
        reranker: :class:`heedrank.reranker.blockrank.BlockRankReranker` with
            ``query_in_instruction=false``.
        query: Query text.
        docs: Candidates (first-stage order).
        block_store: The collection's document KV store (blocks missing from it are computed
            and written back), or ``None`` (the reranker's RAM cache).

    Returns:
        ``{"calibrated": (N, L, H), "raw": (N, L, H), "signal": (N, H), "masked": (N,),
        "cache": {"hits", "misses"}}`` as float32 numpy arrays (module docstring).
    """
    import torch

    from heedrank.reranker.blockforward import block_forward
    from heedrank.reranker.scoring import masked_document_scores, per_head_document_mass, spans_from_lengths

    lm = reranker.lm
    layer = reranker.layer
    prompt = reranker.build_prompt(query, docs)
    L0 = len(prompt.instruction_ids)
    lengths = prompt.doc_lengths
    D = sum(lengths)
    bounds = spans_from_lengths(lengths)
    owner = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    layers = list(range(layer + 1))
    with lm.lock, torch.inference_mode():
        ctx = reranker.cached_context(prompt, block_store)  # blocks: the base model's, even with a query adapter
        kv, cache = ctx.kv, ctx.cache
        qo, _ = block_forward(lm, prompt, layer, mode="mean", read_layers=layers, kv=kv)
        co, _ = block_forward(lm, prompt, layer, query_ids=prompt.calib_ids, mode="mean", read_layers=layers, kv=kv)
        sig, _ = block_forward(lm, prompt, layer, read_layers=[layer], kv=kv)
    n, H = len(lengths), qo[layer].shape[1]

    def per_doc(x: Any) -> Any:  # (H, D) -> (N, H)
        return torch.zeros(n, H).index_add(0, owner, x.T.float())

    raw = per_head_document_mass(qo, L0, lengths, layers).float()
    cal = per_head_document_mass(qo, L0, lengths, layers, minus=co).float()
    token_c = sum((qo[l][0, :, L0 : L0 + D] - co[l][0, :, L0 : L0 + D]).sum(0) for l in layers)
    masked = masked_document_scores(token_c, bounds, reranker.options.mask_std)
    z = sig[layer][0, :, :, L0 : L0 + D].float()  # (H, n_signal, D)
    alpha = torch.softmax(z, dim=-1).mean(dim=1)  # (H, D)
    signal = per_doc(alpha)
    return {"calibrated": cal.numpy(), "raw": raw.numpy(), "signal": signal.numpy(),
            "masked": np.asarray(masked, dtype=np.float32), "cache": cache}


@dataclass(frozen=True)
class QueryItem:
    """One query of a feature dump: candidates in first-stage order with their features."""

    query_id: str
    doc_ids: list[str]
    first_stage: np.ndarray  # (N,) first-stage scores
    labels: np.ndarray  # (N,) qrels grades (0 when unjudged)
    features: Mapping[str, np.ndarray]


def save_items(path: str | Path, items: Sequence[QueryItem], meta: Mapping[str, Any]) -> None:
    """Write a dump (one ``.npz``-like pickle-free archive: arrays + a JSON index)."""
    import json

    path = Path(path)
    arrays: dict[str, np.ndarray] = {}
    index = []
    for i, it in enumerate(items):
        index.append({"query_id": it.query_id, "doc_ids": it.doc_ids})
        arrays[f"{i}/first_stage"] = it.first_stage
        arrays[f"{i}/labels"] = it.labels
        for k, v in it.features.items():
            arrays[f"{i}/{k}"] = v
    tmp = path.with_suffix(".tmp.npz")
    np.savez(tmp, __index__=np.frombuffer(json.dumps({"meta": dict(meta), "items": index}, default=str).encode(), dtype=np.uint8),
             **arrays)
    tmp.replace(path)


def load_items(path: str | Path) -> tuple[dict[str, Any], list[QueryItem]]:
    """Inverse of :func:`save_items`: ``(meta, items)``."""
    import json

    z = np.load(path)
    idx = json.loads(bytes(z["__index__"]).decode())
    items = []
    for i, rec in enumerate(idx["items"]):
        feats = {k.split("/", 1)[1]: z[k] for k in z.files if k.startswith(f"{i}/")
                 and k.split("/", 1)[1] not in ("first_stage", "labels")}
        items.append(QueryItem(rec["query_id"], rec["doc_ids"], z[f"{i}/first_stage"], z[f"{i}/labels"], feats))
    return idx["meta"], items


# ------------------------------------------------------------------------------ variants
def _z(x: np.ndarray) -> np.ndarray:
    """Per-query standardisation of each column (:func:`heedrank.fusion.standardize`)."""
    return standardize(x)


def design(item: QueryItem, spec: str, layers: Sequence[int] | None = None) -> np.ndarray:
    """Feature matrix ``(N, F)`` float32 of one query for a feature spec:

    ``"heads"``: calibrated per (layer, head), z-scored per query (``layers`` to restrict);
    ``"raw"``: uncalibrated per (layer, head) (with ``heads``, the linear model also sees the
    ``N/A`` query's attention, i.e. a learned calibration); ``"signal"``: signal per head; ``"first"``: z-scored first-stage score and
    ``1/(60 + rank)``; specs joined with ``+`` concatenate (``"heads+first"``).
    """
    cols = []
    for part in spec.split("+"):
        if part == "heads":
            cal = item.features["calibrated"]
            if layers is not None:
                cal = cal[:, list(layers)]
            cols.append(_z(cal.reshape(cal.shape[0], -1)))
        elif part == "raw":
            raw = item.features["raw"]
            if layers is not None:
                raw = raw[:, list(layers)]
            cols.append(_z(raw.reshape(raw.shape[0], -1)))
        elif part == "signal":
            cols.append(_z(item.features["signal"]))
        elif part == "masked":
            cols.append(_z(item.features["masked"][:, None]))
        elif part == "first":
            n = len(item.first_stage)
            cols.append(_z(item.first_stage[:, None].astype(np.float64)))
            cols.append(_z((1.0 / (60.0 + np.arange(1, n + 1)))[:, None]))
        else:
            raise ValueError(f"unknown feature part {part!r}")
    return np.concatenate(cols, axis=1).astype(np.float32)


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
                total = total - torch.logsumexp(s + torch.log(y.clamp_min(1e-30)), 0) + torch.logsumexp(s, 0)
        total = total / len(Xs) + l2 * (w * w).sum()
        total.backward()
        opt.step()
    return w.detach().numpy()


def variant_scores(item: QueryItem, variant: Mapping[str, Any]) -> np.ndarray:
    """Scores ``(N,)`` of one query under a variant: ``{"kind": "feature", "name": ...}``
    (a zero-shot scorer: ``masked``, ``signal`` (mean over heads), ``calibrated`` (sum over
    ``layers``)), ``{"kind": "linear", "spec", "weights", "layers"?}``, or
    ``{"kind": "interpolate", "alpha", "of": <variant>}`` (``alpha * z(first) + (1 - alpha) * z(of)``)."""
    kind = variant["kind"]
    if kind == "first":
        return item.first_stage.astype(np.float64)
    if kind == "feature":
        name = variant["name"]
        if name == "masked":
            return item.features["masked"].astype(np.float64)
        if name == "signal":
            return item.features["signal"].mean(axis=1).astype(np.float64)
        cal = item.features["calibrated"]
        layers = variant.get("layers")
        if layers is not None:
            cal = cal[:, list(layers)]
        return cal.sum(axis=(1, 2)).astype(np.float64)
    if kind == "linear":
        if variant["spec"] == "heads":  # the served learned scorer (heedrank.reranker.scoring)
            cal = item.features["calibrated"].astype(np.float64)
            if variant.get("layers") is not None:
                cal = cal[:, list(variant["layers"])]
            return linear_head_scores(cal, np.asarray(variant["weights"], dtype=np.float64))
        return design(item, variant["spec"], variant.get("layers")) @ np.asarray(variant["weights"])
    if kind == "interpolate":
        return fuse(item.first_stage, variant_scores(item, variant["of"]), float(variant["alpha"]))
    raise ValueError(f"unknown variant kind {kind!r}")


def variant_run(items: Sequence[QueryItem], variant: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """The run ``{query_id: {doc_id: score}}`` of a variant (candidates only)."""
    out = {}
    for it in items:
        s = variant_scores(it, variant)
        out[it.query_id] = {d: float(x) if math.isfinite(x) else -1e9 for d, x in zip(it.doc_ids, s)}
    return out


def dump_features(
    out: str | Path, queries: Sequence[Any], candidates: Mapping[str, Sequence[Document]],
    first_scores: Mapping[str, Sequence[float]], qrels: Mapping[str, Mapping[str, int]], reranker: Any, *,
    block_store: Any = None, meta: Mapping[str, Any] | None = None, show_progress: bool = True,
    checkpoint_every: int = 50,
) -> list[QueryItem]:
    """Run :func:`block_features` for every query and save the dump to ``out``.

    Resumable: the dump is rewritten every ``checkpoint_every`` queries, and a rerun loads
    it and skips the queries it holds (a ``kill -9`` loses at most that many queries).
    """
    import time

    from tqdm.auto import tqdm

    out = Path(out)
    meta = dict(meta or {})
    done: list[QueryItem] = []
    if out.exists():
        _, done = load_items(out)
        logger.info("feature dump %s: %d queries already done", out, len(done))
    have = {it.query_id for it in done}
    todo = [q for q in queries if q.query_id not in have and candidates.get(q.query_id)]
    t0 = time.perf_counter()
    hits = misses = 0
    for i, q in enumerate(tqdm(todo, desc="features", unit="query", disable=not show_progress)):
        docs = list(candidates[q.query_id])
        f = block_features(reranker, q.text, docs, block_store=block_store)
        hits += f["cache"]["hits"] if f["cache"] else 0
        misses += f["cache"]["misses"] if f["cache"] else 0
        grades = qrels.get(q.query_id, {})
        done.append(QueryItem(
            q.query_id, [d.doc_id for d in docs], np.asarray(first_scores[q.query_id], dtype=np.float64),
            np.asarray([int(grades.get(d.doc_id, 0)) for d in docs], dtype=np.int64),
            {k: f[k] for k in ("calibrated", "raw", "signal", "masked")},
        ))
        if (i + 1) % checkpoint_every == 0:
            save_items(out, done, meta)
    seconds = time.perf_counter() - t0
    meta.update(seconds_last_run=seconds, queries_last_run=len(todo), cache_hits=hits, cache_misses=misses)
    save_items(out, done, meta)
    logger.info("feature dump %s: %d queries (%d new in %.0f s; blocks %d hits, %d misses)", out, len(done),
                len(todo), seconds, hits, misses)
    return done


# ------------------------------------------------------------------------------ the study
def ndcg10(items: Sequence[QueryItem], run: Mapping[str, Mapping[str, float]], qrels: Mapping[str, Mapping[str, int]]
           ) -> dict[str, float]:
    """Per-query nDCG@10 (x100) of ``run`` against the full ``qrels`` (ir-measures), over
    every query of ``qrels`` (the dump's selected queries): a query whose first stage found
    no candidate (so has no item) scores 0, as in the evaluator."""
    from heedrank.eval.metrics import evaluate_run

    ev = evaluate_run(run, qrels, ["nDCG@10"], query_ids=sorted(set(qrels) | {it.query_id for it in items}))
    return {q: 100.0 * v["nDCG@10"] for q, v in ev.per_query.items()}


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
    from heedrank.errors import ValidationError
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

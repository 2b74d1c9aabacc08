"""The reranker training and fusion study on cached BlockRank (docs/results/training.md, "The training and fusion study"), from ONE pass per query.

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
* ``independent``: float32 ``(N, L, H, G)``: the list-independent features
  (:func:`heedrank.reranker.cached.independent.document_features`: the query and ``N/A``
  blocks against block 0 alone, their logits to the candidate's keys);
* the first-stage scores and ranks, and the qrels grades.

Every variant of the study (zero-shot scorers, learned per-(layer, head) weights, fusion with
the first stage) is then scored offline from these arrays (:func:`design`,
:func:`variant_scores`, :func:`variant_run`, :func:`ndcg10`), so the LM runs once per query
whatever is tried. The learned weights are fitted, and the variants chosen on dev, by
:mod:`heedrank.lab.train.head_fit` (:func:`heedrank.lab.train.head_fit.fit_listwise`,
:func:`heedrank.lab.train.head_fit.run_study`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from heedrank.fusion import fuse, rrf, standardize
from heedrank.reranker.scoring import linear_head_scores

from heedrank.types import Document

logger = logging.getLogger(__name__)


def block_features(reranker: Any, query: str, docs: Sequence[Document], *, block_store: Any = None) -> dict[str, Any]:
    """Per-candidate attention features of one query from one cached BlockRank pass.

    Args:
        reranker: A :class:`heedrank.reranker.cached.CachedBlockRankReranker`.
        query: Query text.
        docs: Candidates (first-stage order).
        block_store: The collection's document KV store (blocks missing from it are computed
            and written back), or ``None`` (the reranker's RAM cache).

    Returns:
        ``{"calibrated": (N, L, H), "raw": (N, L, H), "signal": (N, H), "masked": (N,),
        "independent": (N, L, H, G), "cache": {"hits", "misses"}}`` as float32 numpy arrays (module docstring).
    """
    import torch

    from heedrank.reranker.blockforward import block_forward
    from heedrank.reranker.cached.independent import document_features, query_states
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
        states, groups = query_states(lm, prompt, kv, layers)
        independent = document_features(states, groups, kv, L0, lengths)
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
            "masked": np.asarray(masked, dtype=np.float32), "independent": independent.numpy(), "cache": cache}


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
             **arrays)  # type: ignore[arg-type]  # numpy's stub binds **arrays to allow_pickle: bool
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
def design(item: QueryItem, spec: str, layers: Sequence[int] | None = None) -> np.ndarray:
    """Feature matrix ``(N, F)`` float32 of one query for a feature spec:

    ``"heads"``: calibrated per (layer, head), z-scored per query (:func:`heedrank.fusion.standardize`;
    ``layers`` to restrict);
    ``"raw"``: uncalibrated per (layer, head) (with ``heads``, the linear model also sees the
    ``N/A`` query's attention, i.e. a learned calibration); ``"signal"``: signal per head; ``"first"``: z-scored first-stage score and
    ``1/(60 + rank)`` (:func:`heedrank.fusion.rrf`); specs joined with ``+`` concatenate (``"heads+first"``).
    """
    cols = []
    for part in spec.split("+"):
        if part == "heads":
            cal = item.features["calibrated"]
            if layers is not None:
                cal = cal[:, list(layers)]
            cols.append(standardize(cal.reshape(cal.shape[0], -1)))
        elif part == "raw":
            raw = item.features["raw"]
            if layers is not None:
                raw = raw[:, list(layers)]
            cols.append(standardize(raw.reshape(raw.shape[0], -1)))
        elif part == "signal":
            cols.append(standardize(item.features["signal"]))
        elif part == "masked":
            cols.append(standardize(item.features["masked"][:, None]))
        elif part == "first":
            n = len(item.first_stage)
            cols.append(standardize(item.first_stage[:, None].astype(np.float64)))
            cols.append(standardize(rrf(np.arange(1, n + 1))[:, None]))
        else:
            raise ValueError(f"unknown feature part {part!r}")
    return np.concatenate(cols, axis=1).astype(np.float32)


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
            {k: f[k] for k in ("calibrated", "raw", "signal", "masked", "independent")},
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

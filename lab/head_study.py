"""Query-focused heads, the evaluation side: first-stage candidates, attention dumps, and the
ICR ablation (heads x ReAttn x first-stage fusion) scored from ONE pass per query.

A *dump* holds, per query, the calibrated per-head token attention ``c[l,h,j]`` of one ICR
pass (float16, all layers), the prompt's token ids and document spans, the candidates with
their first-stage scores and qrels grades. Head detection and weight fitting
(:mod:`heedrank.lab.train.icr_heads`) and every ablation variant are computed from dumps, so
the LM runs once per query (docs/design/algorithms.md section 2).
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from heedrank.config import RerankerConfig
from heedrank.eval.report import DUMP_FORMAT, dump_file_name, load_dump
from heedrank.types import Document, Qrels, Query

logger = logging.getLogger(__name__)


# ---------------------------------------------------------------------------- dumps
def dump_attention(
    out_dir: str | Path,
    queries: Sequence[Query],
    candidates: Mapping[str, Sequence[Document]],
    first_scores: Mapping[str, Sequence[float]],
    qrels: Qrels,
    *,
    reranker_config: RerankerConfig | None = None,
    shuffle: bool = False,
    seed: int = 0,
    info: Mapping[str, Any] | None = None,
    show_progress: bool = True,
) -> Path:
    """Run one ICR pass per query (all layers and heads) and save it to ``out_dir``.

    Resumable: queries already dumped are skipped. ``shuffle`` randomises the candidate
    order (head detection); otherwise candidates keep first-stage order (ICR places the
    best nearest the query).

    Returns:
        ``out_dir`` (``meta.json`` + ``<query_id>.pt`` per query).
    """
    import torch

    from heedrank.reranker.icr import ICRReranker

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cfg = replace(reranker_config or RerankerConfig(), method="icr", options={})
    icr = ICRReranker(cfg)
    meta = {"format": DUMP_FORMAT, "reranker": icr.describe(), "shuffle": shuffle, "seed": seed, **(info or {})}
    (out / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
    rng = random.Random(seed)
    it: Any = queries
    if show_progress:
        from tqdm.auto import tqdm

        it = tqdm(queries, desc="attention dump", unit="query")
    for q in it:
        path = out / f"{dump_file_name(q.query_id)}.pt"
        docs = list(candidates.get(q.query_id, []))
        fs = list(first_scores.get(q.query_id, []))
        order = list(range(len(docs)))
        if shuffle:
            rng.shuffle(order)
        if path.exists() or not docs:
            continue
        docs, fs = [docs[i] for i in order], [fs[i] for i in order]
        prompt = icr.build_prompt(q.text, docs)
        t0 = time.perf_counter()
        att = icr.token_attention(prompt)
        seconds = time.perf_counter() - t0
        item = {
            "query_id": q.query_id, "query": q.text, "doc_ids": [d.doc_id for d in docs],
            "texts": [d.content for d in docs], "first_stage_scores": fs,
            "labels": [int(qrels.get(q.query_id, {}).get(d.doc_id, 0)) for d in docs],
            "spans": prompt.spans, "context_ids": prompt.context_ids,
            "calibrated": att.calibrated().to(torch.float16), "seconds": seconds,
        }
        tmp = path.with_suffix(".tmp")
        torch.save(item, tmp)
        tmp.replace(path)
    return out


# ---------------------------------------------------------------------------- ablation
@dataclass(frozen=True)
class Variant:
    heads: str  # all | qr | learned
    reattn: str  # none | idf | entropy | both
    fusion: str  # none | rrf

    @property
    def name(self) -> str:
        return f"{self.heads}/{self.reattn}/{self.fusion}"


REATTN = {"none": None, "idf": {"idf": True, "entropy": False}, "entropy": {"idf": False, "entropy": True},
          "both": {"idf": True, "entropy": True}}


def ablation_scores(item: Mapping[str, Any], variant: Variant, *, headset, tokenizer) -> list[float]:
    """Scores of one query of an ICR attention dump under one ablation variant (candidate
    order); ``fusion="rrf"`` adds the reranker's and the first stage's
    :func:`heedrank.fusion.rrf` of each candidate."""
    import torch

    from heedrank.reranker.heads import per_head_document_scores
    from heedrank.reranker.icr import masked_document_scores
    from heedrank.reranker.prompt import encode_untrusted
    from heedrank.reranker.reattn import ReAttnConfig, reattn_scores, token_forms

    c = item["calibrated"].float()
    spans = item["spans"]
    weights = None
    if variant.heads == "all":
        tok_scores = c.sum((0, 1))
    elif variant.heads == "qr":
        tok_scores = sum(c[l, h] for l, h in headset.heads)
    else:
        weights = torch.tensor(headset.weights)[: c.shape[0]]
        tok_scores = (c * weights[..., None]).sum((0, 1))
    cfg = ReAttnConfig.parse(REATTN[variant.reattn])
    if cfg is not None:
        mass = [tok_scores[s:e].tolist() for s, e in spans]
        forms = [token_forms(tokenizer, item["context_ids"][s:e]) for s, e in spans]
        qforms = set(token_forms(tokenizer, encode_untrusted(tokenizer, " " + item["query"].strip())))
        scores = reattn_scores(mass, forms, qforms, cfg)
    elif weights is not None:
        ph = per_head_document_scores(c, spans)
        scores = (ph * weights[..., None]).sum((0, 1)).tolist()
    else:
        scores = masked_document_scores(tok_scores, spans)
    if variant.fusion == "rrf":
        from heedrank.fusion import rrf
        from heedrank.types import ranks_from_scores

        ids = item["doc_ids"]
        r_rerank = ranks_from_scores(ids, scores)
        r_first = ranks_from_scores(ids, item["first_stage_scores"])
        scores = [rrf(r_rerank[d]) + rrf(r_first[d]) for d in ids]
    return scores


def ablation(
    dump_dir: str | Path, headset_path: str | Path, *, metrics: Sequence[str] = ("nDCG@10",), qrels: Qrels | None = None,
    trials: int = 10_000,
) -> dict[str, Any]:
    """Evaluate every variant on a dump; deltas vs ICR (all heads) and vs the first stage
    with the paired randomization test.

    Returns:
        ``{"variants": {name: {metric: value}}, "deltas": {...}, "first_stage": {...}, ...}``.
    """
    from heedrank.eval.compare import randomization_test
    from heedrank.eval.metrics import evaluate_run
    from heedrank.reranker.heads import HeadSet
    from heedrank.reranker.lm import load_lm

    meta, items = load_dump(dump_dir)
    hs = HeadSet.load(headset_path)
    tok = load_lm(meta["reranker"]["model"]["path"] if meta["reranker"]["model"].get("source") == "directory" else None).tokenizer
    if qrels is None:
        logger.warning("no qrels given: scoring with the candidates' own labels (within-candidates nDCG)")
        qrels = {it["query_id"]: {d: g for d, g in zip(it["doc_ids"], it["labels"])} for it in items}
    variants = [Variant(h, r, f) for h in ("all", "qr", "learned") if h != "learned" or hs.weights is not None
                for r in REATTN for f in ("none", "rrf")]
    first = {it["query_id"]: dict(zip(it["doc_ids"], it["first_stage_scores"])) for it in items}
    ev_first = evaluate_run(first, qrels, metrics)
    results, per_query = {}, {}
    for v in variants:
        run = {it["query_id"]: dict(zip(it["doc_ids"], ablation_scores(it, v, headset=hs, tokenizer=tok))) for it in items}
        ev = evaluate_run(run, qrels, metrics)
        results[v.name] = ev.aggregate
        per_query[v.name] = ev.per_query
    base = "all/none/none"
    deltas: dict[str, dict[str, dict[str, float]]] = {}
    for name in results:
        deltas[name] = {}
        for m in metrics:
            for ref, pq in (("icr", per_query[base]), ("first_stage", ev_first.per_query)):
                diffs = [per_query[name][q][m] - pq[q][m] for q in per_query[name]]
                deltas[name][f"{m} vs {ref}"] = {
                    "delta": sum(diffs) / len(diffs), "p": randomization_test(diffs, trials=trials),
                }
    return {"dump": str(dump_dir), "queries": len(items), "first_stage": ev_first.aggregate,
            "variants": results, "deltas": deltas, "headset": str(headset_path), "meta": meta}


def format_ablation(result: Mapping[str, Any], metric: str = "nDCG@10") -> str:
    """Table: variant, metric x100, delta vs ICR (p), delta vs first stage (p)."""
    lines = [f"{result['queries']} queries; first stage {metric} {100 * result['first_stage'][metric]:.1f}",
             f"{'heads/reattn/fusion':24} {metric:>8} {'vs ICR':>8} {'p':>6} {'vs 1st':>8} {'p':>6}"]
    for name, m in result["variants"].items():
        d = result["deltas"][name]
        a, b = d[f"{metric} vs icr"], d[f"{metric} vs first_stage"]
        lines.append(f"{name:24} {100 * m[metric]:8.1f} {100 * a['delta']:+8.1f} {a['p']:6.3f} "
                     f"{100 * b['delta']:+8.1f} {b['p']:6.3f}")
    return "\n".join(lines)

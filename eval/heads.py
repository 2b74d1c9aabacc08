"""Query-focused heads end to end: attention dumps, head detection, learned head weights,
and the ICR ablation (heads x ReAttn x first-stage fusion) scored from ONE pass per query.

A *dump* holds, per query, the calibrated per-head token attention ``c[l,h,j]`` of one ICR
pass (float16, all layers), the prompt's token ids and document spans, the candidates with
their first-stage scores and qrels grades. Detection, weight fitting and every ablation
variant are computed from dumps, so the LM runs once per query (ALGORITHMS.md section 2).
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
from heedrank.errors import ValidationError
from heedrank.eval.dump import DUMP_FORMAT, dump_file_name, load_dump
from heedrank.types import Document, Qrels, Query

logger = logging.getLogger(__name__)



# ---------------------------------------------------------------------------- candidates
def beir_candidates(
    data_dir: str | Path, split: str, *, queries: int | None, candidates: int, seed: int,
    index_dir: str | Path | None, retriever: str = "bm25", ensure_gold: bool = False,
) -> tuple[list[Query], dict[str, list[Document]], dict[str, list[float]], Qrels]:
    """First-stage candidates of a seeded query subset of a BEIR split.

    With ``ensure_gold`` (detection), a query whose candidates hold no relevant document gets
    its lowest candidate replaced by a random relevant one (seeded).
    """
    from heedrank.config import PipelineConfig
    from heedrank.data import load_beir_qrels, load_beir_queries
    from heedrank.pipeline import Pipeline, SearchOptions
    from heedrank.eval.beir import ensure_index
    from heedrank.eval.harness import select_queries

    data_dir = Path(data_dir)
    qrels = load_beir_qrels(data_dir, split)
    selected, _ = select_queries(load_beir_queries(data_dir), qrels, queries, seed)
    index_dir = index_dir or ensure_index(data_dir, dense=retriever != "bm25")
    pipe = Pipeline.from_config(PipelineConfig(index_dir=str(index_dir), max_top_k=1000, max_candidates=1000))
    results = pipe.search_batch(selected, SearchOptions(top_k=candidates, retriever=retriever))
    rng = random.Random(seed)
    cands, scores = {}, {}
    for res in results:
        qid = res.query.query_id
        hits = list(res.ranking.hits)
        gold = [d for d, g in qrels.get(qid, {}).items() if g > 0]
        if ensure_gold and gold and not any(h.doc_id in gold for h in hits):
            pick = rng.choice(sorted(gold))
            doc = pipe.docstore.get_many([pick]).get(pick)
            if doc is not None:
                from heedrank.types import ScoredDoc

                hits = hits[:-1] + [ScoredDoc(pick, min((h.score for h in hits), default=0.0) - 1.0, doc)]
        cands[qid] = [h.document for h in hits]
        scores[qid] = [h.score for h in hits]
    return selected, cands, scores, qrels


def trec_dl_candidates(
    data_dir: str | Path, *, run_name: str, candidates: int, queries: int | None = None, seed: int = 0,
) -> tuple[list[Query], dict[str, list[Document]], dict[str, list[float]], Qrels]:
    """Top ``candidates`` of a TREC DL first-stage run JSON (with passage text)."""
    from heedrank.data import load_run_json, load_trec_qrels, trec_dl_paths
    from heedrank.eval.harness import select_queries

    paths = trec_dl_paths(data_dir, run_name)
    run, docs, topics = load_run_json(paths.run_json)
    qrels = load_trec_qrels(paths.qrels)
    selected, _ = select_queries(topics, qrels, queries, seed)
    cands, scores = {}, {}
    for q in selected:
        ranked = sorted(run.get(q.query_id, {}).items(), key=lambda x: (-x[1], x[0]))[:candidates]
        cands[q.query_id] = [docs[d] for d, _ in ranked]
        scores[q.query_id] = [s for _, s in ranked]
    return selected, cands, scores, qrels


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


def detect_heads(dump_dir: str | Path, *, method: str = "qrscore", top_k: int = 16, mask_std: float | None = 2.0):
    """Detect query-focused heads from a dump (ALGORITHMS.md section 2).

    Returns:
        :class:`heedrank.reranker.heads.HeadSet` with every head's score and the ``top_k`` selected.
    """

    from heedrank.reranker.heads import HeadSet, ndcg_at_k, per_head_document_scores, qrscore, select_heads

    if method not in ("qrscore", "ndcg"):
        raise ValidationError(f"method must be 'qrscore' or 'ndcg', got {method!r}")
    meta, items = load_dump(dump_dir)
    if not items:
        raise ValidationError(f"dump {dump_dir} holds no query")
    total = None
    used = 0
    for it in items:
        if not any(g > 0 for g in it["labels"]):
            continue
        ph = per_head_document_scores(it["calibrated"].float(), it["spans"], mask_std)
        s = qrscore(ph, [g > 0 for g in it["labels"]]) if method == "qrscore" else ndcg_at_k(ph, it["labels"])
        total = s if total is None else total + s
        used += 1
    scores = (total / used).tolist()
    heads = select_heads(scores, top_k)
    return HeadSet(
        model=meta["reranker"]["model"], heads=tuple(heads), method=method,
        scores=tuple(tuple(round(x, 6) for x in row) for row in scores),
        detection={**{k: meta.get(k) for k in ("dataset", "split", "first_stage", "candidates", "seed", "shuffle")},
                   "queries": used, "top_k": top_k, "mask_std": mask_std},
    )


# ---------------------------------------------------------------------------- learned weights
def _scaled(s, lo: float = 0.0, hi: float = 8.0):
    mn, mx = s.min(), s.max()
    return lo + (hi - lo) * (s - mn) / (mx - mn + 1e-9)


def group_contrastive_loss(scores, gold):
    """``-mean_{p in G} log(e^{s_p} / (e^{s_p} + sum_{n not in G} e^{s_n}))`` after min-max
    scaling the query's scores to [0, 8] (ALGORITHMS.md section 2). ``gold``: bool tensor."""
    import torch

    s = _scaled(scores)
    neg = torch.logsumexp(s[~gold], dim=0) if (~gold).any() else torch.tensor(float("-inf"))
    pos = s[gold]
    return -(pos - torch.logaddexp(pos, neg)).mean()


def fit_head_weights(
    dump_dir: str | Path, headset_path: str | Path, *, max_layer: int | None = None, epochs: int = 200,
    lr: float = 0.05, l2: float = 1e-3, holdout: float = 0.25, seed: int = 0, mask_std: float | None = 2.0,
    support: str = "qr", nonneg: bool = True,
):
    """Fit weights over per-head document scores with the group contrastive loss and save
    them into the head set (``weights``, ``weights_info``).

    ``support="qr"`` (default) re-weights the selected QR heads only (one weight each, the
    rest stay 0); ``support="all"`` gives every head in layers ``<= max_layer`` (default:
    the head set's deepest layer, so the forward pass can still stop early) a weight; with
    a few hundred heads and ~100 training queries that overfits (measured: NFCorpus test
    nDCG@10 23.3 against 32.1 for the plain QR-head sum). ``nonneg`` keeps weights >= 0 (a
    head votes for the documents it attends to, or abstains). A seeded ``holdout`` fraction
    of the dump's queries picks the epoch with the lowest held-out loss. Per-head scores are
    normalised by their mean magnitude; weights start from the QR-head sum and ``l2`` pulls
    them toward it.

    Raises:
        ValidationError: fewer than 4 usable queries, or an unknown ``support``.

    Returns:
        The updated :class:`heedrank.reranker.heads.HeadSet` (also saved to ``headset_path``).
    """
    import torch

    from heedrank.reranker.heads import HeadSet, per_head_document_scores

    if support not in ("qr", "all"):
        raise ValidationError(f"support must be 'qr' or 'all', got {support!r}")
    hs = HeadSet.load(headset_path)
    _, items = load_dump(dump_dir)
    max_layer = hs.deepest_layer if max_layer is None else max_layer
    data = []
    for it in items:
        gold = torch.tensor([g > 0 for g in it["labels"]])
        if gold.all() or not gold.any():
            continue
        ph = per_head_document_scores(it["calibrated"].float(), it["spans"], mask_std)[: max_layer + 1]
        data.append((ph, gold))
    if len(data) < 4:
        raise ValidationError("too few queries with both relevant and non-relevant candidates to fit weights")
    rng = random.Random(seed)
    idx = list(range(len(data)))
    rng.shuffle(idx)
    n_hold = max(1, int(len(idx) * holdout))
    hold, train = [data[i] for i in idx[:n_hold]], [data[i] for i in idx[n_hold:]]
    L, H = data[0][0].shape[:2]
    scale = torch.stack([ph.abs().mean(-1) for ph, _ in train]).mean(0) + 1e-9  # (L, H)
    init = torch.zeros(L, H)
    for l, h in hs.heads:
        if l <= max_layer:
            init[l, h] = 1.0
    # Per-head scores are normalised by their mean magnitude, so that the weights ``v`` are
    # on one scale (Adam steps of ``lr`` move every head alike); the saved weights are v / scale.
    train = [(ph / scale[..., None], g) for ph, g in train]
    hold = [(ph / scale[..., None], g) for ph, g in hold]
    free = (init > 0) if support == "qr" else torch.ones(L, H, dtype=torch.bool)
    free[max_layer + 1:] = False
    v = init[free].clone().requires_grad_(True)  # start from the (normalised) QR-head sum
    opt = torch.optim.Adam([v], lr=lr)

    def full_weights(vals):
        w = torch.zeros(L, H)
        w[free] = vals
        return w

    def loss_of(batch):
        w = full_weights(v)
        return torch.stack([group_contrastive_loss((ph * w[..., None]).sum((0, 1)), g) for ph, g in batch]).mean()

    with torch.no_grad():
        h0 = float(loss_of(hold))
    best = (h0, full_weights(v.detach()), -1)
    history = []
    for epoch in range(epochs):
        opt.zero_grad()
        loss = loss_of(train) + l2 * ((v - init[free]) ** 2).sum()
        loss.backward()
        opt.step()
        with torch.no_grad():
            if nonneg:
                v.clamp_(min=0.0)
            hl = float(loss_of(hold))
        history.append((float(loss.detach()), hl))
        if hl < best[0]:
            best = (hl, full_weights(v.detach()), epoch)
    weights = (best[1] / scale).tolist()
    full = [[0.0] * H for _ in range(len(hs.scores))]
    for l in range(L):
        full[l] = [round(x, 6) for x in weights[l]]
    info = {
        "dump": str(dump_dir), "queries_train": len(train), "queries_holdout": len(hold), "max_layer": max_layer,
        "epochs": epochs, "best_epoch": best[2], "lr": lr, "l2": l2, "support": support, "nonneg": nonneg,
        "weighted_heads": int(free.sum()), "holdout_loss": best[0], "initial_holdout_loss": h0, "loss": "group contrastive, min-max [0, 8]",
    }
    out = replace(hs, weights=tuple(tuple(r) for r in full), weights_info=info)
    out.save(headset_path)
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


def variant_scores(item: Mapping[str, Any], variant: Variant, *, headset, tokenizer) -> list[float]:
    """Scores of one dumped query under one variant (candidate order)."""
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
        from heedrank.types import ranks_from_scores

        ids = item["doc_ids"]
        r_rerank = ranks_from_scores(ids, scores)
        r_first = ranks_from_scores(ids, item["first_stage_scores"])
        scores = [1.0 / (60 + r_rerank[d]) + 1.0 / (60 + r_first[d]) for d in ids]
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
        run = {it["query_id"]: dict(zip(it["doc_ids"], variant_scores(it, v, headset=hs, tokenizer=tok))) for it in items}
        ev = evaluate_run(run, qrels, metrics)
        results[v.name] = ev.aggregate
        per_query[v.name] = ev.per_query
    base = "all/none/none"
    deltas = {}
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

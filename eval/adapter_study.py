"""Data and dev evaluation for query-adapter training (docs/RESULTS.md, "Levers": "what is trained").

Builds :class:`heedrank.reranker.query_adapter.RankingExample` lists from BEIR splits
(first-stage candidates with qrels grades) and TREC DL runs, and the dev callback that
:func:`heedrank.reranker.query_adapter.train_query_adapter` calls: nDCG@10 of the adapted
pure reranker and of its interpolation with the first stage, over a fixed dev subset.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from heedrank.fusion import fuse

from heedrank.reranker.query_adapter import RankingExample
from heedrank.types import Document, Query

if TYPE_CHECKING:
    from heedrank.reranker.cached import CachedBlockRankReranker

logger = logging.getLogger(__name__)


def examples_from(queries: Sequence[Query], candidates: Mapping[str, Sequence[Document]],
                  qrels: Mapping[str, Mapping[str, int]]) -> list[RankingExample]:
    """One example per query with candidates, grades from ``qrels`` (unjudged = 0)."""
    out = []
    for q in queries:
        docs = tuple(candidates.get(q.query_id, ()))
        if docs:
            judged = qrels.get(q.query_id, {})
            out.append(RankingExample(q.query_id, q.text, docs, tuple(int(judged.get(d.doc_id, 0)) for d in docs)))
    return out


def load_source(spec: str, *, candidates: int, max_queries: int | None, seed: int,
                retriever: str = "hybrid", index: Path | None = None) -> tuple[list[Query], dict[str, list[Document]], dict[str, list[float]], Any, Path | None]:
    """Candidates of one data source, ``DIR:SPLIT`` (BEIR; its cached index is built on first
    use) or ``DIR@RUN`` (TREC DL run with passage text, e.g.
    ``../shared/data/msmarco-trec-dl-2021-passage@BM25``). ``index``: a BEIR source's index
    (``heedrank index build``; its first stage and its document KV store) instead of the
    cached one.

    Returns:
        ``(queries, candidates, first-stage scores, qrels, index dir or None)``.
    """
    from heedrank.eval.beir import ensure_index
    from heedrank.eval.heads import beir_candidates, trec_dl_candidates

    if "@" in spec:
        data, run = spec.rsplit("@", 1)
        return (*trec_dl_candidates(data, run_name=run, candidates=candidates, queries=max_queries, seed=seed), None)
    data, _, split = spec.partition(":")
    if index is None:
        index = ensure_index(data, dense=retriever != "bm25")
    got = beir_candidates(data, split or "train", queries=max_queries, candidates=candidates, seed=seed,
                          index_dir=index, retriever=retriever)
    return (*got, index)


def source_store(reranker: CachedBlockRankReranker, index: Path | None, scratch: Path | None, name: str) -> Any:
    """The document KV store that serves a source's blocks: the index's own store when its
    header matches the reranker (read-only), else a writable scratch store
    ``scratch/<name>`` (created on first use; blocks computed once are kept), else ``None``."""
    from heedrank.errors import KVStoreMismatchError
    from heedrank.index.kv import KVHeader, KVStore

    header = KVHeader.from_dict(reranker.block_store_header())
    if index is not None and (index / "kv" / "header.json").is_file():
        try:
            return KVStore.open(index / "kv", header, readonly=True)
        except KVStoreMismatchError as exc:  # a store for another model or layout: never read it
            logger.warning("not using %s: %s", index / "kv", exc)
    if scratch is None:
        return None
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name)
    return KVStore.open_or_create(scratch / safe, header)


def dev_evaluator(
    queries: Sequence[Query], candidates: Mapping[str, Sequence[Document]], first_scores: Mapping[str, Sequence[float]],
    qrels: Mapping[str, Mapping[str, int]], *, objective: str, block_store: Any = None, alpha: float = 0.8,
    show_progress: bool = False,
) -> Callable[[CachedBlockRankReranker, Any], dict[str, float]]:
    """The dev callback of :func:`heedrank.reranker.query_adapter.train_query_adapter`.

    Returns ``{"dev": nDCG@10 x100 of the pure reranker, "dev_fused": of alpha z(first) +
    (1 - alpha) z(reranker), "dev_first": of the first stage}`` over ``queries`` (every
    query of their qrels counts; a query without candidates scores 0).
    """
    import torch
    from tqdm.auto import tqdm

    from heedrank.eval.metrics import evaluate_run
    from heedrank.reranker.query_adapter import base_instruction_kv, context_for, differentiable_scores

    ids = sorted(q.query_id for q in queries)
    sub_qrels = {q: dict(qrels.get(q, {})) for q in ids}

    def mean_ndcg(run: Mapping[str, Mapping[str, float]]) -> float:
        ev = evaluate_run(run, sub_qrels, ["nDCG@10"], query_ids=ids)
        return 100.0 * float(np.mean([v["nDCG@10"] for v in ev.per_query.values()]))

    def evaluate(reranker: CachedBlockRankReranker, weights: Any) -> dict[str, float]:
        kv0 = base_instruction_kv(reranker)
        pure: dict[str, dict[str, float]] = {}
        fused: dict[str, dict[str, float]] = {}
        first: dict[str, dict[str, float]] = {}
        for q in tqdm(queries, desc="dev", unit="query", disable=not show_progress):
            docs = list(candidates.get(q.query_id, ()))
            if not docs:
                continue
            prompt = reranker.build_prompt(q.text, docs)
            kv = context_for(reranker, prompt, kv0, store=block_store)
            with torch.no_grad():
                s = differentiable_scores(reranker, prompt, kv, objective, weights).numpy()
            f = np.asarray(first_scores[q.query_id], dtype=np.float64)
            mix = fuse(f, s, alpha)
            pure[q.query_id] = {d.doc_id: float(x) for d, x in zip(docs, s)}
            fused[q.query_id] = {d.doc_id: float(x) for d, x in zip(docs, mix)}
            first[q.query_id] = {d.doc_id: float(x) for d, x in zip(docs, f)}
        return {"dev": mean_ndcg(pure), "dev_fused": mean_ndcg(fused), "dev_first": mean_ndcg(first)}

    return evaluate

"""Choosing BlockRank's scoring layer ``l*``: nDCG@10 of BlockRank reranking read at every
layer, from one forward pass per query (docs/design/algorithms.md section 3; the paper reads layer 20
of 32). Run on a *dev* split, never on test.
"""

from __future__ import annotations

import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

from heedrank.config import PipelineConfig, RerankerConfig
from heedrank.pipeline import Pipeline, SearchOptions
from heedrank.types import Ranking, ScoredDoc
from heedrank.eval.harness import report_name, select_queries, subset_suffix
from heedrank.eval.metrics import BEIR_METRICS, evaluate_run

logger = logging.getLogger(__name__)


def layer_sweep_beir(
    data_dir: str | Path,
    *,
    split: str = "dev",
    retriever: str = "bm25",
    candidates: int = 20,
    max_queries: int | None = 100,
    seed: int = 0,
    index_dir: str | Path | None = None,
    layers: list[int] | None = None,
    out_dir: str | Path = "runs",
    reranker_config: RerankerConfig | None = None,
    show_progress: bool = True,
) -> dict[str, Any]:
    """nDCG@10 / RR@10 of BlockRank at each layer on a BEIR split.

    Args:
        data_dir: BEIR-layout dataset folder.
        split: Qrels split (use ``dev``).
        retriever: First stage whose top ``candidates`` are reranked.
        candidates: Candidates per query.
        max_queries: Seeded subset size (``None`` = all judged queries).
        seed: Subset seed.
        index_dir: Index directory (default: the evaluator's cached index).
        layers: Layers to read (default: all).
        out_dir: Where ``<name>.json`` is written.
        reranker_config: Model and ``max_doc_tokens``; method forced to ``blockrank``.

    Returns:
        ``{"layers": {layer: {metric: value}}, "best_layer": int, "first_stage": {...}, ...}``
        (also written as JSON).
    """
    from heedrank import registry
    from heedrank.data import load_beir_qrels, load_beir_queries
    from heedrank.eval.beir import ensure_index

    data_dir = Path(data_dir)
    queries = load_beir_queries(data_dir)
    qrels = load_beir_qrels(data_dir, split)
    selected, _ = select_queries(queries, qrels, max_queries, seed)
    index_dir = index_dir or ensure_index(data_dir, dense=retriever != "bm25")
    pipeline = Pipeline.from_config(PipelineConfig(index_dir=str(index_dir), max_top_k=1000, max_candidates=1000))
    first = pipeline.search_batch(selected, SearchOptions(top_k=candidates, retriever=retriever))
    config = replace(reranker_config or RerankerConfig(), method="blockrank")
    reranker = registry.build_reranker(config)
    layers = layers if layers is not None else list(range(reranker.lm.num_layers))

    runs: dict[int, dict[str, dict[str, float]]] = {l: {} for l in layers}
    iterator: Any = first
    if show_progress:
        from tqdm.auto import tqdm

        iterator = tqdm(first, desc="layer sweep", unit="query")
    for res in iterator:
        docs = [h.document for h in res.ranking.hits]
        if not docs:
            continue
        per_layer = reranker.layer_scores(res.query.text, docs, layers)
        for l, scores in per_layer.items():
            ranking = Ranking.from_hits(res.query.query_id, (ScoredDoc(d.doc_id, s) for d, s in zip(docs, scores)))
            runs[l][res.query.query_id] = ranking.to_dict()
    qids = [r.query.query_id for r in first]
    base = evaluate_run({r.query.query_id: r.ranking.to_dict() for r in first}, qrels, BEIR_METRICS, query_ids=qids)
    table = {l: evaluate_run(runs[l], qrels, BEIR_METRICS, query_ids=qids).aggregate for l in layers}
    best = max(layers, key=lambda l: (table[l]["nDCG@10"], -l))
    name = report_name(data_dir.resolve().name, split, retriever, "blockrank-layer-sweep", f"c{candidates}",
                       subset_suffix(len(selected), max_queries, seed))
    result = {
        "name": name, "split": split, "retriever": retriever, "candidates": candidates,
        "query_ids": qids, "first_stage": base.aggregate, "layers": {str(l): table[l] for l in layers},
        "best_layer": best, "default_layer": round(0.6 * reranker.lm.num_layers),
        "reranker": reranker.describe(),
    }
    out = Path(out_dir) / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2, default=str))
    logger.info("wrote %s", out)
    return result


def format_sweep(result: dict[str, Any]) -> str:
    """The sweep as a table (metrics x100)."""
    lines = [f"{'layer':>5}  {'nDCG@10':>7}  {'RR@10':>6}  {'R@100':>6}"]
    fs = result["first_stage"]
    lines.append(f"{'first':>5}  {100 * fs['nDCG@10']:7.1f}  {100 * fs['RR@10']:6.1f}  {100 * fs['R@100']:6.1f}")
    for l, m in result["layers"].items():
        mark = " <- best" if int(l) == result["best_layer"] else (" (default 0.6 L)" if int(l) == result["default_layer"] else "")
        lines.append(f"{l:>5}  {100 * m['nDCG@10']:7.1f}  {100 * m['RR@10']:6.1f}  {100 * m['R@100']:6.1f}{mark}")
    return "\n".join(lines)

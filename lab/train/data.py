"""Training data: examples for BlockRank fine-tuning and for the query adapter, the document
KV store each source's blocks are read from, and the adapter's dev callback.

* :func:`blockrank_examples`: :class:`heedrank.lab.train.blockrank.TrainingExample` lists from a
  BEIR split. NFCorpus train has many positives per query (about 43, all grade 1). Each
  example samples ONE positive (its id is the next-token target) plus hard negatives drawn
  from BM25's top ``pool`` hits that are not in the qrels at all (a judged non-relevant or an
  unjudged document high in BM25 is a hard negative; a judged relevant one is never a
  negative), then shuffles the candidates. Every relevant document among the candidates
  counts as a positive in the auxiliary loss.
* :func:`load_source`, :func:`examples_from`, :func:`source_store`: query-adapter training
  data (docs/results/training.md, "The table of tries": "what is trained"):
  :class:`heedrank.lab.train.query_adapter.RankingExample` lists from BEIR splits (first-stage
  candidates with qrels grades) and TREC DL runs.
* :func:`dev_evaluator`: the dev callback that
  :func:`heedrank.lab.train.query_adapter.train_query_adapter` calls: nDCG@10 of the adapted
  pure reranker and of its interpolation with the first stage, over a fixed dev subset.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from heedrank.errors import ValidationError
from heedrank.fusion import fuse
from heedrank.lab.train.blockrank import TrainingExample
from heedrank.lab.train.query_adapter import RankingExample
from heedrank.types import Document, Query

if TYPE_CHECKING:
    from heedrank.reranker.cached import CachedBlockRankReranker

logger = logging.getLogger(__name__)


def blockrank_examples(
    data_dir: str | Path, split: str, *, candidates: int = 16, max_queries: int | None = None, seed: int = 0,
    index_dir: str | Path | None = None, pool: int = 100,
) -> list[TrainingExample]:
    """Examples of ``candidates`` documents (1 positive + hard negatives), seeded.

    Raises:
        ValidationError: ``candidates < 2``, or no query yields an example.
    """
    from heedrank.config import PipelineConfig
    from heedrank.data import load_beir_qrels, load_beir_queries
    from heedrank.pipeline import Pipeline, SearchOptions
    from heedrank.eval.beir import ensure_index
    from heedrank.eval.harness import select_queries

    if candidates < 2:
        raise ValidationError("candidates must be >= 2 (one positive and at least one negative)")
    data_dir = Path(data_dir)
    qrels = load_beir_qrels(data_dir, split)
    qrels = {q: j for q, j in qrels.items() if any(g > 0 for g in j.values())}
    queries, _ = select_queries(load_beir_queries(data_dir), qrels, max_queries, seed)
    index_dir = index_dir or ensure_index(data_dir, dense=False)
    pipe = Pipeline.from_config(PipelineConfig(index_dir=str(index_dir), max_top_k=max(pool, 1000)))
    first = pipe.search_batch(queries, SearchOptions(top_k=pool, retriever="bm25"))
    rng = random.Random(seed)
    out: list[TrainingExample] = []
    for res in first:
        qid = res.query.query_id
        judged = qrels[qid]
        positives = sorted(d for d, g in judged.items() if g > 0)
        negatives = [h.doc_id for h in res.ranking.hits if h.doc_id not in judged]
        if len(negatives) < candidates - 1:
            continue
        target = rng.choice(positives)
        chosen = [target] + rng.sample(negatives, candidates - 1)
        rng.shuffle(chosen)
        docs = pipe.docstore.get_many(chosen)
        if len(docs) < len(chosen):
            continue
        ordered = tuple(docs[d] for d in chosen)
        out.append(TrainingExample(
            query_id=qid, query=res.query.text, documents=ordered, target=chosen.index(target),
            positives=tuple(i for i, d in enumerate(chosen) if judged.get(d, 0) > 0),
        ))
    if not out:
        raise ValidationError(f"no training example could be built from {data_dir} ({split})")
    logger.info("%d training examples from %d queries of %s/%s", len(out), len(queries), data_dir.name, split)
    return out


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
    use) or ``DIR@RUN[:SPLIT]`` (a candidate-list set's run with passage text, e.g.
    ``../shared/data/msmarco-trec-dl-2021-passage@BM25``, or dev-600's train fold
    ``../shared/data/msmarco-passage-dev-600@BM25:train``; ``SPLIT`` default ``all``,
    :func:`heedrank.lab.candidates.trec_dl_candidates`). ``index``: a BEIR source's index
    (``heedrank index build``; its first stage and its document KV store) instead of the
    cached one; ignored when it indexes another corpus (:func:`indexes_corpus`), so one
    ``--index`` can name the index of one of several BEIR sources.

    Returns:
        ``(queries, candidates, first-stage scores, qrels, index dir or None)``.
    """
    from heedrank.eval.beir import ensure_index
    from heedrank.lab.candidates import beir_candidates, trec_dl_candidates

    if "@" in spec:
        data, run = spec.rsplit("@", 1)
        run, _, fold = run.partition(":")
        return (*trec_dl_candidates(data, run_name=run, candidates=candidates, queries=max_queries, seed=seed,
                                    split=fold or "all"), None)
    data, _, split = spec.partition(":")
    if index is not None and not indexes_corpus(index, data):
        index = None  # an index of another collection (several BEIR sources): this one's cached index
    if index is None:
        index = ensure_index(data, dense=retriever != "bm25")
    got = beir_candidates(data, split or "train", queries=max_queries, candidates=candidates, seed=seed,
                          index_dir=index, retriever=retriever)
    return (*got, index)


def indexes_corpus(index: Path, data: str | Path) -> bool:
    """Whether the index folder ``index`` (``heedrank index build``) was built from the BEIR
    folder ``data``: its ``params.json`` records the corpus folder, compared resolved."""
    from heedrank.index.builder import read_params

    recorded = read_params(index).get("corpus", {}).get("path")
    if recorded is None:
        return False
    folder = Path(recorded).resolve()
    return Path(data).resolve() in (folder, folder.parent)  # built from the folder or from its corpus file


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
    """The dev callback of :func:`heedrank.lab.train.query_adapter.train_query_adapter`.

    The callback ``evaluate(reranker, weights)`` (``weights``: float64 ``((l* + 1) * heads,)``
    head weights for ``objective="learned"``, else ``None``) scores every query's candidates
    with :func:`heedrank.lab.train.query_adapter.differentiable_scores` (no gradient) and returns
    ``{"dev": nDCG@10 x100 of the pure reranker, "dev_fused": of alpha z(first) + (1 - alpha)
    z(reranker), "dev_first": of the first stage}`` over ``queries`` (every query of their
    qrels counts; a query without candidates scores 0).
    """
    import torch
    from tqdm.auto import tqdm

    from heedrank.eval.metrics import evaluate_run
    from heedrank.lab.train.query_adapter import base_instruction_kv, context_for, differentiable_scores

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

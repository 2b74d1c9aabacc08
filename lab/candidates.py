"""First-stage candidate lists for studies, dumps and training: a seeded query subset of a
BEIR split searched through the pipeline, or the top of a candidate-list set's run with passage
text (TREC DL, ``msmarco-passage-dev-600``, NovelEval).
Shared by the evaluation side (:mod:`heedrank.lab.dumps`, :mod:`heedrank.lab.head_study`) and the
training side (:mod:`heedrank.lab.train.data`).
"""

from __future__ import annotations

import random
from pathlib import Path

from heedrank.types import Document, Qrels, Query


def beir_candidates(
    data_dir: str | Path, split: str, *, queries: int | None, candidates: int, seed: int,
    index_dir: str | Path | None, retriever: str = "bm25", ensure_gold: bool = False,
) -> tuple[list[Query], dict[str, list[Document]], dict[str, list[float]], Qrels]:
    """First-stage candidates of a seeded query subset of a BEIR split.

    A query whose id is a corpus document's never gets that document as a candidate (BEIR's
    ``ignore_identical_ids``, as ``eval beir``: :class:`heedrank.eval.beir.IgnoreIdenticalIds`;
    :mod:`heedrank.lab.long_queries`). With ``ensure_gold`` (detection), a query whose candidates hold no relevant document gets
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
    if retriever in pipe.retrievers:  # a query never gets its own document (BEIR's ignore_identical_ids, as eval beir)
        from heedrank.eval.beir import IgnoreIdenticalIds

        pipe.retrievers = {**pipe.retrievers, retriever: IgnoreIdenticalIds(pipe.retrievers[retriever])}
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
        # search results are hydrated (every hit carries its document)
        cands[qid] = [h.document for h in hits if h.document is not None]
        scores[qid] = [h.score for h in hits if h.document is not None]
    return selected, cands, scores, qrels


def trec_dl_candidates(
    data_dir: str | Path, *, run_name: str | None, candidates: int, queries: int | None = None, seed: int = 0,
    split: str = "all",
) -> tuple[list[Query], dict[str, list[Document]], dict[str, list[float]], Qrels]:
    """Top ``candidates`` of a candidate-list set's first-stage run (with passage text): a TREC
    DL year, ``msmarco-passage-dev-600`` or NovelEval (:func:`heedrank.eval.sets.load_candidate_set`).

    Args:
        run_name: The run (``"BM25"``; NovelEval also ``"web"``); ``None`` = ``"BM25"``.
        split: ``"all"``, or a fold of a set with folds (``"train"``, ``"test"``; dev-600's
            :func:`heedrank.eval.sets.seeded_folds`); a set without folds takes ``"test"`` as all.
        queries, seed: A seeded subset of the split's judged queries
            (:func:`heedrank.eval.harness.select_queries`).
    """
    from heedrank.eval.harness import select_queries
    from heedrank.eval.sets import load_candidate_set

    cs = load_candidate_set(data_dir, run_name, split=split)
    selected, _ = select_queries(cs.queries, cs.qrels, queries, seed)
    cands, scores = {}, {}
    for q in selected:
        ranked = sorted(cs.run.get(q.query_id, {}).items(), key=lambda x: (-x[1], x[0]))[:candidates]
        cands[q.query_id] = [cs.docs[d] for d, _ in ranked]
        scores[q.query_id] = [s for _, s in ranked]
    return selected, cands, scores, cs.qrels

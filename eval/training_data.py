"""Training examples for BlockRank fine-tuning from a BEIR split.

NFCorpus train has many positives per query (about 43, all grade 1). Each example samples
ONE positive (its id is the next-token target) plus hard negatives drawn from BM25's top
``pool`` hits that are not in the qrels at all (a judged non-relevant or an unjudged
document high in BM25 is a hard negative; a judged relevant one is never a negative), then
shuffles the candidates. Every relevant document among the candidates counts as a positive
in the auxiliary loss.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

from heedrank.errors import ValidationError
from heedrank.reranker.train import TrainingExample

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

"""What `/rerank` should return when it has no first stage (docs/results/default.md, "`/rerank` without a first stage"): the default
reranker on lists passed in first-stage order, pure against fused with the given order.

For each query the default configuration (``--rerank default``: cached BlockRank, learned
head weights, the packaged query adapter) scores the first stage's top N once; the table
compares, by nDCG@10 over all queries (paired randomization test against the given order):
the given order, the pure reranker, fusion with the reciprocal rank of the given order (what
`/rerank` can do: it gets no scores), and fusion with the first stage's scores (what
`/search` does), both at the card's weight.

    python bench/rerank_fusion.py --data ../shared/data/beir-nfcorpus --split test --candidates 20 \\
        --index indexes/nfcorpus
    python bench/rerank_fusion.py --data ../shared/data/msmarco-trec-dl-2019-passage --trec-run BM25 --candidates 100

Scores are kept in ``--out`` (JSON, one line per query) so that an interrupted run resumes.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from heedrank.config import RerankerConfig
from heedrank.eval.compare import randomization_test
from heedrank.lab.candidates import beir_candidates, trec_dl_candidates
from heedrank.eval.metrics import evaluate_run
from heedrank.fusion import fuse, reciprocal_ranks
from heedrank.pipeline import block_store_for
from heedrank.registry import build_reranker, open_index

logger = logging.getLogger("bench.rerank_fusion")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--split", default="test")
    ap.add_argument("--trec-run", default=None, help="TREC DL run name (BM25); else BEIR BM25 from --index")
    ap.add_argument("--candidates", type=int, default=20)
    ap.add_argument("--index", default=None)
    ap.add_argument("--max-queries", type=int, default=None)
    ap.add_argument("--out", default=None)
    ap.add_argument("--torch-threads", type=int, default=1,
                    help="torch threads (1: many times faster than the default on a machine shared with other jobs)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO)
    import torch

    torch.set_num_threads(args.torch_threads)

    if args.trec_run:
        queries, cands, scores, qrels = trec_dl_candidates(args.data, run_name=args.trec_run,
                                                           candidates=args.candidates, queries=args.max_queries)
    else:
        queries, cands, scores, qrels = beir_candidates(args.data, args.split, queries=args.max_queries,
                                                        candidates=args.candidates, seed=0, index_dir=args.index)
    reranker = build_reranker(RerankerConfig(method="default"))
    alpha = float(reranker.default_fusion)
    store = None
    if args.index and not args.trec_run:
        index = open_index(args.index)
        store = block_store_for(reranker, index, create=False)
    name = Path(args.data).name + ("-" + args.trec_run if args.trec_run else "-" + args.split)
    out = Path(args.out or f"runs/rerank_fusion-{name}-c{args.candidates}.jsonl")
    out.parent.mkdir(parents=True, exist_ok=True)
    done = {}
    if out.exists():
        for line in out.read_text().splitlines():
            rec = json.loads(line)
            done[rec["query_id"]] = rec
    t0 = time.perf_counter()
    with out.open("a") as f:
        for q in tqdm(queries, desc="rerank", unit="query"):
            if q.query_id in done or not cands.get(q.query_id):
                continue
            docs = cands[q.query_id]
            rr = reranker.rerank(q, docs, block_store=store)
            by_id = {h.doc_id: h.score for h in rr.ranking.hits}
            rec = {"query_id": q.query_id, "doc_ids": [d.doc_id for d in docs],
                   "first": list(map(float, scores[q.query_id])), "reranker": [by_id[d.doc_id] for d in docs]}
            f.write(json.dumps(rec) + "\n")
            f.flush()
            done[q.query_id] = rec
    seconds = time.perf_counter() - t0

    runs: dict[str, dict[str, dict[str, float]]] = {k: {} for k in ("given order", "pure", "fused (rank)", "fused (score)")}
    for rec in done.values():
        ids, first, rr = rec["doc_ids"], np.array(rec["first"]), np.array(rec["reranker"])
        given = np.array(reciprocal_ranks(len(ids)))
        for key, values in (("given order", given), ("pure", rr), ("fused (rank)", fuse(given, rr, alpha)),
                            ("fused (score)", fuse(first, rr, alpha))):
            runs[key][rec["query_id"]] = {d: float(v) for d, v in zip(ids, values)}
    ids = sorted(q.query_id for q in queries)
    per = {k: evaluate_run(run, qrels, ["nDCG@10"], query_ids=ids).per_query for k, run in runs.items()}
    base = per["given order"]
    print(f"\n{name}, BM25 top {args.candidates}, {len(ids)} queries, default reranker (alpha {alpha:g}), "
          f"{seconds / max(1, len(queries)):.2f} s/query this run")
    print(f"| {'ordering':16} | nDCG@10 | delta | p |")
    print("|---|---|---|---|")
    for key, pq in per.items():
        mean = 100 * np.mean([pq[i]["nDCG@10"] for i in ids])
        diffs = [pq[i]["nDCG@10"] - base[i]["nDCG@10"] for i in ids]
        p = randomization_test(diffs) if key != "given order" else float("nan")
        print(f"| {key:16} | {mean:.1f} | {100 * np.mean(diffs):+.1f} | {p:.3f} |")


if __name__ == "__main__":
    main()

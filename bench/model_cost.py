"""Benchmark: what a reranker LM costs in cached BlockRank (docs/results/lost-levers.md, "Qwen2.5-Coder-0.5B-Instruct": a bigger packaged model).

For each model of ``--models`` (packaged short names or local directories), one process builds
cached BlockRank with zero-shot calibrated scoring (no weights card or adapter ships for another
model than the default) at its default ``l* = round(0.6 L)``, 128-token blocks, and measures side
by side, the models alternating for ``--rounds`` rounds:

* blocks encoded per second (``index kv build``'s computation, the first ``--docs`` NFCorpus
  documents) and the float16 bytes per block of its store (``KVHeader.entry_nbytes``);
* seconds per query to rerank 20 candidates whose blocks are cached (what ``/search`` costs
  at 20 candidates on an index with a store), median over ``--queries`` NFCorpus dev queries,
  each timed on its second call right after the first (all queries' blocks need not fit the
  RAM cache);
* with ``--ndcg``: zero-shot nDCG@10 of the pure reranker and of fusion 0.6 with the first stage
  on those queries (NFCorpus dev, BM25 top 20), against BM25.

    python bench/model_cost.py --models smollm2-135m-instruct,qwen2.5-coder-0.5b-instruct [--ndcg]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="smollm2-135m-instruct,qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--docs", type=int, default=32)
    ap.add_argument("--queries", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--torch-threads", type=int, default=2)
    ap.add_argument("--ndcg", action="store_true")
    args = ap.parse_args()
    import torch

    from heedrank.config import RerankerConfig
    from heedrank.data import load_beir_corpus
    from heedrank.lab.candidates import beir_candidates
    from heedrank.eval.metrics import evaluate_run
    from heedrank.fusion import fuse
    from heedrank.reranker.cards import packaged_card_path, read_card
    from heedrank.reranker.cached import CachedBlockRankReranker
    from heedrank.types import Document, Ranking, ScoredDoc

    torch.set_num_threads(args.torch_threads)
    data = ROOT.parent / "shared" / "data" / "beir-nfcorpus"
    corpus = load_beir_corpus(data)
    texts = [Document(r["_id"], r["text"], r.get("title") or "").content for r in corpus.select(range(args.docs))]
    queries, cands, scores, qrels = beir_candidates(data, "dev", queries=args.queries, candidates=20, seed=0,
                                                    index_dir=None, retriever="bm25")
    rerankers = {}
    for name in args.models.split(","):
        config = RerankerConfig(method="blockrank-cached", model=name, max_doc_tokens=128,
                                options={"query_adapter": None, "scoring": "calibrated"})
        rerankers[name] = CachedBlockRankReranker(config)
    enc: dict[str, list[float]] = {n: [] for n in rerankers}
    per_query: dict[str, list[float]] = {n: [] for n in rerankers}
    runs: dict[str, dict] = {n: {} for n in rerankers}
    for name, r in rerankers.items():  # warm: load the model, fill the RAM cache with the candidates' blocks
        for q in queries:
            r.rerank(q, cands[q.query_id])
    for _ in range(args.rounds):
        for name, r in rerankers.items():
            t0 = time.perf_counter()
            r.encode_block_arrays(texts)
            enc[name].append(time.perf_counter() - t0)
            for q in queries:
                r.rerank(q, cands[q.query_id])  # its blocks now in the RAM cache (all queries' may not fit)
                t0 = time.perf_counter()
                res = r.rerank(q, cands[q.query_id])
                per_query[name].append(time.perf_counter() - t0)
                runs[name][q.query_id] = res.ranking
    nbytes = {n: statistics.mean(r.block_store_header().entry_nbytes(k.shape[2])
                                 for _, k, _ in r.encode_block_arrays(texts[:4])) for n, r in rerankers.items()}
    print("\n| model | layers (l*) | KV heads x dim | blocks/s | bytes per block (float16) | s per query, 20 cached "
          "candidates (median) |" + (" nDCG@10 pure / fused 0.6 (BM25) |" if args.ndcg else ""))
    print("|---|---|---|---|---|---|" + ("---|" if args.ndcg else ""))
    for name, r in rerankers.items():
        h = r.block_store_header()
        cell = ""
        if args.ndcg:
            first = {q.query_id: Ranking.from_hits(q.query_id, (ScoredDoc(d.doc_id, s) for d, s in
                                                                 zip(cands[q.query_id], scores[q.query_id])))
                     for q in queries}
            pure = {q: {h.doc_id: h.score for h in rk.hits} for q, rk in runs[name].items()}
            alpha = read_card(packaged_card_path("smollm2-135m-instruct")).fusion_alpha  # the default's weight
            fused = {}
            for q, rk in runs[name].items():
                ids = [h.doc_id for h in first[q].hits]
                own = {h.doc_id: h.score for h in rk.hits}
                z = fuse([h.score for h in first[q].hits], [own[d] for d in ids], alpha)
                fused[q] = dict(zip(ids, (float(v) for v in z)))
            bm25 = {q: {h.doc_id: h.score for h in rk.hits} for q, rk in first.items()}
            judged = {q.query_id: qrels[q.query_id] for q in queries}
            nd = [100 * evaluate_run(run, judged, ["nDCG@10"]).aggregate["nDCG@10"] for run in (pure, fused, bm25)]
            cell = f" {nd[0]:.1f} / {nd[1]:.1f} ({nd[2]:.1f}) |"
        print(f"| {name} | {r.lm.num_layers} ({r.layer}) | {h.kv_heads} x {h.head_dim} | "
              f"{len(texts) / statistics.median(enc[name]):.2f} | {nbytes[name]:,.0f} | "
              f"{statistics.median(per_query[name]):.3f} |" + cell)


if __name__ == "__main__":
    main()

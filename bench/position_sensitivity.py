"""Benchmark: how much each reranker's ranking depends on the order its candidates come in.

For ``--queries`` judged DL19 queries (seeded subset, as the evaluation picks them) and their
BM25 top ``--candidates`` passages, each method ranks the list in first-stage order and
reversed. A copy of the top passage's text, under another id, is inserted at position 3 of
the list (the ``/rerank`` case of docs/results/zero-shot.md, "Position sensitivity": the same text twice). Prints one row per
method:

- ``tau``: Kendall tau-b between the scores the two orders give the same documents (mean
  and minimum over queries; 1.0 = the order of the input does not matter);
- ``top1 same``: queries whose top document is the same in both orders;
- ``max |ds| order``: the largest change of one document's score between the two orders;
- ``max |ds| dup``: the largest score difference between a passage and its copy (0 = identical
  texts get identical scores);
- seconds per ranking (median).

ICR is position-dependent by design (the best first-stage candidate is placed nearest the
query); BlockRank restarts every block at the same position and labels blocks by doc id,
so it should be invariant up to float error.

    python bench/position_sensitivity.py [--queries 10] [--candidates 20] [--methods icr,blockrank]
        [--max-doc-tokens 160] [--data ../shared/data/msmarco-trec-dl-2019-passage] [--threads 0]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def kendall_tau_b(x: list[float], y: list[float]) -> float:
    """Kendall tau-b of two score vectors over the same items (ties counted as in scipy)."""
    concordant = discordant = tx = ty = 0
    n = len(x)
    for i in range(n):
        for j in range(i + 1, n):
            dx, dy = x[i] - x[j], y[i] - y[j]
            if dx == 0 and dy == 0:
                continue
            if dx == 0:
                tx += 1
            elif dy == 0:
                ty += 1
            elif (dx > 0) == (dy > 0):
                concordant += 1
            else:
                discordant += 1
    denom = ((concordant + discordant + tx) * (concordant + discordant + ty)) ** 0.5
    return (concordant - discordant) / denom if denom else 1.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "msmarco-trec-dl-2019-passage"))
    ap.add_argument("--run", default="BM25", help="first-stage run of the TREC DL folder")
    ap.add_argument("--queries", type=int, default=10)
    ap.add_argument("--candidates", type=int, default=20)
    ap.add_argument("--methods", default="icr,blockrank")
    ap.add_argument("--max-doc-tokens", type=int, default=160)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    ap.add_argument("--model", default=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)

    import torch

    from heedrank.config import RerankerConfig
    from heedrank.data import load_run_json, load_trec_qrels, load_trec_topics, trec_dl_paths
    from heedrank.eval.harness import select_queries
    from heedrank.registry import build_reranker
    from heedrank.types import Document, Ranking

    if args.threads:
        torch.set_num_threads(args.threads)
    paths = trec_dl_paths(args.data, args.run)
    run, docs, run_queries = load_run_json(paths.run_json)
    queries = {**run_queries, **load_trec_topics(paths.topics)}
    qrels = load_trec_qrels(paths.qrels)
    selected, _ = select_queries({q: v for q, v in queries.items() if q in run}, qrels, args.queries, args.seed)

    lists = []
    for q in selected:
        top = Ranking.from_scores(q.query_id, run[q.query_id], k=args.candidates)
        cands = [docs[d] for d in top.doc_ids]
        copy = Document("dup-of-" + cands[0].doc_id, cands[0].text, cands[0].title)
        lists.append((q, cands[:3] + [copy] + cands[3:], copy.doc_id, cands[0].doc_id))

    rows = []
    for method in [m.strip() for m in args.methods.split(",") if m.strip()]:
        reranker = build_reranker(RerankerConfig(method=method, model=args.model, max_doc_tokens=args.max_doc_tokens))
        reranker.load()
        taus, top_same, order_gap, dup_gap, seconds = [], 0, 0.0, 0.0, []
        for q, cands, dup, orig in lists:
            results = []
            for order in (cands, cands[::-1]):
                t0 = time.perf_counter()
                results.append(reranker.rerank(q, order).ranking)
                seconds.append(time.perf_counter() - t0)
            fwd, rev = results[0].to_dict(), results[1].to_dict()
            ids = sorted(fwd)
            taus.append(kendall_tau_b([fwd[d] for d in ids], [rev[d] for d in ids]))
            top_same += results[0].doc_ids[0] == results[1].doc_ids[0]
            order_gap = max(order_gap, max(abs(fwd[d] - rev[d]) for d in ids))
            dup_gap = max(dup_gap, abs(fwd[dup] - fwd[orig]), abs(rev[dup] - rev[orig]))
        rows.append((method, statistics.mean(taus), min(taus), f"{top_same}/{len(lists)}", order_gap, dup_gap,
                     statistics.median(seconds)))

    print(f"DL19 {args.run} top-{args.candidates} (+1 duplicate text), {len(lists)} queries, "
          f"max_doc_tokens {args.max_doc_tokens}, first-stage order vs reversed")
    print("| method | tau mean | tau min | top1 same | max abs ds order | max abs ds dup | s/ranking |")
    print("|---|---|---|---|---|---|---|")
    for method, mean_tau, min_tau, same, gap, dgap, sec in rows:
        print(f"| {method} | {mean_tau:.3f} | {min_tau:.3f} | {same} | {gap:.2e} | {dgap:.2e} | {sec:.2f} |")


if __name__ == "__main__":
    main()

"""Benchmark: ICR with all heads vs the query-focused (QR) head set, same prompts.

``heads=qr`` reads only the selected heads and stops the forward pass after the deepest
selected layer (docs/design/algorithms.md section 2), so it must never be slower than all-heads ICR.
For the first ``--queries`` DL19 queries and their BM25 top ``--candidates`` passages
(``--max-doc-tokens`` each), both variants rerank the same documents, alternating, in one
process on one loaded model; prints the median latency of each, the ratio, and the layers
each one runs.

    python bench/heads_latency.py [--queries 5] [--candidates 20] [--repeats 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "msmarco-trec-dl-2019-passage"))
    ap.add_argument("--queries", type=int, default=5)
    ap.add_argument("--candidates", type=int, default=20)
    ap.add_argument("--max-doc-tokens", type=int, default=160)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--model", default=None)
    args = ap.parse_args()

    import torch

    from heedrank.config import RerankerConfig
    from heedrank.types import Document, Query
    from heedrank.reranker.icr import ICRReranker

    if args.threads:
        torch.set_num_threads(args.threads)
    with gzip.open(Path(args.data) / "retrieve_results_BM25_dl19_top100.json.gz", "rt") as fh:
        items = json.load(fh)[: args.queries]
    variants = {}
    for heads in ("all", "qr"):
        cfg = RerankerConfig(method="icr", model=args.model, max_doc_tokens=args.max_doc_tokens,
                             options={} if heads == "all" else {"heads": heads})
        variants[heads] = ICRReranker(cfg)
    for r in variants.values():
        r.load()
    times: dict[str, list[float]] = {h: [] for h in variants}
    for item in items:
        q = Query(str(item["hits"][0]["qid"]), item["query"])
        docs = [Document(str(h["docid"]), h["content"]) for h in item["hits"][: args.candidates]]
        for _ in range(args.repeats):
            for heads, r in variants.items():
                t = time.perf_counter()
                r.rerank(q, docs)
                times[heads].append(time.perf_counter() - t)
    lm = variants["all"].lm
    qr_layers = max(l for l, _ in variants["qr"].heads) + 1
    med = {h: statistics.median(v) for h, v in times.items()}
    print(f"{len(items)} DL19 queries x {args.repeats} repeats, BM25 top {args.candidates}, "
          f"max_doc_tokens {args.max_doc_tokens}, threads {torch.get_num_threads()}")
    print(f"{'heads':6} {'layers run':>10} {'median s':>9} {'mean s':>8}")
    for h in variants:
        layers = lm.num_layers if h == "all" else qr_layers
        print(f"{h:6} {layers!s:>10} {med[h]:9.2f} {statistics.mean(times[h]):8.2f}")
    print(f"QR / all latency: {med['qr'] / med['all']:.2f} (early-exit saving {100 * (1 - med['qr'] / med['all']):.0f}%)")


if __name__ == "__main__":
    main()

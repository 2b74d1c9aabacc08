"""Benchmark: passage blocks (``--opt passages=N``) against one block per document, side by side.

In one process, over an index whose document KV store holds the blocks (a first round over the
queries fills what is missing and is not counted): the service's pipeline (hybrid first stage,
the default reranker with its fusion, top 10) on NFCorpus test queries, each query searched with
every setting in turn, so that the machine's noise falls on all of them alike. Prints one markdown
table: per setting and candidate count, the p50 and p95 seconds of the whole search and of its
rerank stage, the blocks per document read, and the stored bytes per document (the store's mean
block size times blocks per document).

    PYTHONPATH=. python bench/passage_blocks.py --index indexes/nfcorpus [--passages 1,2,3] [--candidates 20]
        [--queries 30] [--torch-threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", type=Path, required=True)
    ap.add_argument("--passages", default="1,2,3")
    ap.add_argument("--candidates", default="20")
    ap.add_argument("--queries", type=int, default=30)
    ap.add_argument("--torch-threads", type=int, default=1)
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.torch_threads)
    from bench.search_latency import test_queries
    from heedrank.config import PipelineConfig, RerankerConfig
    from heedrank.pipeline import Pipeline, SearchOptions
    from heedrank.types import Query

    pipe = Pipeline.from_config(PipelineConfig(index_dir=str(args.index), reranker=RerankerConfig(method="default")))
    settings = [int(x) for x in args.passages.split(",")]
    counts = [int(x) for x in args.candidates.split(",")]
    queries = test_queries(args.queries)

    def search(i: int, text: str, n: int, c: int):
        opts = SearchOptions(top_k=10, retriever="hybrid", rerank="default", candidates=c, fusion="default",
                             rerank_options={"passages": n}, cold_budget=None)
        t0 = time.perf_counter()
        res = pipe.search(Query(f"q{i}", text), opts)
        return time.perf_counter() - t0, res

    for c in counts:  # fill: every passage block these searches read is stored before timing
        for i, text in enumerate(queries):
            for n in settings:
                search(i, text, n, c)
    total: dict[tuple[int, int], list[float]] = defaultdict(list)
    rerank: dict[tuple[int, int], list[float]] = defaultdict(list)
    blocks: dict[tuple[int, int], list[float]] = defaultdict(list)
    for c in counts:
        for i, text in enumerate(queries):
            for n in settings:
                seconds, res = search(i, text, n, c)
                total[n, c].append(seconds)
                rerank[n, c].append(res.timings["rerank"])
                read = res.rerank.details.get("passages", len(res.rerank.ranking)) if res.rerank else 0
                blocks[n, c].append(read / max(1, len(res.rerank.ranking)) if res.rerank else 0.0)
    reranker = pipe._cache().get("default")[0]
    store = pipe.index.block_store(reranker.block_store_header(), create=False)
    st = store.stats() if store is not None else None
    per_block = st.live_bytes / max(1, st.blocks) if st is not None else None  # mean over every stored block

    def p95(xs: list[float]) -> float:
        return sorted(xs)[max(0, int(round(0.95 * len(xs))) - 1)]

    print(f"\nPassage blocks: {args.index}, hybrid first stage, default reranker and fusion, {args.queries} NFCorpus "
          f"test queries, {args.torch_threads} torch thread(s), settings interleaved per query\n")
    print("| passages | candidates | search p50 s | p95 s | rerank p50 s | x one block | blocks per document | "
          "bytes per document |\n|---|---|---|---|---|---|---|---|")
    for c in counts:
        base = statistics.median(total[settings[0], c])
        for n in settings:
            med = statistics.median(total[n, c])
            b = statistics.mean(blocks[n, c])
            size = f"{per_block * b / 1e6:.2f} MB" if per_block else "-"
            print(f"| {n} | {c} | {med:.3f} | {p95(total[n, c]):.3f} | {statistics.median(rerank[n, c]):.3f} | "
                  f"{med / base:.2f} | {b:.2f} | {size} |")
    pipe.close()


if __name__ == "__main__":
    main()

"""Benchmark: where a warm ``/search`` with the default reranker spends its time.

In one process, over an index whose document KV store is filled: the pipeline of the service
(hybrid first stage, the default reranker, top 10) on NFCorpus test queries, one after
another, and for each query the seconds of every stage, read from the pipeline's and the
reranker's own timings plus timers around the steps that report none:

- ``first stage``: retrieval (BM25 + dense + fusion); ``hydrate``: the document store;
- ``prompt``: tokenising the query and the candidates into blocks;
- ``store read``: the candidates' blocks from the store (RAM LRU, or disk + crc32 + decode);
- ``assemble``: copying them into the query's context buffer;
- ``query + N/A pass``: the merged query and content-free passes over layers ``0..l*``;
- ``scoring``: features, z-scores and the weighted sum (the rest of the scorer);
- ``rerank rest``: what the reranker does around them (distinct texts, ranking);
- ``serving``: fusion, probabilities and merging (:mod:`heedrank.serving`);
- ``serialise``: the response body (:func:`heedrank.api.routes.search.to_response`) to JSON.

Prints one markdown table: per candidate count, each stage's median and its share of the
median total. The first ``--warmup`` queries are not counted.

    python bench/search_profile.py --index indexes/nfcorpus [--candidates 20,100] [--queries 30]
        [--torch-threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

STAGES = ("first stage", "hydrate", "prompt", "store read", "encode (cold)", "assemble", "query + N/A pass",
          "scoring", "rerank rest", "serving", "serialise")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", type=Path, required=True)
    ap.add_argument("--candidates", default="20,100")
    ap.add_argument("--queries", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--torch-threads", type=int, default=1)
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.torch_threads)
    from bench.search_latency import test_queries
    from heedrank.api.routes.search import to_response
    from heedrank.config import PipelineConfig, RerankerConfig
    from heedrank.pipeline import Pipeline, SearchOptions
    from heedrank.reranker.cached import scorers
    from heedrank.types import Query

    pipe = Pipeline.from_config(PipelineConfig(index_dir=str(args.index), reranker=RerankerConfig(method="default")))
    reranker = pipe._cache().get("default")[0]
    reranker.load()
    clock: dict[str, float] = defaultdict(float)

    def timed(name, fn):
        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                clock[name] += time.perf_counter() - t0
        return wrapper

    reranker.build_prompt = timed("prompt", reranker.build_prompt)
    reranker.score_prompt = timed("score_prompt", reranker.score_prompt)
    scorers.LearnedScorer.score = timed("scorer", scorers.LearnedScorer.score)

    queries = test_queries(args.queries + args.warmup)
    rows = []
    for c in [int(x) for x in args.candidates.split(",")]:
        per: dict[str, list[float]] = defaultdict(list)
        for i, text in enumerate(queries):
            clock.clear()
            t0 = time.perf_counter()
            res = pipe.search(Query(f"q{i}", text), SearchOptions(top_k=10, retriever="hybrid", rerank="default",
                                                                  candidates=c, fusion="default"))
            t1 = time.perf_counter()
            to_response(res, "default").model_dump_json()
            t2 = time.perf_counter()
            if i < args.warmup:
                continue
            rr = res.rerank
            tm = rr.details["timings"]
            stage = {
                "first stage": res.timings["retrieve"], "hydrate": res.timings["hydrate"], "prompt": clock["prompt"],
                "store read": tm.get("blocks_fetch", 0.0), "encode (cold)": tm.get("blocks_encode", 0.0),
                "assemble": tm.get("blocks_assemble", 0.0), "query + N/A pass": tm.get("query", 0.0),
            }
            stage["scoring"] = clock["scorer"] - stage["query + N/A pass"]
            context = stage["store read"] + stage["encode (cold)"] + stage["assemble"]
            stage["rerank rest"] = res.timings["rerank"] - clock["prompt"] - clock["score_prompt"]
            stage["rerank rest"] += clock["score_prompt"] - clock["scorer"] - context
            stage["serving"] = (t1 - t0) - res.timings["retrieve"] - res.timings["hydrate"] - res.timings["rerank"]
            stage["serialise"] = t2 - t1
            stage["total"] = t2 - t0
            for k, v in stage.items():
                per[k].append(v)
        total = statistics.median(per["total"])
        for name in STAGES:
            med = statistics.median(per[name])
            rows.append((c, name, med, med / total))
        rows.append((c, "total (p50)", total, 1.0))
    print(f"\n`/search` profile: {args.index}, hybrid first stage, default reranker, {args.queries} NFCorpus test "
          f"queries, {args.torch_threads} torch thread(s), one process\n")
    print("| candidates | stage | p50 s | share of total |\n|---|---|---|---|")
    for c, name, med, share in rows:
        print(f"| {c} | {name} | {med:.4f} | {share:.0%} |")
    pipe.close()


if __name__ == "__main__":
    main()

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

``--variant NAME=KEY=VALUE,KEY=VALUE`` (repeatable) profiles the default reranker with other options
(values parsed as JSON when they can be: ``layer=15``; ``index=DIR`` reads another index
and its store, e.g. one built with another ``kv_dtype``) beside the default itself (``NAME``
``default``), in the same process and over the same store unless ``index`` says otherwise, each
query run by every variant in turn (the first to run alternates, since the second finds the blocks in
the store's RAM tier) so that a noisy machine slows them alike; the table has a column per variant.

    python bench/search_profile.py --index indexes/nfcorpus [--candidates 20,100] [--queries 30]
        [--torch-threads 1] [--variant other=scorer_weights=CARD,query_adapter=DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

STAGES = ("first stage", "hydrate", "prompt", "store read", "encode (cold)", "assemble", "query + N/A pass",
          "scoring", "rerank rest", "serving", "serialise")


def _value(text: str) -> Any:
    """A variant option's value: JSON when it parses (``null``, numbers), else the text."""
    import json

    try:
        return json.loads(text)
    except ValueError:
        return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", type=Path, required=True)
    ap.add_argument("--candidates", default="20,100")
    ap.add_argument("--queries", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--torch-threads", type=int, default=1)
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=KEY=VALUE,...")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.torch_threads)
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # `python bench/search_profile.py` too
    from bench.search_latency import test_queries
    from heedrank.api.routes.search import to_response
    from heedrank.config import PipelineConfig, RerankerConfig
    from heedrank.pipeline import Pipeline, SearchOptions
    from heedrank.types import Query

    variants: dict[str, dict[str, Any]] = {"default": {}}
    indexes = {"default": str(args.index)}
    for spec in args.variant:
        name, _, opts = spec.partition("=")
        variants[name] = {k: _value(v) for k, v in (kv.split("=", 1) for kv in opts.split(",") if kv)}
        indexes[name] = str(variants[name].pop("index", args.index))
    pipes = {ix: Pipeline.from_config(PipelineConfig(index_dir=ix, reranker=RerankerConfig(method="default")))
             for ix in sorted(set(indexes.values()))}
    clocks = {}
    for name, opts in variants.items():
        reranker = pipes[indexes[name]]._cache().get("default", opts or None)[0]
        reranker.load()
        clock: dict[str, float] = defaultdict(float)
        for attr in ("build_prompt", "score_documents"):
            setattr(reranker, attr, timed(clock, "prompt" if attr == "build_prompt" else attr, getattr(reranker, attr)))
        cls = reranker.loaded().scorer.__class__
        cls.score = timed_scorer(cls.score)
        clocks[name] = clock

    queries = test_queries(args.queries + args.warmup)
    med: dict[tuple[int, str, str], float] = {}
    counts = [int(x) for x in args.candidates.split(",")]
    for c in counts:
        per: dict[str, dict[str, list[float]]] = {name: defaultdict(list) for name in variants}
        for i, text in enumerate(queries):
            order = list(variants.items())
            for name, opts in order if i % 2 == 0 else order[::-1]:  # who reads the store first alternates
                clock = clocks[name]
                clock.clear()
                CURRENT[0] = clock
                t0 = time.perf_counter()
                res = pipes[indexes[name]].search(Query(f"q{i}", text), SearchOptions(top_k=10, retriever="hybrid", rerank="default",
                                                                      rerank_options=opts or None, candidates=c,
                                                                      fusion="default"))
                t1 = time.perf_counter()
                to_response(res, "default").model_dump_json()
                t2 = time.perf_counter()
                if i < args.warmup:
                    continue
                for k, v in stages(res, clock, t0, t1, t2).items():
                    per[name][k].append(v)
        for name in variants:
            for stage in (*STAGES, "total"):
                med[(c, name, stage)] = statistics.median(per[name][stage])
    print(f"\n`/search` profile: {args.index}, hybrid first stage, default reranker, {args.queries} NFCorpus test "
          f"queries, {args.torch_threads} torch thread(s), one process, median seconds (share of the total)\n")
    names = list(variants)
    print("| candidates | stage | " + " | ".join(names) + " |\n|---|---|" + "---|" * len(names))
    for c in counts:
        for stage in (*STAGES, "total"):
            cells = [f"{med[(c, n, stage)]:.4f} ({med[(c, n, stage)] / med[(c, n, 'total')]:.0%})" for n in names]
            print(f"| {c} | {'total (p50)' if stage == 'total' else stage} | " + " | ".join(cells) + " |")
    for name, opts in variants.items():
        if opts:
            print(f"\n{name}: {opts}" + (f" over {indexes[name]}" if indexes[name] != str(args.index) else ""))
    for pipe in pipes.values():
        pipe.close()


CURRENT: list[dict[str, float]] = [{}]
"""The clock of the variant running now (the scorer's timer is shared by the scorer class)."""


def timed(clock: dict[str, float], name: str, fn):
    def wrapper(*a, **kw):
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            clock[name] += time.perf_counter() - t0
    return wrapper


def timed_scorer(fn):
    if getattr(fn, "_timed", False):
        return fn

    def wrapper(*a, **kw):
        t0 = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            CURRENT[0]["scorer"] += time.perf_counter() - t0
    wrapper._timed = True  # type: ignore[attr-defined]
    return wrapper


def stages(res, clock: dict[str, float], t0: float, t1: float, t2: float) -> dict[str, float]:
    """Seconds per stage of one search (module docstring)."""
    tm = res.rerank.details["timings"]
    stage = {
        "first stage": res.timings["retrieve"], "hydrate": res.timings["hydrate"], "prompt": clock["prompt"],
        "store read": tm.get("blocks_fetch", 0.0), "encode (cold)": tm.get("blocks_encode", 0.0),
        "assemble": tm.get("blocks_assemble", 0.0), "query + N/A pass": tm.get("query", 0.0),
    }
    stage["scoring"] = clock["scorer"] - stage["query + N/A pass"]
    context = stage["store read"] + stage["encode (cold)"] + stage["assemble"]
    stage["rerank rest"] = res.timings["rerank"] - clock["prompt"] - clock["score_documents"]
    stage["rerank rest"] += clock["score_documents"] - clock["scorer"] - context
    stage["serving"] = (t1 - t0) - res.timings["retrieve"] - res.timings["hydrate"] - res.timings["rerank"]
    stage["serialise"] = t2 - t1
    stage["total"] = t2 - t0
    return stage


if __name__ == "__main__":
    main()

"""Benchmark: single-client ``POST /search`` latency with reranking, per reranker setting.

Starts the service (``uvicorn --factory heedrank.api.app:create_app``) over an index once
per setting, waits for ``/health`` to say ``ok``, then sends NFCorpus test queries one
after another (one client, no concurrency): hybrid first stage, ``--candidates`` reranked
(each value of the list), top 10. Prints one markdown table: p50 / p95 / mean latency
seen by the client (seconds), the server's rerank stage p50, and the block cache's hits
and misses (cached BlockRank). The first ``--warmup`` queries of a setting are not timed.

    python bench/search_latency.py --index INDEX [--candidates 20,100] [--queries 30]
        [--settings cached-calibrated,cached-signal,cached-learned,icr] [--torch-threads 1]
        [--code NAME=DIR ...] [--rounds 1]

``--rerank-documents N`` also times ``POST /rerank`` (Cohere's shape, no options) per query and setting:
the query with N short documents (NFCorpus abstracts cut to 300 characters, a different seeded set per
query, so no text is seen twice), one client; its rows say ``/rerank`` in the candidates column.

``--code NAME=DIR`` (repeatable) runs each server on another version of the code, side by side
with this checkout (``NAME=.``): ``DIR`` is made by ``bash bench/other_revision.sh REV DIR`` (a git
worktree of ``REV`` and ``DIR/.venv``, where it is installed; its server runs on that interpreter). Rounds interleave the
versions, so a noisy machine slows them alike; the table has one row per version, setting and
candidate count, over every round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SETTINGS = {
    "default": ("default", {}),  # the default configuration (docs/results/default.md): the full store of 0..l*
    "cached-calibrated": ("blockrank-cached", {"layer": 15, "scoring": "calibrated", "query_adapter": None}),
    "cached-signal": ("blockrank-cached", {"layer": 15, "scoring": "signal", "query_adapter": None}),
    "cached-learned": ("blockrank-cached", {"layer": 15, "scoring": "learned", "query_adapter": None}),
    "icr": ("icr", {}),
    "blockrank": ("blockrank", {}),
}


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def test_queries(n: int) -> list[str]:
    from heedrank.data import load_beir_qrels, load_beir_queries

    data = ROOT.parent / "shared" / "data" / "beir-nfcorpus"
    qrels = load_beir_qrels(data, "test")
    queries = load_beir_queries(data)  # {query_id: text}
    qs = [getattr(queries[q], "text", queries[q]) for q in sorted(qrels) if q in queries]
    return qs[:n]


def short_documents(n: int) -> list[str]:
    """``n`` NFCorpus abstracts cut to 300 characters, in a seeded order (``/rerank``'s documents)."""
    import random

    from heedrank.data import iter_beir_documents

    docs = [d.content[:300] for d in iter_beir_documents(ROOT.parent / "shared" / "data" / "beir-nfcorpus")]
    random.Random(0).shuffle(docs)
    return [docs[i % len(docs)] for i in range(n)]


def run_setting(name: str, args, queries: list[str], code: str = ".", root: str = ".") -> list[dict]:
    import httpx

    method, options = SETTINGS[name]
    python = sys.executable if root == "." else str(Path(root).resolve() / ".venv" / "bin" / "python")
    env = {**os.environ,
           "HEEDRANK_INDEX": str(Path(args.index).resolve()), "HEEDRANK_RERANK_METHOD": method,
           "HEEDRANK_RERANK_OPTIONS": json.dumps(options), "HEEDRANK_MAX_DOC_TOKENS": str(args.max_doc_tokens),
           "HEEDRANK_TORCH_THREADS": str(args.torch_threads), "HEEDRANK_MAX_CANDIDATES": "1000",
           "HEEDRANK_QUEUE_SIZE": "4"}
    log = open(Path(args.log_dir) / f"server-{code}-{name}.log", "w")
    server = subprocess.Popen(
        [python, "-m", "uvicorn", "--factory", "heedrank.api.app:create_app", "--host", "127.0.0.1",
         "--port", str(args.port), "--log-level", "warning", "--no-access-log"],
        cwd=ROOT if root == "." else Path(root).resolve(),  # never this checkout's heedrank/ for another version
        env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{args.port}"
    rows = []
    try:
        t0 = time.perf_counter()
        while True:
            try:
                if httpx.get(base + "/health", timeout=2).json().get("status") == "ok":
                    break
            except (httpx.HTTPError, ValueError):
                pass
            if server.poll() is not None or time.perf_counter() - t0 > 300:
                raise SystemExit(f"server for {name} did not become healthy; see {log.name}")
            time.sleep(0.2)
        with httpx.Client(base_url=base, timeout=600) as client:
            for n in [int(x) for x in args.candidates.split(",")]:
                lat, stage, hits, misses = [], [], 0, 0
                for i, q in enumerate(queries[: args.warmup] + queries):
                    body = {"query": q, "top_k": 10, "retriever": "hybrid", "rerank": {"method": method,
                                                                                      "candidates": n}}
                    t = time.perf_counter()
                    r = client.post("/search", json=body)
                    dt = time.perf_counter() - t
                    if r.status_code != 200:
                        raise SystemExit(f"{name} N={n}: HTTP {r.status_code}: {r.text[:300]}")
                    if i < args.warmup:
                        continue
                    out = r.json()
                    lat.append(dt)
                    stage.append(out["timings"]["rerank"])
                    cache = (out.get("rerank") or {}).get("cache") or {}
                    hits += cache.get("hits", 0)
                    misses += cache.get("misses", 0)
                rows.append({"code": code, "setting": name, "candidates": n, "queries": len(lat), "p50": pct(lat, 0.5),
                             "p95": pct(lat, 0.95), "mean": statistics.mean(lat), "rerank_p50": pct(stage, 0.5),
                             "hits": hits, "misses": misses})
                print(json.dumps(rows[-1]), flush=True)
                rows[-1].update(_lat=lat, _stage=stage)
            if args.rerank_documents:
                lat, stage = [], []
                docs = short_documents(len(queries) * args.rerank_documents)
                for i, q in enumerate(queries):
                    body = {"query": q, "documents": docs[i * args.rerank_documents:(i + 1) * args.rerank_documents]}
                    t = time.perf_counter()
                    r = client.post("/rerank", json=body)
                    dt = time.perf_counter() - t
                    if r.status_code != 200:
                        raise SystemExit(f"{name} /rerank: HTTP {r.status_code}: {r.text[:300]}")
                    if i >= args.warmup:
                        lat.append(dt)
                        stage.append(dt)
                rows.append({"code": code, "setting": name, "candidates": f"/rerank {args.rerank_documents}",
                             "queries": len(lat), "p50": pct(lat, 0.5), "p95": pct(lat, 0.95),
                             "mean": statistics.mean(lat), "rerank_p50": pct(stage, 0.5), "hits": 0, "misses": 0})
                print(json.dumps(rows[-1]), flush=True)
                rows[-1].update(_lat=lat, _stage=stage)
    finally:
        server.terminate()
        server.wait(timeout=30)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", type=Path, required=True)
    ap.add_argument("--candidates", default="20,100")
    ap.add_argument("--queries", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--settings", default="cached-calibrated,cached-signal")
    ap.add_argument("--max-doc-tokens", type=int, default=128)
    ap.add_argument("--torch-threads", type=int, default=1)
    ap.add_argument("--port", type=int, default=8771)
    ap.add_argument("--rerank-documents", type=int, default=0,
                    help="also time POST /rerank with this many short documents per query (0: not)")
    ap.add_argument("--log-dir", default="/tmp")
    ap.add_argument("--code", action="append", default=[], metavar="NAME=DIR",
                    help="another version of the code to run side by side (see the module docstring); "
                         "this checkout is always run, as 'this'")
    ap.add_argument("--rounds", type=int, default=1, help="rounds over every version, interleaved")
    args = ap.parse_args()
    queries = test_queries(args.queries + args.warmup)
    codes = [("this", "."), *(tuple(c.split("=", 1)) for c in args.code)]
    raw = [row for _ in range(args.rounds) for code, root in codes for name in args.settings.split(",")
           for row in run_setting(name, args, queries, code, root)]
    merged: dict[tuple, dict] = {}
    for r in raw:  # the rounds of one (version, setting, candidates) pooled: percentiles over every query
        key = (r["code"], r["setting"], r["candidates"])
        merged.setdefault(key, {"lat": [], "stage": [], "hits": 0, "misses": 0})
        m = merged[key]
        m["lat"] += r.pop("_lat")
        m["stage"] += r.pop("_stage")
        m["hits"] += r["hits"]
        m["misses"] += r["misses"]
    print("\n| code | setting | candidates | queries | p50 s | p95 s | mean s | rerank p50 s | block hits / misses |")
    print("|---|---|---|---|---|---|---|---|---|")
    for (code, name, n), m in merged.items():
        print(f"| {code} | {name} | {n} | {len(m['lat'])} | {pct(m['lat'], 0.5):.3f} | {pct(m['lat'], 0.95):.3f} | "
              f"{statistics.mean(m['lat']):.3f} | {pct(m['stage'], 0.5):.3f} | {m['hits']} / {m['misses']} |")


if __name__ == "__main__":
    main()

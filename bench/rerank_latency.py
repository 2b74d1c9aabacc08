"""Benchmark: full-attention ICR vs BlockRank vs cached BlockRank latency and memory as the
candidate count grows.

``cached`` is cached BlockRank (``blockrank-cached``) whose candidate blocks are already
in a document KV store (float16, :mod:`heedrank.index.kv`, the store's RAM LRU large
enough to hold them, the reranker's own RAM cache off): per query only the query block runs
against the stored keys/values. Filling the store is not timed (that is index time, see
``heedrank index kv build``).

For N in 10, 20, 50, 100, 200, 500 candidates (real DL19 passages pooled from the first-stage
runs, cut to 128 LM tokens), both paths run on the same model, query and documents. Each
measurement runs in a fresh subprocess (so its peak RSS is its own) with a timeout. Prints
one table: median latency (s), peak RSS (GB), tokens/s, achieved GFLOP/s (estimated FLOPs of
the layers that ran / latency), the ICR/BlockRank latency ratio, and the machine's float32
matmul GFLOP/s measured in the same run.

``--scoring`` picks the BlockRank scorer of the ``blockrank`` and ``cached`` paths
(``signal``, the default; ``calibrated`` and ``learned`` run the query block and the ``N/A``
calibration block, merged into one pass on the fast path, and read every layer up to
``l*``; ``learned`` needs ``--layer 15`` and the shipped weights card's 128-token budget).
The JSON rows also carry the last run's stage timings (seconds).

    python bench/rerank_latency.py [--data ../shared/data/msmarco-trec-dl-2019-passage]
        [--ns 10,20,50,100,200,500,1000] [--paths cached] [--scoring signal] [--layer L]
        [--timeout 900] [--model DIR] [--device cpu] [--threads 0]
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def pooled_passages(data: Path, n: int) -> tuple[str, list[tuple[str, str]]]:
    """First DL19 query and ``n`` distinct passages pooled across the runs' top-100 lists."""
    seen: dict[str, str] = {}
    query = None
    for f in sorted(data.glob("retrieve_results_*_dl19_top100.json.gz")):
        with gzip.open(f, "rt") as fh:
            items = json.load(fh)
        query = query or items[0]["query"]
        for item in items:
            for h in item["hits"]:
                seen.setdefault(str(h["docid"]), h["content"])
        if len(seen) >= n:
            break
    docs = sorted(seen.items())[:n]
    if len(docs) < n:
        raise SystemExit(f"only {len(docs)} passages available")
    return query, docs


def matmul_gflops(size: int = 2048, repeats: int = 5) -> float:
    import torch

    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.matmul(a, b)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        torch.matmul(a, b)
        times.append(time.perf_counter() - t)
    return 2 * size**3 / statistics.median(times) / 1e9


def layer_flops(cfg, tokens: int, pairs: int) -> float:
    """FLOPs of one decoder layer: linear maps for ``tokens`` tokens + attention over ``pairs`` (query, key) pairs."""
    d, inter = cfg.hidden_size, cfg.intermediate_size
    hd = getattr(cfg, "head_dim", None) or d // cfg.num_attention_heads
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    linear = 2 * tokens * (d * q + 2 * d * kv + q * d + 3 * d * inter)
    attention = 4 * pairs * q  # QK^T and AV
    return float(linear + attention)


def worker(args) -> None:
    import resource

    import torch

    from heedrank.config import RerankerConfig
    from heedrank.types import Document
    from heedrank.reranker.blockrank import BlockRankReranker
    from heedrank.reranker.icr import ICRReranker

    torch.set_num_threads(args.threads) if args.threads else None
    query, pairs = pooled_passages(Path(args.data), args.n)
    docs = [Document(i, t) for i, t in pairs]
    br_options = {"scoring": args.scoring} | ({"layer": args.layer} if args.layer is not None else {})
    cfg = RerankerConfig(method=args.path, model=args.model, max_doc_tokens=128, device=args.device,
                         options=br_options if args.path == "blockrank" else {})
    if args.path == "cached":
        import os
        import tempfile

        from heedrank.index.kv import KVStore
        from heedrank.types import Query

        os.environ["HEEDRANK_BLOCK_CACHE_BYTES"] = "0"
        # cached BlockRank scoring as BlockRank does (--scoring), no card or adapter, unless
        # --cached-options names its options (e.g. the default: {})
        cfg = RerankerConfig(method="blockrank-cached", model=args.model, max_doc_tokens=128, device=args.device,
                             options={"query_adapter": None, **br_options})
        if args.cached_options is not None:
            cfg = RerankerConfig(method="blockrank-cached", model=args.model, device=args.device,
                                 options=json.loads(args.cached_options))
    if args.path == "cached":
        from heedrank.reranker.cached import CachedBlockRankReranker

        r = CachedBlockRankReranker(cfg)
    else:
        r = (ICRReranker if args.path == "icr" else BlockRankReranker)(cfg)
    lm = r.load().lm
    rss_loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    mc = lm.model.config
    last_timings: dict[str, float] = {}

    if args.path == "icr":
        prompt = r.build_prompt(query, docs, check_context=False)
        T, Lq = len(prompt.context_ids), len(prompt.query_ids) + len(prompt.calib_ids)
        tokens = T + Lq
        positions = T + max(len(prompt.query_ids), len(prompt.calib_ids))
        pairs_ = T * (T + 1) // 2 + sum(n * T + n * (n + 1) // 2 for n in (len(prompt.query_ids), len(prompt.calib_ids)))
        flops = lm.num_layers * layer_flops(mc, tokens, pairs_)

        def run():
            with torch.inference_mode():
                r.token_attention(prompt)
    elif args.path == "cached":
        prompt = r.build_prompt(query, docs)
        L0, lens, Lq = len(prompt.instruction_ids), prompt.doc_lengths, len(prompt.query_ids)
        if args.scoring != "signal":  # the query and N/A blocks share one pass (common prefix once)
            from heedrank.reranker.blockforward import MergedRows

            Lq = len(MergedRows.of([prompt.query_ids, prompt.calib_ids]).ids)
        tokens = Lq
        positions = prompt.query_offset + Lq
        pairs_ = Lq * (L0 + sum(lens)) + Lq * (Lq + 1) // 2
        flops = (r.layer + 1) * layer_flops(mc, tokens, pairs_)
        store = KVStore.create(Path(tempfile.mkdtemp()) / "kv", r.block_store_header(),
                              cache_bytes=16 << 30, out_dtype="float16")  # as Index.block_store opens it
        fill = r.rerank(Query("q", query), docs, block_store=store)  # index time: not timed
        assert fill.cache["misses"] == len(docs)

        def run():
            out = r.rerank(Query("q", query), docs, block_store=store)
            assert out.cache["hits"] == len(docs)
            last_timings.update(out.details["timings"])
    else:
        prompt = r.build_prompt(query, docs)
        L0, lens, Lq = len(prompt.instruction_ids), prompt.doc_lengths, len(prompt.query_ids)
        tokens = L0 + sum(lens) + Lq
        positions = prompt.query_offset + Lq
        pairs_ = L0 * (L0 + 1) // 2 + sum(n * L0 + n * (n + 1) // 2 for n in lens) + Lq * (L0 + sum(lens)) + Lq * (Lq + 1) // 2
        flops = (r.layer + 1) * layer_flops(mc, tokens, pairs_)

        def run():
            last_timings.update(r.scores(prompt)[1])
    times = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(json.dumps({
        "path": args.path, "n": args.n, "times": times, "median": statistics.median(times), "tokens": tokens,
        "max_position": positions, "trained_positions": lm.max_positions, "flops": flops,
        "peak_rss_gb": peak, "loaded_rss_gb": rss_loaded, "scoring": args.scoring,
        "timings": {k: round(v, 4) for k, v in last_timings.items()},
    }))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "msmarco-trec-dl-2019-passage"))
    ap.add_argument("--ns", default="10,20,50,100,200,500")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per measurement subprocess")
    ap.add_argument("--cheap-seconds", type=float, default=60.0,
                    help="a path whose first run took less than this gets a median of 3")
    ap.add_argument("--model", default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--scoring", default="signal", choices=["signal", "calibrated", "learned"],
                    help="BlockRank scorer of the blockrank and cached paths")
    ap.add_argument("--layer", type=int, default=None, help="BlockRank scoring layer l* (default: the model's)")
    ap.add_argument("--out", default=None, help="also write the rows as JSON here")
    ap.add_argument("--cached-options", default=None,
                    help="JSON options of method blockrank-cached for the cached path (e.g. '{}': the default "
                         "configuration; '{\"kv_dtype\": \"int8\"}': an int8 store); default: the old spelling above")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--path", choices=["icr", "blockrank", "cached"], help=argparse.SUPPRESS)
    ap.add_argument("--paths", default="icr,blockrank,cached", help="paths to measure, comma-separated")
    ap.add_argument("--n", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--repeats", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return

    gf = matmul_gflops()
    print(f"machine float32 matmul (2048^3): {gf:.1f} GFLOP/s", flush=True)
    rows: dict[tuple[str, int], dict] = {}
    skip: set[str] = set()
    for n in [int(x) for x in args.ns.split(",")]:
        for path in args.paths.split(","):
            if path in skip:
                rows[(path, n)] = {"status": "not run: a smaller N already hit the limit"}
                continue
            base = [sys.executable, __file__, "--worker", "--path", path, "--n", str(n), "--data", args.data,
                    "--device", args.device, "--threads", str(args.threads), "--scoring", args.scoring] \
                + (["--model", args.model] if args.model else []) \
                + (["--layer", str(args.layer)] if args.layer is not None else []) \
                + (["--cached-options", args.cached_options] if args.cached_options is not None else [])

            def measure(repeats: int):
                try:
                    p = subprocess.run(base + ["--repeats", str(repeats)], capture_output=True, text=True,
                                       timeout=args.timeout * repeats)
                except subprocess.TimeoutExpired:
                    return {"status": f"timeout > {args.timeout * repeats:.0f} s"}
                if p.returncode != 0:
                    tail = (p.stderr.strip().splitlines() or ["?"])[-1]
                    return {"status": f"failed (rc {p.returncode}: {tail[:80]})"}
                return json.loads(p.stdout.strip().splitlines()[-1])

            row = measure(1)
            if "median" in row and row["median"] < args.cheap_seconds:
                row = measure(3)
            if "median" not in row:
                skip.add(path)
            rows[(path, n)] = row
            print(f"  {path:9s} N={n:<4d} {row.get('median', row.get('status'))}", flush=True)

    header = (f"{'N':>4} {'path':9} {'tokens':>7} {'median s':>9} {'runs':>4} {'peak GB':>8} {'tok/s':>8} "
              f"{'GFLOP/s':>8} {'ICR/BR':>7} {'ICR/C':>7} {'BR/C':>7}  note")
    lines = ["", f"float32 matmul: {gf:.1f} GFLOP/s (2048^3, same run)", header, "-" * len(header)]
    for n in [int(x) for x in args.ns.split(",")]:
        br = rows.get(("blockrank", n), {})
        cr = rows.get(("cached", n), {})
        for path in args.paths.split(","):
            r = rows[(path, n)]
            if "median" not in r:
                lines.append(f"{n:>4} {path:9} {'':>7} {'':>9} {'':>4} {'':>8} {'':>8} {'':>8} {'':>7} {'':>7} {'':>7}  "
                             f"{r['status']}")
                continue
            note = "past trained context (%d > %d positions)" % (r["max_position"], r["trained_positions"]) \
                if r["max_position"] > r["trained_positions"] else ""
            ratio = f"{r['median'] / br['median']:.2f}x" if path == "icr" and "median" in br else ""
            to_cached = f"{r['median'] / cr['median']:.1f}x" if path != "cached" and "median" in cr else ""
            lines.append(
                f"{n:>4} {path:9} {r['tokens']:>7} {r['median']:>9.3f} {len(r['times']):>4} {r['peak_rss_gb']:>8.2f} "
                f"{r['tokens'] / r['median']:>8.0f} {r['flops'] / r['median'] / 1e9:>8.1f} {ratio:>7} "
                f"{to_cached if path == 'icr' else '':>7} {to_cached if path == 'blockrank' else '':>7}  {note}"
            )
    for big in (500, 1000):
        if "median" in rows.get(("cached", 100), {}) and "median" in rows.get(("cached", big), {}):
            lines.append(f"cached BlockRank latency N={big} / N=100: "
                         f"{rows[('cached', big)]['median'] / rows[('cached', 100)]['median']:.2f}x")
    if ("blockrank", 100) in rows and ("blockrank", 500) in rows and "median" in rows[("blockrank", 500)]:
        growth = rows[("blockrank", 500)]["median"] / rows[("blockrank", 100)]["median"]
        lines.append(f"BlockRank latency N=500 / N=100: {growth:.2f}x")
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text(json.dumps({f"{p}:{n}": r for (p, n), r in rows.items()} | {"matmul_gflops": gf}, indent=2))


if __name__ == "__main__":
    main()

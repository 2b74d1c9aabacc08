"""Benchmark: how long a new user waits for a reranked search, and how long searches take while
the document KV store fills in the background.

Clones this repository's HEAD into a fresh folder, runs ``scripts/demo.sh`` there (with an empty
model cache, so the LM conversion counts), and from its start sends one NFCorpus test query after
another to ``/search`` (the demo's defaults: hybrid first stage, the default reranker) as soon as
``/health`` says ok, every ``--every`` seconds, until ``--minutes`` have passed. Prints the time
of the first answered search and a markdown table per minute: searches, p50 / max latency seen by
the client, candidates reranked and skipped as cold, and the blocks stored.

    python bench/demo_first_search.py [--dir /tmp/heedrank-fresh] [--minutes 12] [--every 3]
        [--data ../shared/data] [--port 8790]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/heedrank-fresh"))
    ap.add_argument("--minutes", type=float, default=12.0)
    ap.add_argument("--every", type=float, default=3.0)
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--port", type=int, default=8790)
    args = ap.parse_args()
    import httpx

    sys.path.insert(0, str(ROOT))
    from bench.search_latency import test_queries

    queries = test_queries(400)
    shutil.rmtree(args.dir, ignore_errors=True)
    subprocess.run(["git", "clone", "-q", str(ROOT), str(args.dir)], check=True)
    cache = args.dir / ".model-cache"
    env = {**os.environ, "HEEDRANK_DATA": str(args.data.resolve()), "PORT": str(args.port),
           "HEEDRANK_CACHE_DIR": str(cache)}
    log = open(args.dir / "demo.log", "w")
    t0 = time.monotonic()
    proc = subprocess.Popen(["bash", "scripts/demo.sh"], cwd=args.dir, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    base = f"http://127.0.0.1:{args.port}"
    rows: list[dict] = []
    first = None
    try:
        while time.monotonic() - t0 < args.minutes * 60:
            if proc.poll() is not None:
                raise SystemExit(f"demo.sh exited with {proc.returncode}; see {args.dir / 'demo.log'}")
            try:
                ok = httpx.get(f"{base}/health", timeout=2, trust_env=False).status_code == 200
            except httpx.HTTPError:
                ok = False
            if not ok:
                time.sleep(1)
                continue
            q = queries[len(rows) % len(queries)]
            s = time.monotonic()
            r = httpx.post(f"{base}/search", json={"query": q, "top_k": 10}, timeout=60, trust_env=False)
            seconds = time.monotonic() - s
            body = r.json()
            info = body.get("rerank") or {}
            row = {"at": s - t0, "seconds": seconds, "status": r.status_code, "reranked": info.get("reranked"),
                   "skipped": info.get("skipped_cold"), "method": info.get("method")}
            rows.append(row)
            if first is None and r.status_code == 200 and info:
                first = row
                print(f"first reranked search answered {row['at'] + seconds:.0f} s after the start "
                      f"({seconds:.2f} s; {row['reranked']} reranked, {row['skipped']} skipped as cold)", flush=True)
            time.sleep(max(0.0, args.every - seconds))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    print("\n| minute | searches | p50 s | max s | reranked (mean of 20) | skipped as cold (mean) |")
    print("|---|---|---|---|---|---|")
    by_minute: dict[int, list[dict]] = {}
    for row in rows:
        by_minute.setdefault(int(row["at"] // 60), []).append(row)
    for minute, rs in sorted(by_minute.items()):
        lat = [r["seconds"] for r in rs]
        rer = [r["reranked"] or 0 for r in rs]
        sk = [r["skipped"] or 0 for r in rs]
        print(f"| {minute} | {len(rs)} | {statistics.median(lat):.2f} | {max(lat):.2f} | {statistics.fmean(rer):.1f} "
              f"| {statistics.fmean(sk):.1f} |")
    (args.dir / "searches.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

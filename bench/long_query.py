"""A pasted page as a query, against the real service: its time next to a short query's, an
ordinary search sent while it runs, ``GET /info`` while the document KV store fills, and what
the server's log says (fill progress lines, no progress bars).

It starts ``heedrank serve`` (the default reranker: cached BlockRank on SmolLM2) over ``--index``,
or over a BM25-only index of the first ``--docs`` NFCorpus documents that it builds once under
the cache folder (``$HEEDRANK_CACHE_DIR`` or ``~/.cache/heedrank``, ``bench/``), waits for the
store to fill (timing ``/info`` meanwhile), then times ``/search`` (reranked by default, 20
candidates) with a ~10-token query, with a 4,000-character query, and with the short query sent
0.2 s after the long one. Prints a table.

Targets: the long query answers within 2x the short one (its query block is cut to the
query budget, ``max_query_tokens``), the concurrent short one within 2 s, ``/info`` in well under
a second while the store fills. Measured on 2 shared cores, 300 documents: 0.32 s / 0.47 s (1.5x)
/ 0.61 s, ``/info`` median 0.06 s (max 0.48 s) while filling; at a 128-token budget the long
query took 3x the short one.

    .venv/bin/python bench/long_query.py                       # 300 NFCorpus documents
    .venv/bin/python bench/long_query.py --index indexes/nfcorpus
    .venv/bin/python bench/long_query.py --max-query-tokens 2048   # the old budget, to compare
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("HEEDRANK_SHARED_DATA", ROOT.parent / "shared" / "data"))
SHORT = "vitamin D and bone fractures in the elderly"  # 10 LM tokens
LONG = ("Vitamin D supplementation and the risk of fractures in older adults: a systematic review of randomised "
        "trials and cohort studies, with calcium, bone mineral density, falls and mortality as outcomes. ") * 30
LONG = LONG[:4000]


def build_subset(n: int) -> Path:
    """A BM25-only index of the first ``n`` NFCorpus documents (built once, then reused)."""
    from heedrank.files import cache_dir

    out = cache_dir() / "bench" / f"nfcorpus-head-{n}"
    if (out / "params.json").exists():
        return out
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        with gzip.open(DATA / "beir-nfcorpus" / "corpus.jsonl.gz", "rt") as f, corpus.open("w") as w:
            for i, line in enumerate(f):
                if i == n:
                    break
                w.write(line)
        print(f"building a BM25 index of {n} NFCorpus documents at {out}", flush=True)
        subprocess.run([str(ROOT / ".venv" / "bin" / "heedrank"), "index", "build", "--corpus", str(corpus),
                        "--out", str(out), "--no-dense", "--overwrite"], check=True, stdout=subprocess.DEVNULL)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def search(base: str, query: str) -> tuple[float, dict]:
    t0 = time.perf_counter()
    r = httpx.post(f"{base}/search", json={"query": query, "top_k": 10}, timeout=300, trust_env=False)
    r.raise_for_status()
    return time.perf_counter() - t0, r.json()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--index", help="an index directory (default: build a subset of NFCorpus)")
    ap.add_argument("--docs", type=int, default=300, help="NFCorpus documents of the subset index")
    ap.add_argument("--runs", type=int, default=3, help="timed searches per query")
    ap.add_argument("--max-query-tokens", type=int, help="HEEDRANK_MAX_QUERY_TOKENS (default: the method's, 64)")
    ap.add_argument("--fill-timeout", type=float, default=900, help="most seconds to wait for the store to fill")
    ap.add_argument("--log", default=None, help="where the server's log goes (default: a temporary file)")
    args = ap.parse_args()

    index = Path(args.index) if args.index else build_subset(args.docs)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = dict(os.environ)
    if args.max_query_tokens:
        env["HEEDRANK_MAX_QUERY_TOKENS"] = str(args.max_query_tokens)
    log_path = Path(args.log or tempfile.mkstemp(prefix="heedrank-serve-", suffix=".log")[1])
    with log_path.open("w") as log:
        server = subprocess.Popen([str(ROOT / ".venv" / "bin" / "heedrank"), "serve", "--index", str(index),
                                   "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        t0 = time.monotonic()
        while True:
            try:
                if httpx.get(f"{base}/health", timeout=5, trust_env=False).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.monotonic() - t0 > 600:
                sys.exit(f"the server did not become ready; its log: {log_path}")
            time.sleep(0.5)
        print(f"server ready in {time.monotonic() - t0:.0f} s (log: {log_path})", flush=True)

        info_seconds: list[float] = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < args.fill_timeout:
            s = time.perf_counter()
            info = httpx.get(f"{base}/info", timeout=60, trust_env=False).json()
            info_seconds.append(time.perf_counter() - s)
            kv = next(iter(info["collections"].values())).get("kv_store") or {}
            if not kv.get("filling"):
                break
            time.sleep(1.0)
        print(f"store: {kv.get('blocks')} blocks after {time.monotonic() - t0:.0f} s", flush=True)

        search(base, SHORT)  # first-call costs
        short = [search(base, SHORT)[0] for _ in range(args.runs)]
        long_runs = [search(base, LONG) for _ in range(args.runs)]
        long = [t for t, _ in long_runs]
        warnings = long_runs[0][1]["rerank"]["warnings"]

        during: list[float] = []
        for _ in range(args.runs):
            worker = threading.Thread(target=search, args=(base, LONG))
            worker.start()
            time.sleep(0.2)
            during.append(search(base, SHORT)[0])
            worker.join()
    finally:
        server.terminate()
        server.wait(30)

    text = log_path.read_text()
    bars = sum(1 for line in text.splitlines() if "it/s]" in line or "s/it]" in line)
    progress = sum(1 for line in text.splitlines() if "document KV store fill " in line)
    full = "document KV store full" in text
    med = statistics.median
    rows = [
        ("/search, 10-token query (s, median)", f"{med(short):.2f}", ""),
        ("/search, 4,000-character query (s, median)", f"{med(long):.2f}",
         f"{med(long) / med(short):.1f}x the short one (target <= 2x)"),
        ("/search, 10-token query sent during the long one (s, median)", f"{med(during):.2f}", "target < 2 s"),
        ("GET /info while the store fills (s, max)", f"{max(info_seconds):.3f}",
         f"median {med(info_seconds):.3f} over {len(info_seconds)} calls"),
        ("server log: progress bars / fill progress lines / 'full' line", f"{bars} / {progress} / {full}", ""),
    ]
    print()
    print(f"index {index.name}, max_query_tokens {args.max_query_tokens or 'default (64)'}, {args.runs} runs")
    print("| measure | value | note |")
    print("|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print()
    print("long query's warnings:", json.dumps(warnings))


if __name__ == "__main__":
    main()

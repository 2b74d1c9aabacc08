"""Load test of the REST service on loopback (not run in CI).

Starts ``uvicorn --factory api.app:create_app`` in a subprocess over a BM25 index (built
from NFCorpus in a temporary folder unless ``--index`` is given), waits until ``/health``
says ``ok``, then runs closed-loop clients for a bounded time per phase:

1. ``search``: ``POST /search`` BM25 top-10, no reranking (``--clients`` clients).
2. ``rerank``: ``POST /search`` with ICR reranking of ``--candidates`` candidates
   (``--rerank-clients`` clients) against one model instance with a small queue: excess
   requests must get 429 quickly while admitted ones complete. A client that gets 429
   waits ``min(Retry-After, 1 s)`` before its next request, as a polite client would.
3. ``cohere``: ``POST /rerank`` (Cohere v2) with 5 documents and ``deadline_ms``
   (``--cohere-clients`` clients): requests that would miss the deadline come back at once
   in the given order (counted as fallbacks, by reason; the client then waits 0.5 s).

Prints one markdown table: requests, throughput of 200s, p50/p99 latency of 200s and of
429s, fallbacks, and any 5xx or transport error (the exit status is 1 if there was one).

    python bench/load.py [--clients 50] [--seconds 30] [--rerank-clients 20] [--rerank-seconds 30] [--torch-threads 1]
        [--index DIR] [--candidates 5] [--workers 1] [--queue-size 4] [--port 8765]
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import itertools
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
NFCORPUS = ROOT.parent / "shared" / "data" / "beir-nfcorpus"


@dataclass
class Phase:
    name: str
    clients: int
    seconds: float
    latencies: dict[int, list[float]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    fallbacks: int = 0
    reasons: dict[str, int] = field(default_factory=dict)
    wall: float = 0.0

    def count(self, status: int) -> int:
        return len(self.latencies.get(status, []))

    @property
    def total(self) -> int:
        return sum(len(v) for v in self.latencies.values()) + len(self.errors)

    @property
    def server_errors(self) -> int:
        return sum(len(v) for s, v in self.latencies.items() if s >= 500)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]


def build_index(out: Path, n_docs: int | None) -> Path:
    from heedrank.index.builder import build_index as build

    corpus = out / "corpus.jsonl"
    with gzip.open(NFCORPUS / "corpus.jsonl.gz", "rt", encoding="utf-8") as src:
        lines = list(itertools.islice(src, n_docs)) if n_docs else src.readlines()
    corpus.write_text("".join(lines), encoding="utf-8")
    build(corpus, out / "index", dense=False, show_progress=False)
    return out / "index"


def queries() -> list[str]:
    path = NFCORPUS / "queries.jsonl"
    opener = open
    if not path.exists():
        path, opener = NFCORPUS / "queries.jsonl.gz", gzip.open
    with opener(path, "rt", encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f if line.strip()]


async def run_phase(phase: Phase, base: str, make_request, limit_s: float = 60.0) -> Phase:
    import httpx

    deadline = time.perf_counter() + phase.seconds
    rng = random.Random(0)

    async def client(i: int, http: httpx.AsyncClient) -> None:
        while time.perf_counter() < deadline:
            path, body = make_request(rng)
            t0 = time.perf_counter()
            try:
                r = await http.post(base + path, json=body, timeout=limit_s)
            except Exception as exc:  # noqa: BLE001 - a hang or a dropped connection is a failure
                phase.errors.append(f"{type(exc).__name__}: {exc}")
                continue
            dt = time.perf_counter() - t0
            phase.latencies.setdefault(r.status_code, []).append(dt)
            if r.status_code == 200 and path == "/rerank" and not r.json()["meta"]["reranked"]:
                phase.fallbacks += 1
                reason = r.json()["meta"]["warnings"][-1].split("(", 1)[-1].split(")", 1)[0]
                phase.reasons[reason] = phase.reasons.get(reason, 0) + 1
                await asyncio.sleep(0.5)  # told the server is busy: back off like after a 429
            if r.status_code == 429:
                await asyncio.sleep(min(float(r.headers.get("retry-after", 1)), 1.0))

    limits = httpx.Limits(max_connections=phase.clients, max_keepalive_connections=phase.clients)
    async with httpx.AsyncClient(limits=limits) as http:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(i, http) for i in range(phase.clients)))
        phase.wall = time.perf_counter() - t0
    return phase


def table(phases: list[Phase]) -> str:
    head = ("| phase | clients | s | requests | 200 | 200/s | p50 200 (ms) | p99 200 (ms) | 429 | p50 429 (ms) "
            "| p99 429 (ms) | fallbacks | 5xx | errors |")
    rows = [head, "|" + "---|" * 14]
    for p in phases:
        ok, rej = p.latencies.get(200, []), p.latencies.get(429, [])
        other = {s: len(v) for s, v in p.latencies.items() if s not in (200, 429)}
        rows.append(
            f"| {p.name} | {p.clients} | {p.wall:.0f} | {p.total} | {len(ok)} | {len(ok) / p.wall:.1f} "
            f"| {pct(ok, .5) * 1e3:.0f} | {pct(ok, .99) * 1e3:.0f} | {len(rej)} | {pct(rej, .5) * 1e3:.1f} "
            f"| {pct(rej, .99) * 1e3:.1f} | {p.fallbacks}{' ' + str(p.reasons) if p.reasons else ''} "
            f"| {p.server_errors} | {len(p.errors)}"
            + (f" (other: {other})" if other else "") + " |"
        )
    return "\n".join(rows)


def stop_server(server: subprocess.Popen) -> None:
    """Terminate a server process, killing it when it has not exited within 30 s."""
    server.terminate()
    try:
        server.wait(30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(10)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{os.cpu_count()} CPUs ({cpu}), load average {load:.1f} at start, Python {platform.python_version()}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", type=Path, help="Index directory (default: NFCorpus BM25 built in a temp dir).")
    ap.add_argument("--docs", type=int, default=None, help="Index only the first N NFCorpus documents.")
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--rerank-clients", type=int, default=20)
    ap.add_argument("--rerank-seconds", type=float, default=30)
    ap.add_argument("--cohere-seconds", type=float, default=15)
    ap.add_argument("--cohere-clients", type=int, default=4)
    ap.add_argument("--deadline-ms", type=int, default=3000)
    ap.add_argument("--candidates", type=int, default=5)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--queue-size", type=int, default=4)
    ap.add_argument("--max-queue-wait", type=float, default=20.0, help="HEEDRANK_MAX_QUEUE_WAIT_S (seconds).")
    ap.add_argument("--torch-threads", type=int, default=1, help="HEEDRANK_TORCH_THREADS of the server.")
    ap.add_argument("--port", type=int, default=8765)
    args = ap.parse_args()

    tmp = tempfile.TemporaryDirectory(prefix="heedrank-load-")
    index = args.index or build_index(Path(tmp.name), args.docs)
    env = {**os.environ, "HEEDRANK_INDEX": str(index), "HEEDRANK_RERANK_METHOD": "icr",
           "HEEDRANK_WORKERS": str(args.workers), "HEEDRANK_QUEUE_SIZE": str(args.queue_size),
           "HEEDRANK_MAX_QUEUE_WAIT_S": str(args.max_queue_wait), "HEEDRANK_MAX_DOC_TOKENS": "128",
           "HEEDRANK_TORCH_THREADS": str(args.torch_threads)}
    log = open(Path(tmp.name) / "server.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--factory", "heedrank.api.app:create_app", "--host", "127.0.0.1",
         "--port", str(args.port), "--log-level", "warning", "--no-access-log", "--timeout-graceful-shutdown", "5"],
        cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{args.port}"
    try:
        import httpx

        t0 = time.perf_counter()
        statuses = []
        while True:
            try:
                st = httpx.get(base + "/health", timeout=2).json()["status"]
                if not statuses or statuses[-1] != st:
                    statuses.append(st)
                if st == "ok":
                    break
            except httpx.HTTPError:
                pass
            if server.poll() is not None or time.perf_counter() - t0 > 300:
                print((Path(tmp.name) / "server.log").read_text()[-3000:], file=sys.stderr)
                raise SystemExit("server did not become healthy")
            time.sleep(0.2)
        print(f"server ready in {time.perf_counter() - t0:.1f} s (/health: {' -> '.join(statuses)})")
        qs = queries()

        def search(rng):
            return "/search", {"query": rng.choice(qs), "top_k": 10}

        def rerank(rng):
            return "/search", {"query": rng.choice(qs), "top_k": 10,
                               "rerank": {"method": "icr", "candidates": args.candidates}}

        docs_by_query: dict[str, list[str]] = {}

        def cohere(rng):
            q = rng.choice(qs[:50])
            if q not in docs_by_query:
                hits = httpx.post(base + "/search", json={"query": q, "top_k": 5}).json()["results"]
                docs_by_query[q] = [h["text"] for h in hits] or ["empty"]
            return "/rerank", {"query": q, "documents": docs_by_query[q], "deadline_ms": args.deadline_ms}

        phases = [
            asyncio.run(run_phase(Phase("search (bm25, no rerank)", args.clients, args.seconds), base, search)),
            asyncio.run(run_phase(Phase(f"search + icr rerank ({args.candidates} cand.)", args.rerank_clients,
                                        args.rerank_seconds), base, rerank)),
            asyncio.run(run_phase(Phase(f"/rerank 5 docs, deadline {args.deadline_ms} ms", args.cohere_clients,
                                        args.cohere_seconds), base, cohere)),
        ]
        metrics = httpx.get(base + "/metrics").text
    finally:
        stop_server(server)
        log.close()
    print(f"\n{time.strftime('%Y-%m-%d %H:%M %Z')}; {machine()}")
    print(f"server: 1 uvicorn process, ICR on SmolLM2-135M (float32, CPU), max_doc_tokens 128, "
          f"workers {args.workers}, queue_size {args.queue_size}, max_queue_wait_s {args.max_queue_wait:g}, "
          f"torch threads {args.torch_threads}; "
          f"index {index}\n")
    print(table(phases))
    rejected = [ln for ln in metrics.splitlines()
                if ln.startswith(("heedrank_rejected_total", "heedrank_deadline_fallbacks_total",
                                  "heedrank_job_seconds_sum", "heedrank_job_seconds_count"))]
    print("\n" + "\n".join(rejected))
    bad = sum(p.server_errors + len(p.errors) for p in phases)
    for p in phases:
        for e in p.errors[:3]:
            print(f"{p.name}: {e}", file=sys.stderr)
    print(f"\n{'FAIL' if bad else 'OK'}: {bad} 5xx or transport errors")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())

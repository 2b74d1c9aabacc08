"""Throughput of reranked ``/search`` on the default path under 1, 2, 4, 8 closed-loop clients (not run in CI).

For each server configuration (``--configs``, each ``workers:torch_threads``; ``torch_threads``
``default`` = leave ``HEEDRANK_TORCH_THREADS`` unset), starts ``uvicorn --factory
heedrank.api.app:create_app`` over ``--index`` (an index whose document KV store is already
filled, e.g. ``/work/idx/nfcorpus``; the service is not asked to write anything, and its
background fill has nothing to do on a full store) with the service's defaults otherwise: the
default reranker (cached BlockRank, reading stored candidate blocks), ``--retriever`` first
stage (``HEEDRANK_DEFAULT_RETRIEVER``, hybrid by default as in the demo). It checks ``/info``,
warms up with ``--warmup`` requests, then for each client count runs closed-loop clients for
``--seconds``: each sends ``POST /search`` ``{"query": q, "top_k": 10, "rerank": {"candidates":
N}}`` with ``q`` drawn from the NFCorpus test queries, and sends the next as soon as the answer
comes. A 429 is counted and followed by ``min(Retry-After, 1 s)`` of waiting.

A 200 counts as reranked when ``rerank.reranked == rerank.candidates`` (no candidate skipped
as cold, no per-request-budget fallback to the first-stage order); others are counted as
``not reranked``. ``blocks computed`` sums ``rerank.cache.misses`` (candidate blocks not found in
the store or RAM cache and encoded inline: 0 on a full store).

Prints one markdown table: configuration, clients, seconds, reranked 200s per second, p50 /
p99 latency of the 200s, not reranked, 429s, other statuses and transport errors.

    python bench/concurrency.py --index /work/idx/nfcorpus [--configs 1:default,1:1,2:1,2:2]
        [--clients 1,2,4,8] [--seconds 25] [--warmup 6] [--candidates 20] [--retriever hybrid] [--port 8766]
        [--variant 'fp16=INDEX_FP16={"kv_dtype": "float16"}']
"""

from __future__ import annotations

import asyncio
import argparse
import csv
import gzip
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from load import NFCORPUS, machine, pct, stop_server  # noqa: E402  (bench/load.py, next to this file)


@dataclass
class Cell:
    config: str
    clients: int
    seconds: float
    ok: list[float] = field(default_factory=list)
    not_reranked: int = 0
    rejected: int = 0
    other: dict[int, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    misses: int = 0
    wall: float = 0.0


def test_queries() -> list[str]:
    """NFCorpus test queries (those with a line in ``qrels/test.tsv``), in file order."""
    with open(NFCORPUS / "qrels" / "test.tsv", encoding="utf-8") as f:
        rows = csv.reader(f, delimiter="\t")
        next(rows)
        ids = {r[0] for r in rows if r}
    with gzip.open(NFCORPUS / "queries.jsonl.gz", "rt", encoding="utf-8") as f:
        qs = [json.loads(line) for line in f if line.strip()]
    return [q["text"] for q in qs if q["_id"] in ids]


async def run_cell(cell: Cell, base: str, qs: list[str], candidates: int, limit_s: float = 120.0) -> Cell:
    import httpx

    deadline = time.perf_counter() + cell.seconds
    rng = random.Random(cell.clients)

    async def client(http: httpx.AsyncClient) -> None:
        while time.perf_counter() < deadline:
            body = {"query": rng.choice(qs), "top_k": 10, "rerank": {"candidates": candidates}}
            t0 = time.perf_counter()
            try:
                r = await http.post(base + "/search", json=body, timeout=limit_s)
            except Exception as exc:  # noqa: BLE001 - a hang or a dropped connection is a failure
                cell.errors.append(f"{type(exc).__name__}: {exc}")
                continue
            dt = time.perf_counter() - t0
            if r.status_code == 200:
                info = r.json().get("rerank") or {}
                if not info or info.get("reranked") != info.get("candidates"):
                    cell.not_reranked += 1
                else:
                    cell.ok.append(dt)
                cell.misses += int((info.get("cache") or {}).get("misses", 0))
            elif r.status_code == 429:
                cell.rejected += 1
                await asyncio.sleep(min(float(r.headers.get("retry-after", 1)), 1.0))
            else:
                cell.other[r.status_code] = cell.other.get(r.status_code, 0) + 1

    limits = httpx.Limits(max_connections=cell.clients, max_keepalive_connections=cell.clients)
    async with httpx.AsyncClient(limits=limits) as http:
        t0 = time.perf_counter()
        await asyncio.gather(*(client(http) for _ in range(cell.clients)))
        cell.wall = time.perf_counter() - t0
    return cell


def table(cells: list[Cell]) -> str:
    rows = ["| server (workers, torch threads) | clients | s | reranked 200 | req/s | p50 (ms) | p99 (ms) "
            "| not reranked | 429 | other / errors | blocks computed |",
            "|" + "---|" * 11]
    for c in cells:
        bad = sum(c.other.values()) + len(c.errors)
        rows.append(f"| {c.config} | {c.clients} | {c.wall:.0f} | {len(c.ok)} | {len(c.ok) / c.wall:.2f} "
                    f"| {pct(c.ok, .5) * 1e3:.0f} | {pct(c.ok, .99) * 1e3:.0f} | {c.not_reranked} | {c.rejected} "
                    f"| {bad}{' ' + str(c.other) if c.other else ''} | {c.misses} |")
    return "\n".join(rows)


def wait_healthy(base: str, server: subprocess.Popen, log: Path) -> float:
    import httpx

    t0 = time.perf_counter()
    while True:
        try:
            if httpx.get(base + "/health", timeout=2).json()["status"] == "ok":
                return time.perf_counter() - t0
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        if server.poll() is not None or time.perf_counter() - t0 > 300:
            print(log.read_text()[-3000:], file=sys.stderr)
            raise SystemExit("server did not become healthy")
        time.sleep(0.3)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", type=Path, required=True, help="Index directory with a filled document KV store.")
    ap.add_argument("--configs", default="1:default,1:1,2:1,2:2",
                    help="Comma-separated workers:torch_threads ('default' = HEEDRANK_TORCH_THREADS unset).")
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("--seconds", type=float, default=25)
    ap.add_argument("--warmup", type=int, default=6, help="Sequential reranked searches before measuring.")
    ap.add_argument("--candidates", type=int, default=20)
    ap.add_argument("--retriever", default="hybrid", help="HEEDRANK_DEFAULT_RETRIEVER of the server.")
    ap.add_argument("--port", type=int, default=8766)
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=INDEX[=OPTIONS_JSON]",
                    help="Also run every configuration as NAME over INDEX, with HEEDRANK_RERANK_OPTIONS=OPTIONS_JSON "
                         "(e.g. the store layout before a default changed); repeatable.")
    args = ap.parse_args()

    import httpx

    qs = test_queries()
    clients = [int(x) for x in args.clients.split(",")]
    cells: list[Cell] = []
    notes: list[str] = []
    tmp = tempfile.TemporaryDirectory(prefix="heedrank-conc-")
    print(f"{time.strftime('%Y-%m-%d %H:%M %Z')}; {machine()}; {len(qs)} NFCorpus test queries", flush=True)
    variants: list[tuple[str, str, str | None]] = [("", str(args.index), None)]
    for v in args.variant:
        vname, vindex, *vopts = v.split("=", 2)
        variants.append((vname, vindex, vopts[0] if vopts else None))
    for (vname, vindex, vopts), spec in ((v, c) for v in variants for c in args.configs.split(",")):
        workers, threads = spec.split(":")
        name = f"{vname + ': ' if vname else ''}{workers}, {threads}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("HEEDRANK_")}
        env.update({"HEEDRANK_INDEX": vindex, "HEEDRANK_DEFAULT_RETRIEVER": args.retriever,
                    "HEEDRANK_WORKERS": workers})
        if vopts:
            env["HEEDRANK_RERANK_OPTIONS"] = vopts
        if threads != "default":
            env["HEEDRANK_TORCH_THREADS"] = threads
        log_path = Path(tmp.name) / f"server-{vname}-{workers}-{threads}.log"
        log = open(log_path, "w")
        server = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--factory", "heedrank.api.app:create_app", "--host", "127.0.0.1",
             "--port", str(args.port), "--log-level", "warning", "--no-access-log",
             "--timeout-graceful-shutdown", "5"],
            cwd=ROOT.parent, env=env, stdout=log, stderr=subprocess.STDOUT,
        )
        base = f"http://127.0.0.1:{args.port}"
        try:
            ready = wait_healthy(base, server, log_path)
            for _ in range(200):  # let the background fill finish its scan (it finds nothing on a full store)
                info = httpx.get(base + "/info", timeout=30).json()
                kv = info.get("collections", {}).get(info.get("default_collection"), {}).get("kv_store") or {}
                if kv.get("scan_done", True) and not kv.get("filling"):
                    break
                time.sleep(0.5)
            coll = info.get("collections", {}).get(info.get("default_collection"), {})
            store = json.dumps({k: v for k, v in coll.items() if any(w in k for w in ("kv", "store", "fill", "block"))},
                               default=str)[:600]
            t0 = time.perf_counter()
            for q in qs[:args.warmup]:
                httpx.post(base + "/search", json={"query": q, "top_k": 10, "rerank": {"candidates": args.candidates}},
                           timeout=120).raise_for_status()
            note = (f"server ({name}): ready in {ready:.1f} s, warm-up {args.warmup} searches "
                    f"{time.perf_counter() - t0:.1f} s; /info store: {store}")
            print(note, flush=True)
            notes.append(note)
            for n in clients:
                cell = asyncio.run(run_cell(Cell(name, n, args.seconds), base, qs, args.candidates))
                cells.append(cell)
                print(table([cell]).splitlines()[-1], flush=True)
            threads_line = [ln for ln in httpx.get(base + "/metrics", timeout=30).text.splitlines()
                            if ln.startswith(("heedrank_rejected_total", "heedrank_deadline_fallbacks_total"))]
            notes.extend(threads_line)
        finally:
            stop_server(server)
            log.close()
            tail = log_path.read_text().strip().splitlines()[-5:]
            if tail:
                notes.append(f"server ({name}) log tail: " + " / ".join(tail))
    print(f"\nreranked /search, {args.retriever} first stage, {args.candidates} candidates, top_k 10, default "
          f"reranker; {args.seconds:g} s per cell; index {args.index}\n")
    print(table(cells))
    print("\n" + "\n".join(notes))
    bad = sum(sum(c.other.values()) + len(c.errors) + c.not_reranked for c in cells)
    print(f"\n{'FAIL' if bad else 'OK'}: {bad} non-200, not reranked or transport errors (429s: "
          f"{sum(c.rejected for c in cells)})")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())

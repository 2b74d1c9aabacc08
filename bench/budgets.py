"""Benchmark: whether the service's per-request budget holds (``HEEDRANK_REQUEST_BUDGET_S``, 20 s
by default), end to end, on the default configuration (2 rerank workers).

Starts ``uvicorn --factory heedrank.api.app:create_app`` once per scenario and, once ``/health``
says ``ok``, sends:

- ``fill``: over ``--index`` copied without its document KV store (``--work``), so the
  background fill runs, as for the first minutes of a new index: one ``/rerank`` of
  ``--documents`` NFCorpus abstracts it has never seen (whole abstracts, a seeded draw), then
  ``--burst`` such requests at once (2 workers: the others queue);
- ``idle``: the same over ``--index`` itself (its store full: the fill has nothing to do);
- ``icr``: on a fresh server, a first ``/search`` with method ``icr`` and ``--icr-candidates``
  candidates (a 422 at once, or an answer within the budget).

Prints one markdown table: scenario, request, HTTP status, seconds seen by the client, whether the
LM reranked (``meta.reranked``), documents read by the LM (those not scored without its attention,
from ``meta.warnings``), and the first warning.

    python bench/budgets.py --index indexes/nfcorpus [--work runs/budgets] [--documents 100] [--burst 5]
        [--scenarios fill,idle,icr] [--code DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "beir-nfcorpus"
WITHOUT = re.compile(r"(\d+) of (\d+) candidates were scored without the reranker's attention")


def abstracts(n: int, seed: int) -> list[str]:
    """``n`` whole NFCorpus abstracts in a seeded draw (texts no earlier request sent)."""
    from heedrank.data import iter_beir_documents

    docs = [d.content for d in iter_beir_documents(DATA)]
    return random.Random(seed).sample(docs, n)


def start(index: Path, port: int, log: Path, code: str) -> subprocess.Popen:
    python = sys.executable if code == "." else str(Path(code).resolve() / ".venv" / "bin" / "python")
    env = {**os.environ, "HEEDRANK_INDEX": str(index.resolve())}
    server = subprocess.Popen([python, "-m", "uvicorn", "--factory", "heedrank.api.app:create_app", "--host",
                               "127.0.0.1", "--port", str(port), "--log-level", "warning", "--no-access-log"],
                              cwd=ROOT if code == "." else Path(code).resolve(), env=env,
                              stdout=open(log, "w"), stderr=subprocess.STDOUT)
    import httpx

    t0 = time.perf_counter()
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).json().get("status") == "ok":
                return server
        except (httpx.HTTPError, ValueError):
            pass
        if server.poll() is not None or time.perf_counter() - t0 > 600:
            raise SystemExit(f"the server did not become healthy; see {log}")
        time.sleep(0.5)


def rerank(port: int, query: str, docs: list[str], label: str) -> dict:
    import httpx

    t = time.perf_counter()
    r = httpx.post(f"http://127.0.0.1:{port}/rerank", json={"query": query, "documents": docs}, timeout=600)
    dt = time.perf_counter() - t
    row = {"request": label, "status": r.status_code, "seconds": round(dt, 2)}
    if r.status_code == 200:
        meta = r.json()["meta"]
        warnings = meta.get("warnings") or []
        without = next((int(m.group(1)) for w in warnings if (m := WITHOUT.search(w))), 0)
        row |= {"reranked": meta.get("reranked"), "read by the LM": len(docs) - without if meta.get("reranked") else 0,
                "warning": (warnings[0][:110] if warnings else "")}
    else:
        row |= {"warning": r.text[:110]}
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", type=Path, required=True, help="an NFCorpus index with a full document KV store")
    ap.add_argument("--work", type=Path, default=ROOT / "runs" / "budgets")
    ap.add_argument("--documents", type=int, default=100)
    ap.add_argument("--burst", type=int, default=5)
    ap.add_argument("--icr-candidates", type=int, default=100)
    ap.add_argument("--scenarios", default="fill,idle,icr")
    ap.add_argument("--port", type=int, default=8791)
    ap.add_argument("--code", default=".", help="a checkout made by bench/other_revision.sh (default: this one)")
    args = ap.parse_args()
    import httpx

    args.work.mkdir(parents=True, exist_ok=True)
    queries = ["vitamin D and bone fractures", "statins and muscle pain", "green tea and cancer risk",
               "sugar and hyperactivity in children", "omega-3 fatty acids and heart disease",
               "breast cancer and alcohol", "fiber intake and colon cancer"]
    rows: list[dict] = []
    seed = 0
    for scenario in args.scenarios.split(","):
        index = args.index
        if scenario == "fill":  # the index without its store: the fill starts at once
            index = args.work / "ix-no-store"
            shutil.rmtree(index, ignore_errors=True)
            shutil.copytree(args.index, index, ignore=shutil.ignore_patterns("kv"))
        server = start(index, args.port, args.work / f"server-{scenario}.log", args.code)
        try:
            if scenario == "icr":
                t = time.perf_counter()
                r = httpx.post(f"http://127.0.0.1:{args.port}/search", timeout=600, json={
                    "query": queries[0], "top_k": 10, "rerank": {"method": "icr", "candidates": args.icr_candidates}})
                rows.append({"scenario": scenario, "request": f"first /search icr at {args.icr_candidates}",
                             "status": r.status_code, "seconds": round(time.perf_counter() - t, 2),
                             "warning": r.text[:110] if r.status_code != 200 else
                             "; ".join((r.json().get("rerank") or {}).get("warnings") or [])[:110]})
                continue
            seed += 1
            rows.append({"scenario": scenario, **rerank(args.port, queries[0], abstracts(args.documents, seed),
                                                          f"one /rerank of {args.documents} new")})
            with ThreadPoolExecutor(args.burst) as pool:
                futures = []
                for i in range(args.burst):
                    seed += 1
                    futures.append(pool.submit(rerank, args.port, queries[(i + 1) % len(queries)],
                                               abstracts(args.documents, seed), f"burst {i + 1} of {args.burst}"))
                    time.sleep(0.05)
                rows += [{"scenario": scenario, **f.result()} for f in futures]
        finally:
            server.terminate()
            server.wait(timeout=60)
    cols = ["scenario", "request", "status", "seconds", "reranked", "read by the LM", "warning"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for row in rows:
        print("| " + " | ".join(str(row.get(c, "")) for c in cols) + " |")
    (args.work / "budgets.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()

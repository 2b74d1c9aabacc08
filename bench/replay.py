"""The same answer under load, and nothing acknowledged lost after ``kill -9``: a load-and-fault
harness for the live service on loopback (not run in CI; ``tests/bench/test_replay.py`` runs it
small under ``-m slow``).

Set-up: an NFCorpus subset (the first ``--docs`` documents) is indexed with BM25 and dense vectors
into a temporary folder, with a second small collection ``scratch`` for the writes; the service
(``uvicorn --factory heedrank.api.app:create_app``, its defaults: the default reranker, 2 passes,
the background fill of the document KV store running) serves both.

Load, for each client count (``--clients``): closed-loop clients send ``--requests`` requests in all,
a seeded mix of

* ``/search`` on the default collection: an NFCorpus test query, hybrid first stage, the default
  reranker over 20 candidates with ``cold_budget: "unlimited"`` (every candidate reranked: cold ones
  encoded inline, warm ones read from the store as the fill writes it);
* ``/rerank`` of 6 documents never sent before (sentences of the corpus, recombined);
* ``POST /documents`` and ``DELETE /documents/{id}`` on ``scratch`` (so that the default
  collection, which the compared answers read, keeps one state).

Every 200 of ``/search`` and ``/rerank`` is then replayed one request at a time against the same
index state and compared: the same ranking, scores within ``--tolerance``. A 429 (overloaded) is
counted, not compared. Per client count: requests, 200s per second, p50 / p99 of the 200s, 429s,
5xx and transport errors, and responses that differ from their replay.

Faults (``--faults``): the server is killed with SIGKILL (1) while the fill writes blocks and
(2) in a burst of upserts to ``scratch``, and restarted each time; then every acknowledged
document must be readable and found by BM25, and answers recorded before the kill must come back
the same (stored blocks score as before).

    python bench/replay.py [--docs 400] [--clients 1,2,4,8] [--requests 250] [--faults]
        [--tolerance 1e-4] [--port 8767] [--seed 0]
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import gzip
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
NFCORPUS = ROOT.parent / "shared" / "data" / "beir-nfcorpus"


def nfcorpus(n: int) -> tuple[list[dict[str, str]], list[str]]:
    """The first ``n`` NFCorpus documents and the test queries' texts."""
    docs = []
    with gzip.open(NFCORPUS / "corpus.jsonl.gz", "rt", encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            docs.append({"_id": d["_id"], "title": d.get("title", ""), "text": d["text"]})
            if len(docs) == n:
                break
    with open(NFCORPUS / "qrels" / "test.tsv", encoding="utf-8") as f:
        rows = csv.reader(f, delimiter="\t")
        next(rows)
        ids = {r[0] for r in rows if r}
    with gzip.open(NFCORPUS / "queries.jsonl.gz", "rt", encoding="utf-8") as f:
        queries = [q["text"] for q in map(json.loads, f) if q["_id"] in ids]
    return docs, queries


@dataclass
class Call:
    """One request and what came back."""

    kind: str
    path: str
    body: dict[str, Any] | None
    status: int = 0
    answer: Any = None
    seconds: float = 0.0


@dataclass
class Level:
    """One client count's results."""

    clients: int
    calls: list[Call] = field(default_factory=list)
    wall: float = 0.0
    differing: list[str] = field(default_factory=list)
    compared: int = 0


class Mix:
    """The seeded request mix (module docstring)."""

    def __init__(self, docs: list[dict[str, str]], queries: list[str], seed: int) -> None:
        self.rng = random.Random(seed)
        self.queries = queries
        self.sentences = [s.strip() for d in docs for s in d["text"].split(". ") if len(s.split()) > 5]
        self.written: list[str] = []
        self.n = 0

    def text(self) -> str:
        self.n += 1
        return ". ".join(self.rng.sample(self.sentences, 3)) + f". Note {self.n}."

    def search(self) -> Call:
        return Call("search", "/search", {"query": self.rng.choice(self.queries), "top_k": 10, "retriever": "hybrid",
                                          "rerank": {"candidates": 20, "cold_budget": "unlimited"}})

    def next(self) -> Call:
        """The next request; a delete names a document whose upsert was acknowledged (:attr:`written`)."""
        r = self.rng.random()
        q = self.rng.choice(self.queries)
        if r < 0.55:
            return self.search()
        if r < 0.85:
            return Call("rerank", "/rerank", {"query": q, "documents": [self.text() for _ in range(6)]})
        if r < 0.95 or not self.written:
            doc_id = f"w{self.n}-{self.rng.randrange(10**6)}"
            return Call("upsert", "/documents", {"collection": "scratch",
                                                 "documents": [{"id": doc_id, "text": self.text()}]})
        doc_id = self.written.pop(self.rng.randrange(len(self.written)))
        return Call("delete", f"/documents/{doc_id}?collection=scratch", None)


async def send(client: Any, call: Call) -> Call:
    import httpx

    t0 = time.perf_counter()
    try:
        if call.kind == "delete":
            r = await client.delete(call.path)
        else:
            r = await client.post(call.path, json=call.body)
        call.status = r.status_code
        call.answer = r.json() if r.headers.get("content-type", "").startswith("application/json") else r.text
    except httpx.HTTPError as exc:
        call.status, call.answer = -1, repr(exc)
    call.seconds = time.perf_counter() - t0
    return call


def ranking(call: Call) -> tuple[list[Any], list[float]]:
    """The ranking and the scores an answer gives (``/search``: doc ids and raw scores;
    ``/rerank``: indices and relevance scores)."""
    if call.kind == "search":
        hits = call.answer["results"]
        return [h["doc_id"] for h in hits], [float(h["raw_score"]) for h in hits]
    res = call.answer["results"]
    return [x["index"] for x in res], [float(x["relevance_score"]) for x in res]


async def run_level(base: str, mix: Mix, clients: int, requests: int) -> Level:
    import httpx

    level = Level(clients)
    it = (mix.next() for _ in range(requests))  # made as sent: one event loop, no lock needed

    async def client_loop(client: Any) -> None:
        for call in it:
            await send(client, call)
            level.calls.append(call)
            if call.kind == "upsert" and call.status == 200:
                mix.written.append(call.body["documents"][0]["id"])  # type: ignore[index]
            if call.status == 429:
                await asyncio.sleep(min(1.0, float(call.answer.get("retry_after", 1)) if isinstance(call.answer, dict)
                                        else 1.0))

    t0 = time.perf_counter()
    async with httpx.AsyncClient(base_url=base, timeout=120, trust_env=False) as client:
        await asyncio.gather(*(client_loop(client) for _ in range(clients)))
    level.wall = time.perf_counter() - t0
    return level


def fell_back(call: Call) -> bool:
    """Whether a 200 was answered without reranking every candidate (the request budget or a
    deadline stopped it: it says so, and its replay need not match)."""
    if call.kind == "search":
        rr = call.answer.get("rerank") or {}
        return rr.get("reranked") != rr.get("candidates")
    return not call.answer.get("meta", {}).get("reranked", True)


async def replay(base: str, calls: list[Call], tolerance: float) -> tuple[int, list[str]]:
    """Replay each compared 200 one at a time; ``(compared, descriptions of those that differ)``."""
    import httpx

    differing = []
    compared = 0
    async with httpx.AsyncClient(base_url=base, timeout=120, trust_env=False) as client:
        for call in calls:
            if call.kind not in ("search", "rerank") or call.status != 200 or fell_back(call):
                continue
            again = await send(client, Call(call.kind, call.path, call.body))
            compared += 1
            if again.status != 200 or fell_back(again):
                differing.append(f"{call.kind}: replay status {again.status}{' (fell back)' if again.status == 200 else ''}")
                continue
            (ids, scores), (ids2, scores2) = ranking(call), ranking(again)
            worst = max((abs(a - b) for a, b in zip(scores, scores2)), default=0.0)
            if ids != ids2 or worst > tolerance:
                differing.append(f"{call.kind} {call.body['query']!r}: ranking {'same' if ids == ids2 else 'differs'}, "
                                 f"max score difference {worst:.2e}")
    return compared, differing


class Server:
    """The service in a subprocess over the index folders."""

    def __init__(self, index: Path, scratch: Path, port: int, log: Path) -> None:
        self.index, self.scratch, self.port, self.log = index, scratch, port, log
        self.base = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> float:
        import httpx

        env = {k: v for k, v in os.environ.items() if not k.startswith("HEEDRANK_")}
        env.update({"HEEDRANK_INDEX": str(self.index), "HEEDRANK_COLLECTIONS": json.dumps({"scratch": str(self.scratch)}),
                    "HEEDRANK_DEFAULT_RETRIEVER": "hybrid"})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--factory", "heedrank.api.app:create_app", "--host", "127.0.0.1",
             "--port", str(self.port), "--log-level", "warning", "--no-access-log"],
            cwd=ROOT.parent, env=env, stdout=open(self.log, "a"), stderr=subprocess.STDOUT)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 300:
            try:
                if httpx.get(self.base + "/health", timeout=2, trust_env=False).status_code == 200:
                    return time.perf_counter() - t0
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.3)
        raise SystemExit(f"the server did not become healthy; its log: {self.log}")

    def kill(self) -> None:
        """SIGKILL: no shutdown handler runs."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()

    def stored_blocks(self) -> int:
        import httpx

        info = httpx.get(self.base + "/info", timeout=30, trust_env=False).json()
        kv = (info.get("collections", {}).get(info.get("default_collection"), {}) or {}).get("kv_store") or {}
        return int(kv.get("blocks", kv.get("entries", 0)) or 0)


def build(docs: list[dict[str, str]], work: Path) -> tuple[Path, Path]:
    from heedrank.index.builder import build_index

    (work / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (work / "scratch.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs[:5]))
    build_index(work / "corpus.jsonl", work / "index", show_progress=False)
    build_index(work / "scratch.jsonl", work / "scratch", dense=False, show_progress=False)
    return work / "index", work / "scratch"


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


async def fault_fill(server: Server, mix: Mix, tolerance: float) -> str:
    """SIGKILL while the fill writes blocks: answers recorded before, replayed after the restart."""
    import httpx

    probe = [mix.search() for _ in range(4)]
    async with httpx.AsyncClient(base_url=server.base, timeout=120, trust_env=False) as client:
        for c in probe:
            await send(client, c)
    before = server.stored_blocks()
    server.kill()
    server.start()
    compared, differing = await replay(server.base, probe, tolerance)
    return (f"kill -9 during the fill ({before} blocks stored then, {server.stored_blocks()} just after the restart): "
            f"{compared - len(differing)} of {compared} answers the same after the restart")


async def fault_burst(server: Server, mix: Mix) -> list[str]:
    """SIGKILL in a burst of upserts: every acknowledged document is there after the restart."""
    import httpx

    acked: list[str] = []
    burst = [Call("upsert", "/documents", {"collection": "scratch", "documents": [
        {"id": f"burst-{i}", "text": f"burstword{i} " + mix.text()}]}) for i in range(60)]

    async with httpx.AsyncClient(base_url=server.base, timeout=120, trust_env=False) as client:
        async def one(c: Call) -> None:
            await send(client, c)
            if c.status == 200:
                acked.append(c.body["documents"][0]["id"])  # type: ignore[index]

        tasks = [asyncio.create_task(one(c)) for c in burst]
        await asyncio.sleep(1.0)
        server.kill()
        await asyncio.gather(*tasks, return_exceptions=True)
    server.start()
    lost = []
    async with httpx.AsyncClient(base_url=server.base, timeout=120, trust_env=False) as client:
        for doc_id in acked:
            got = await client.get(f"/documents/{doc_id}", params={"collection": "scratch"})
            n = doc_id.split("-")[1]
            found = await client.post("/search", json={"query": f"burstword{n}", "collection": "scratch", "top_k": 1,
                                                       "retriever": "bm25", "rerank": False})
            hits = found.json().get("results", []) if found.status_code == 200 else []
            if got.status_code != 200 or not hits or hits[0]["doc_id"] != doc_id:
                lost.append(doc_id)
    lines = [f"kill -9 in a burst of 60 upserts: {len(acked)} acknowledged before the kill, "
             f"{len(acked) - len(lost)} readable and found by BM25 after the restart, {len(lost)} lost"]
    return lines + ([f"LOST: {lost[:10]}"] if lost else [])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=400)
    ap.add_argument("--clients", default="1,2,4,8")
    ap.add_argument("--requests", type=int, default=250, help="Requests per client count.")
    ap.add_argument("--faults", action="store_true")
    ap.add_argument("--tolerance", type=float, default=1e-4)
    ap.add_argument("--port", type=int, default=8767)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", type=Path, default=None, help="Folder for the indexes (default: a temporary one).")
    args = ap.parse_args()

    docs, queries = nfcorpus(args.docs)
    tmp = None if args.work else tempfile.TemporaryDirectory(prefix="heedrank-replay-")
    work = args.work or Path(tmp.name)  # type: ignore[union-attr]
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    index, scratch = build(docs, work)
    print(f"{time.strftime('%Y-%m-%d %H:%M %Z')}; {os.cpu_count()} CPUs; {len(docs)} NFCorpus documents indexed in "
          f"{time.perf_counter() - t0:.0f} s; {len(queries)} test queries", flush=True)
    server = Server(index, scratch, args.port, work / "server.log")
    mix = Mix(docs, queries, args.seed)
    failed = False
    try:
        print(f"server healthy after {server.start():.0f} s (the store fills in the background)", flush=True)
        fault_lines = []
        if args.faults:  # first, while the fill has most of the store to write
            fault_lines.append(asyncio.run(fault_fill(server, mix, args.tolerance)))
            print(fault_lines[-1], flush=True)
        rows = ["| clients | requests | 200/s | p50 200 (ms) | p99 200 (ms) | 429 | fell back | 5xx + errors | compared | "
                "differing | blocks stored |", "|---|---|---|---|---|---|---|---|---|---|---|"]
        for clients in [int(c) for c in args.clients.split(",")]:
            level = asyncio.run(run_level(server.base, mix, clients, args.requests))
            level.compared, level.differing = asyncio.run(replay(server.base, level.calls, args.tolerance))
            ok = [c.seconds for c in level.calls if c.status == 200]
            errors = sum(1 for c in level.calls if c.status >= 500 or c.status < 0)
            bad_4xx = [c for c in level.calls if 400 <= c.status < 500 and c.status != 429]
            failed |= bool(errors or level.differing or bad_4xx)
            rows.append(f"| {clients} | {len(level.calls)} | {len(ok) / level.wall:.2f} | {1000 * statistics.median(ok):.0f} "
                        f"| {1000 * pct(ok, 0.99):.0f} | {sum(c.status == 429 for c in level.calls)} | "
                        f"{sum(c.status == 200 and c.kind in ('search', 'rerank') and fell_back(c) for c in level.calls)} | {errors} | "
                        f"{level.compared} | {len(level.differing)} | {server.stored_blocks()} |")
            print(rows[-1], flush=True)
            for line in level.differing[:5] + [f"{c.kind} {c.status}: {str(c.answer)[:200]}" for c in bad_4xx[:5]]:
                print("   ", line, flush=True)
        print("\n".join(rows))
        if args.faults:
            fault_lines += asyncio.run(fault_burst(server, mix))
            print(fault_lines[-1], flush=True)
        for line in fault_lines:
            failed |= line.startswith("LOST") or not _all_same(line)
    finally:
        server.stop()
        if tmp is not None:
            tmp.cleanup()
    return 1 if failed else 0


def _all_same(line: str) -> bool:
    """Whether a fault line's ``A of B answers the same`` has ``A == B`` (other lines: true)."""
    if "answers the same" not in line:
        return True
    head = line.split(": ")[-1].split()
    return head[0] == head[2]


if __name__ == "__main__":
    sys.exit(main())

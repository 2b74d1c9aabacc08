"""Crash test of durable ingest: a real server process (`heedrank serve`, BM25 + dense
index) takes a stream of ``POST /documents`` batches and is killed with SIGKILL mid-stream;
after a restart every acknowledged document is retrievable by id and findable by BM25 and
by dense search (the vector file catches up from SQLite). About 30-60 s on 2 cores."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

httpx = pytest.importorskip("httpx")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _word(n: int) -> str:
    """A token unique to batch document ``n`` (letters only, so every tokenizer keeps it)."""
    return "zq" + "".join(chr(ord("a") + int(d)) for d in str(n)) + "vw"


def _start(index_dir, port, log):
    env = {**os.environ, "HEEDRANK_WARMUP": "false", "OMP_NUM_THREADS": "1", "HEEDRANK_SEARCH_WORKERS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "heedrank.cli", "serve", "--index", str(index_dir), "--port", str(port),
         "--rerank-method", "none"],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"server exited with {proc.returncode}; see {log.name}")
        try:
            if httpx.get(f"{base}/health", timeout=2).json().get("status") == "ok":
                return proc, base
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.3)
    proc.kill()
    raise AssertionError("server did not become healthy in 180 s")


def test_kill_9_mid_ingest_loses_no_acknowledged_document(tmp_path):
    from heedrank.index.builder import build_index

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(
        json.dumps({"_id": f"base{i}", "title": "", "text": f"Background document number {i} about fruit."}) + "\n"
        for i in range(20)
    ))
    index_dir = tmp_path / "index"
    build_index(corpus, index_dir, show_progress=False)  # BM25 and dense (packaged MiniLM)
    log = open(tmp_path / "server.log", "w")
    proc, base = _start(index_dir, _free_port(), log)

    acked: dict[str, str] = {}
    sent = 0
    stop = threading.Event()

    def ingest() -> None:
        nonlocal sent
        with httpx.Client(timeout=30) as client:
            n = 0
            while not stop.is_set():
                batch = [{"id": f"doc{n + j}", "text": f"{_word(n + j)} is the code word of entry {n + j}.",
                          "metadata": {"n": n + j}} for j in range(4)]
                n += 4
                sent += 1
                try:
                    r = client.post(f"{base}/documents", json={"documents": batch})
                except httpx.HTTPError:
                    return  # the server died mid-request: this batch was never acknowledged
                if r.status_code == 200:
                    acked.update({d["id"]: d["text"] for d in batch})

    writer = threading.Thread(target=ingest)
    writer.start()
    deadline = time.monotonic() + 120
    while len(acked) < 40 and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)  # mid-stream: the writer has a request in flight
    proc.wait()
    stop.set()
    writer.join(60)
    assert len(acked) >= 40, f"only {len(acked)} documents acknowledged before the deadline"
    assert sent * 4 > len(acked)  # at least one batch was in flight or unsent when the server died

    proc, base = _start(index_dir, _free_port(), log)
    try:
        with httpx.Client(timeout=60) as client:
            info = client.get(f"{base}/info").json()
            assert info["collections"]["default"]["num_docs"] >= 20 + len(acked)
            for doc_id, text in acked.items():
                r = client.get(f"{base}/documents/{doc_id}")
                assert r.status_code == 200 and r.json()["text"] == text, (doc_id, r.text)
            for doc_id, text in list(acked.items()):
                word = text.split()[0]
                r = client.post(f"{base}/search", json={"query": word, "top_k": 1, "retriever": "bm25"})
                assert [h["doc_id"] for h in r.json()["results"]] == [doc_id], (doc_id, r.text)
            for doc_id, text in list(acked.items())[::7]:
                r = client.post(f"{base}/search", json={"query": text, "top_k": 3, "retriever": "dense"})
                assert doc_id in [h["doc_id"] for h in r.json()["results"]], (doc_id, r.text)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()

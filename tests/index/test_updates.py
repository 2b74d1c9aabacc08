"""Index.add_documents / delete_documents / compact: versions, durability (SQLite first,
files caught up on open, also after a crash), BM25 delta, HNSW tombstones, filters, threads."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from heedrank.errors import IndexMismatchError, ValidationError
from heedrank.types import Document, Query
from heedrank.index.bm25 import Analyzer, BM25Params
from heedrank.index.builder import build_index
from heedrank.index.dense import DenseParams
from heedrank.index.hashing import HashingEncoder
from heedrank.index.passages import PassageParams
from heedrank.index.store import Index
from heedrank.retriever.bm25 import BM25Retriever
from heedrank.retriever.dense import DenseRetriever
from heedrank.retriever.hybrid import HybridRetriever

ROOT = Path(__file__).resolve().parents[2]
TOPICS = ["vitamin bone", "statin cancer", "tea cholesterol", "running knee", "diet sugar"]


def _docs(n: int = 40, prefix: str = "d") -> list[Document]:
    return [
        Document(f"{prefix}{i:03d}", f"{TOPICS[i % 5]} study number {i} with patients", f"Title {i}",
                 {"cat": f"c{i % 4}", "year": 2000 + i % 10, "open": i % 2 == 0})
        for i in range(n)
    ]


def _ids(index: Index, name: str, text: str, k: int = 10, flt=None) -> list[str]:
    cls = {"bm25": BM25Retriever, "dense": DenseRetriever, "hybrid": HybridRetriever}[name]
    (ranking,) = cls.from_index(index).retrieve([Query("q", text)], k, filter=flt)
    return ranking.doc_ids


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf"])
def test_add_replace_delete_in_memory(kind: str) -> None:
    ix = Index.from_documents(_docs(), encoder=HashingEncoder(64), dense_params=DenseParams(kind, nlist=4))
    flt = {"must": [{"key": "cat", "match": {"value": "c1"}}]}
    assert ix.filter_vids(flt).tolist() == list(range(1, 40, 4))
    res = ix.add_documents([
        Document("d001", "zebra migration in the savanna", "Zebras", {"cat": "c1"}),  # new version of d001
        Document("new", "zebra stripes and vitamin bone", "New", {"cat": "c1"}),
    ])
    assert res == {"added": ["new"], "replaced": ["d001"], "vids": {"d001": 40, "new": 41}}
    assert ix.filter_vids(flt).tolist()[-2:] == [40, 41]  # the filter cache was invalidated
    assert ix.docstore.get("d001").title == "Zebras"
    for name in ("bm25", "dense", "hybrid"):
        got = _ids(ix, name, "zebra", 5, flt)
        assert set(got[:2]) == {"d001", "new"}, name
    assert ix.delete_documents(["d005", "nope", "new"]) == {"deleted": ["d005", "new"], "missing": ["nope"]}
    for name in ("bm25", "dense", "hybrid"):
        got = _ids(ix, name, "zebra vitamin bone statin", 50)
        assert "d005" not in got and "new" not in got and len(got) == len(set(got)), name
        assert _ids(ix, name, "zebra", 5, flt)[0] == "d001"
    assert ix.doc_ids[1] is None and ix.doc_ids[40] == "d001" and ix.doc_ids[41] is None
    stats = ix.stats()
    assert stats["num_docs"] == 39 and stats["bm25_delta"] == 1
    assert stats["tombstones"] == (3 if kind == "hnsw" else 0)  # old d001, d005, new
    summary = ix.compact()
    assert summary["bm25_delta_folded"] == 1 and summary["tombstones_dropped"] == (3 if kind == "hnsw" else 0)
    after = ix.stats()
    assert after["bm25_delta"] == 0 and after["bm25_deleted_rows"] == 0 and after["tombstones"] == 0
    assert _ids(ix, "dense", "zebra", 1, flt) == ["d001"]
    with pytest.raises(ValidationError, match="occurs twice"):
        ix.add_documents([Document("x", "a"), Document("x", "b")])
    with pytest.raises(ValidationError, match="not valid JSON"):
        ix.add_documents([Document("y", "a", "", {"v": float("nan")})])
    assert "x" not in ix.docstore and "y" not in ix.docstore


def test_bm25_delta_uses_main_statistics_and_compaction_refreshes_them() -> None:
    docs = _docs(30)
    ix = Index.from_documents(docs)
    added = Document("zz", "statin statin cancer zebra", "")
    ix.add_documents([added])
    analyzer = Analyzer(BM25Params())
    tokens = analyzer([d.content for d in docs])
    n, avgdl = len(tokens), sum(map(len, tokens)) / len(tokens)
    doc = analyzer([added.content])[0]
    expected = 0.0
    for t in analyzer(["statin cancer zebra"])[0]:
        df = sum(t in d for d in tokens) or 1  # "zebra" is new: its df comes from the delta
        n_t = n if any(t in d for d in tokens) else n + 1
        idf = math.log(1 + (n_t - df + 0.5) / (df + 0.5))
        tf = doc.count(t)
        expected += idf * tf / (tf + 0.9 * (1 - 0.4 + 0.4 * len(doc) / avgdl))
    (ranking,) = BM25Retriever.from_index(ix).retrieve([Query("q", "statin cancer zebra")], 5)
    assert ranking.doc_ids[0] == "zz" and ranking.hits[0].score == pytest.approx(expected, rel=1e-5)
    # after compaction the scores are those of an index built from scratch over the same documents
    ix.compact()
    fresh = Index.from_documents([*docs, added])
    q = [Query("q", "statin cancer zebra study")]
    assert BM25Retriever.from_index(ix).retrieve(q, 40) == BM25Retriever.from_index(fresh).retrieve(q, 40)


def test_passages_maxp_in_memory() -> None:
    docs = [
        Document("long", " ".join(["filler"] * 40 + ["zebra", "stripes", "savanna"] + ["filler"] * 40), "Long"),
        Document("short", "a short note on tea", "Short"),
        Document("other", "filler text about nothing in particular", "Other"),
    ]
    ix = Index.from_documents(docs, encoder=HashingEncoder(128),
                              passages=PassageParams(max_words=20, stride=15, max_passages=8))
    assert len(ix.dense) > 3 and ix.group_bits == 3
    (ranking,) = DenseRetriever.from_index(ix).retrieve([Query("q", "zebra stripes savanna")], 3)
    assert ranking.doc_ids[0] == "long" and len(ranking) == 3  # document ids, not passages
    ix.add_documents([Document("new", "zebra stripes savanna", "")])
    ix.delete_documents(["long"])
    (ranking,) = DenseRetriever.from_index(ix).retrieve([Query("q", "zebra stripes savanna")], 3,
                                                       filter={"must_not": [{"has_id": ["short"]}]})
    assert ranking.doc_ids == ["new", "other"]


@pytest.fixture
def corpus_dir(tmp_path: Path) -> Path:
    d = tmp_path / "corpus"
    d.mkdir()
    rows = [{"_id": doc.doc_id, "title": doc.title, "text": doc.text, "metadata": dict(doc.metadata)} for doc in _docs(60)]
    (d / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return d


def _build(corpus_dir: Path, out: Path, kind: str) -> None:
    build_index(corpus_dir, out, encoder=HashingEncoder(64), dense_params=DenseParams(kind, nlist=4),
                show_progress=False)


@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivf"])
def test_on_disk_updates_survive_reopen_and_compaction(tmp_path: Path, corpus_dir: Path, monkeypatch, kind) -> None:
    monkeypatch.setenv("HEEDRANK_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "ix"
    _build(corpus_dir, out, kind)
    params = json.loads((out / "params.json").read_text())
    assert params["format_version"] == 2 and params["dense"]["params"]["index_type"] == kind
    enc = HashingEncoder(64)
    ix = Index.open(out, encoder=enc)
    faiss_bytes = (out / "vectors.faiss").read_bytes()
    ix.add_documents([Document("d002", "zebra zebra", "Z", {"cat": "c9"}), Document("n1", "zebra herd", "", {"cat": "c9"})])
    ix.delete_documents(["d010"])
    assert (out / "vectors.faiss").read_bytes() == faiss_bytes  # files lag; SQLite holds the truth
    expected = {name: _ids(ix, name, "zebra vitamin", 10) for name in ("bm25", "dense", "hybrid")}
    again = Index.open(out, encoder=enc)  # without close(): caught up from SQLite
    assert {name: _ids(again, name, "zebra vitamin", 10) for name in expected} == expected
    assert again.stats()["bm25_delta"] == 2 and again.stats()["vectors_unsaved"]
    again.close()  # writes the vector file
    assert (out / "vectors.faiss").read_bytes() != faiss_bytes
    third = Index.open(out, encoder=enc)
    assert not third.stats()["vectors_unsaved"] and third.docstore.pending_vectors([60, 61]) == {}
    third.compact()
    third.close()
    fourth = Index.open(out, encoder=enc)
    s = fourth.stats()
    assert (s["num_docs"], s["bm25_rows"], s["bm25_delta"], s["tombstones"]) == (60, 60, 0, 0)
    assert {name: _ids(fourth, name, "zebra vitamin", 10) for name in expected} == expected
    assert fourth.filter_vids({"must": [{"key": "cat", "match": {"value": "c9"}}]}).tolist() == [60, 61]
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]
    fourth.close()
    with pytest.raises(IndexMismatchError, match="given encoder"):
        Index.open(out, encoder=HashingEncoder(32))


_CRASH = """
import os, sys
sys.path.insert(0, {root!r})
from heedrank.types import Document
from heedrank.index.hashing import HashingEncoder
from heedrank.index.store import Index
ix = Index.open({out!r}, encoder=HashingEncoder(64))
ix.add_documents([Document("crash1", "zebra acknowledged before the crash", "", {{"cat": "c9"}})])
ix.delete_documents(["d003"])
print("acknowledged", flush=True)
os._exit(0)  # no close(), no flush: the process dies
"""


def test_acknowledged_update_survives_a_crash(tmp_path: Path, corpus_dir: Path, monkeypatch) -> None:
    monkeypatch.setenv("HEEDRANK_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "ix"
    _build(corpus_dir, out, "hnsw")
    proc = subprocess.run([sys.executable, "-c", _CRASH.format(root=str(ROOT), out=str(out))],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "acknowledged" in proc.stdout, proc.stderr
    ix = Index.open(out, encoder=HashingEncoder(64))
    assert "crash1" in ix.docstore and "d003" not in ix.docstore
    for name in ("bm25", "dense", "hybrid"):
        got = _ids(ix, name, "zebra acknowledged crash", 60)
        assert got[0] == "crash1" and "d003" not in got, name
    assert ix.stats()["tombstones"] == 1  # d003's vector, re-derived from SQLite
    ix.close()


def test_format_1_index_is_read_only(tmp_path: Path, corpus_dir: Path, monkeypatch) -> None:
    monkeypatch.setenv("HEEDRANK_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "ix"
    build_index(corpus_dir, out, dense=False, show_progress=False)
    params = json.loads((out / "params.json").read_text())
    params["format_version"] = 1
    (out / "params.json").write_text(json.dumps(params))
    (out / "bm25" / "vids.npy").unlink()
    ix = Index.open(out)
    assert _ids(ix, "bm25", "vitamin bone", 3)
    with pytest.raises(IndexMismatchError, match="read-only"):
        ix.add_documents([Document("x", "y")])
    with pytest.raises(IndexMismatchError, match="read-only"):
        ix.delete_documents(["d001"])
    ix.close()


def test_concurrent_searches_and_updates() -> None:
    ix = Index.from_documents(_docs(80), encoder=HashingEncoder(64), dense_params=DenseParams("hnsw", hnsw_m=8))
    errors: list[BaseException] = []
    stop = threading.Event()
    flt = {"must": [{"key": "open", "match": {"value": True}}]}

    def reader(name: str) -> None:
        cls = {"bm25": BM25Retriever, "dense": DenseRetriever, "hybrid": HybridRetriever}[name]
        r = cls.from_index(ix)
        try:
            while not stop.is_set():
                for (ranking,) in (r.retrieve([Query("q", "zebra vitamin statin")], 10),
                                   r.retrieve([Query("q", "zebra study")], 10, filter=flt)):
                    assert len(set(ranking.doc_ids)) == len(ranking)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(n,)) for n in ("bm25", "dense", "hybrid", "dense")]
    for t in threads:
        t.start()
    try:
        for i in range(25):
            ix.add_documents([Document(f"z{i}", f"zebra number {i}", "", {"open": True})])
            gone = f"d{i:03d}"
            ix.delete_documents([gone, f"z{i - 1}"])
            for name in ("bm25", "dense", "hybrid"):  # a returned delete is never served again
                got = _ids(ix, name, f"zebra number {i - 1} " + TOPICS[i % 5], 100)
                assert gone not in got and f"z{i - 1}" not in got and f"z{i}" in got
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors[:1]
    assert len(ix.docstore) == 80 - 25 + 1


@pytest.mark.parametrize("kind", ["hnsw", "flat"])
def test_background_compaction_replays_concurrent_updates(kind: str, monkeypatch) -> None:
    import heedrank.index.bm25 as bm25_module

    ix = Index.from_documents(_docs(300), encoder=HashingEncoder(64), dense_params=DenseParams(kind, hnsw_m=8))
    ix.delete_documents([f"d{i:03d}" for i in range(0, 300, 3)])
    ix.add_documents([Document(f"a{i}", f"zebra {i}", "") for i in range(20)])
    started = threading.Event()
    build = bm25_module.BM25Builder.build

    def slow_build(self, **kwargs):  # keep the rebuild running while the updates below land
        started.set()
        time.sleep(0.5)
        return build(self, **kwargs)

    monkeypatch.setattr(bm25_module.BM25Builder, "build", slow_build)
    future = ix.compact_async()
    assert started.wait(10)
    added, deleted = [], []
    for i in range(30):  # updates while the rebuild runs
        ix.add_documents([Document(f"b{i}", f"giraffe {i} vitamin", "", {"cat": "c9"})])
        added.append(f"b{i}")
        gone = f"d{3 * i + 1:03d}"
        ix.delete_documents([gone, f"a{i}"] if i < 20 else [gone])
        deleted += [gone] + ([f"a{i}"] if i < 20 else [])
    summary = future.result(timeout=60)
    assert summary["replayed"] > 0  # the updates made during the rebuild were replayed onto it
    live = set(ix.docstore.doc_ids())
    assert live == {d.doc_id for d in _docs(300)} - {f"d{i:03d}" for i in range(0, 300, 3)} - set(deleted) | set(added)
    for name in ("bm25", "dense", "hybrid"):
        got = _ids(ix, name, "giraffe zebra vitamin", 400)
        assert not set(got) & set(deleted), name
        assert set(got) <= live
    assert set(_ids(ix, "dense", "giraffe", 100, {"must": [{"key": "cat", "match": {"value": "c9"}}]})) == set(added)
    ix.compact()  # a second compaction leaves nothing to fold
    s = ix.stats()
    assert (s["bm25_delta"], s["bm25_deleted_rows"], s["tombstones"]) == (0, 0, 0)
    assert s["num_docs"] == len(live) == s["bm25_rows"] == s["vectors"]

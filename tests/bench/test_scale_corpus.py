"""``bench/scale_corpus.py`` on the real data: NFCorpus first and unchanged, then the other real
documents, then distractors of whole real sentences; the same seed writes the same bytes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest



@pytest.fixture(scope="module")
def bench():
    from bench_modules import load_bench

    return load_bench("scale_corpus")


def _rows(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "corpus.jsonl").read_text(encoding="utf-8").splitlines()]


def test_nfcorpus_first_then_real_documents_then_distractors(bench, nfcorpus_dir, tmp_path) -> None:
    data = nfcorpus_dir.parent
    if not (data / "beir-scifact").is_dir():
        pytest.skip("SciFact not in the shared data")
    n = 3633 + 43205 + 30  # every real document, then 30 distractors
    out = tmp_path / "a"
    assert bench.main(["--n", str(n), "--out", str(out), "--data", str(data), "--seed", "3"]) == 0
    rows = _rows(out)
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(rows) == n and manifest["counts"] == {"nfcorpus": 3633, "real": 43205, "distractor": 30}
    assert rows[0]["_id"] == "MED-10" and rows[0]["title"].startswith("Statin Use and Breast Cancer Survival")
    ids = [r["_id"] for r in rows]
    assert len(set(ids)) == n and ids[-1] == "x0000029"
    assert {i.split("-")[0] for i in ids[3633:n - 30]} == {"scifact", "msmarco"}
    pool = {s for r in rows[3633:n - 30] for s in bench.sentences(r["text"])}  # not NFCorpus's sentences
    for r in rows[-30:]:  # opens with a whole real sentence (re-splitting may join two: no capital after)
        assert r["title"] == "" and any(r["text"].startswith(s + " ") or r["text"] == s for s in pool), r["_id"]
    nf_sentences = {s for r in rows[:3633] for s in bench.sentences(r["text"])} - pool
    assert not any(s in r["text"] for r in rows[-30:] for s in nf_sentences if len(s.split()) > 8)
    assert (out / "qrels" / "test.tsv").read_bytes() == (nfcorpus_dir / "qrels" / "test.tsv").read_bytes()
    meta = [json.loads(line) for line in (out / "metadata.jsonl").read_text().splitlines()]
    assert [m["doc_id"] for m in meta] == ids and meta[101] == {"doc_id": ids[101], "shard": 1, "bucket": 101}
    again = tmp_path / "b"
    bench.main(["--n", "3700", "--out", str(again), "--data", str(data), "--seed", "3"])
    small = _rows(again)
    assert [r["_id"] for r in small[:3633]] == ids[:3633] and len(small) == 3700
    bench.main(["--n", "3700", "--out", str(tmp_path / "c"), "--data", str(data), "--seed", "3"])
    assert (tmp_path / "c" / "corpus.jsonl").read_bytes() == (again / "corpus.jsonl").read_bytes()


def test_distractors_are_whole_sentences_up_to_a_drawn_length(bench) -> None:
    import numpy as np

    pool = ["One two.", "Three four five.", "Six."]
    words = np.asarray([2, 3, 1])
    texts = list(bench.distractors(np.random.default_rng(0), pool, words, np.asarray([4]), 50))
    for t in texts:
        parts, rest = [], t
        while rest:  # greedy: the text is pool sentences joined by one space
            s = next(s for s in pool if rest == s or rest.startswith(s + " "))
            parts.append(s)
            rest = rest[len(s) + 1:]
        n = sum(len(s.split()) for s in parts)
        assert n >= 4 and n - len(parts[-1].split()) < 4  # stops at the first sentence that reaches the length
    assert len(set(texts)) > 5  # seeded, not constant

"""attnrank.data: BEIR and TREC DL loaders on tiny inline files and on the real data."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from attnrank.data import (
    iter_beir_documents,
    load_beir_corpus,
    load_beir_qrels,
    load_beir_queries,
    load_run_json,
    load_trec_qrels,
    load_trec_run,
    load_trec_topics,
    trec_dl_paths,
    write_trec_run,
)
from attnrank.errors import NotFoundError, ValidationError
from attnrank.types import Document, Query

DATA = Path("/work/shared/data")
NFCORPUS = DATA / "beir-nfcorpus"
DL19 = DATA / "msmarco-trec-dl-2019-passage"
needs_nfcorpus = pytest.mark.skipif(not NFCORPUS.is_dir(), reason="NFCorpus not available")
needs_dl19 = pytest.mark.skipif(not DL19.is_dir(), reason="TREC DL 2019 not available")


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path_factory, monkeypatch):
    # keep the Arrow cache of `datasets` out of the home directory
    monkeypatch.setenv("ATTNRANK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def _write_lines(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(line + "\n" for line in lines).encode()
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress(data))
    else:
        path.write_bytes(data)
    return path


@pytest.fixture
def beir_dir(tmp_path: Path) -> Path:
    rows = [
        {"_id": "d1", "title": "Vitamin D", "text": "Bones need vitamin D.", "metadata": {"year": 2020}},
        {"_id": "d2", "title": "", "text": "Statins and cancer.", "metadata": {"url": "http://x"}},
        {"_id": "d3", "text": "No title here."},
    ]
    d = tmp_path / "beir"
    _write_lines(d / "corpus.jsonl.gz", [json.dumps(r) for r in rows])
    _write_lines(d / "queries.jsonl", [json.dumps({"_id": 7, "text": "vitamin d bones"}),
                                       json.dumps({"_id": "q2", "text": "statins", "metadata": {}})])
    _write_lines(d / "qrels" / "test.tsv", ["query-id\tcorpus-id\tscore", "7\td1\t2", "7\td3\t0", "q2\td2\t1"])
    _write_lines(d / "qrels" / "train.tsv.gz", ["query-id\tcorpus-id\tscore", "q2\td1\t1"])
    return d


# ---------------------------------------------------------------------------- BEIR, inline
def test_iter_beir_documents_reads_fields_and_metadata(beir_dir: Path) -> None:
    docs = list(iter_beir_documents(beir_dir, batch_size=2))
    assert [d.doc_id for d in docs] == ["d1", "d2", "d3"]
    assert docs[0] == Document("d1", "Bones need vitamin D.", "Vitamin D", {"year": 2020})
    # Arrow unions the metadata keys; the missing ones (None) are dropped per document
    assert dict(docs[1].metadata) == {"url": "http://x"}
    assert docs[2].title == "" and dict(docs[2].metadata) == {}
    assert docs[0].content == "Vitamin D Bones need vitamin D."
    assert docs[1].content == "Statins and cancer."


def test_corpus_from_file_and_numeric_ids(tmp_path: Path) -> None:
    f = _write_lines(tmp_path / "c.jsonl", [json.dumps({"_id": 12, "title": "T", "text": "x"})])
    assert len(load_beir_corpus(f)) == 1
    (doc,) = iter_beir_documents(f)
    assert doc.doc_id == "12" and isinstance(doc.doc_id, str)


def test_corpus_missing_raises(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError, match="BEIR corpus not found"):
        load_beir_corpus(tmp_path)
    with pytest.raises(NotFoundError):
        list(iter_beir_documents(tmp_path / "nope.jsonl"))


def test_queries_and_qrels(beir_dir: Path) -> None:
    queries = load_beir_queries(beir_dir)
    assert queries == {"7": Query("7", "vitamin d bones"), "q2": Query("q2", "statins")}
    assert load_beir_qrels(beir_dir, "test") == {"7": {"d1": 2, "d3": 0}, "q2": {"d2": 1}}
    assert load_beir_qrels(beir_dir, "train") == {"q2": {"d1": 1}}
    with pytest.raises(NotFoundError, match=r"split 'dev'.*available splits: test, train"):
        load_beir_qrels(beir_dir, "dev")
    with pytest.raises(NotFoundError, match="BEIR queries not found"):
        load_beir_queries(beir_dir / "qrels")


# ---------------------------------------------------------------------------- TREC, inline
def test_trec_topics_qrels_run(tmp_path: Path) -> None:
    topics = _write_lines(tmp_path / "topics.txt", ["1\tdo goldfish grow", "2\twhat is wifi"])
    assert load_trec_topics(topics) == {"1": Query("1", "do goldfish grow"), "2": Query("2", "what is wifi")}
    qrels = _write_lines(tmp_path / "qrels.txt", ["1 0 a 3", "1 Q0 b 0", "2 0 a 1"])
    assert load_trec_qrels(qrels) == {"1": {"a": 3, "b": 0}, "2": {"a": 1}}
    run = _write_lines(tmp_path / "run.txt.gz", ["1 Q0 a 1 2.5 t", "1 Q0 b 2 1.0 t", "2 Q0 c 1 -0.5 t"])
    assert load_trec_run(run) == {"1": {"a": 2.5, "b": 1.0}, "2": {"c": -0.5}}
    bad = _write_lines(tmp_path / "bad.txt", ["1 Q0 a 1 2.5"])
    with pytest.raises(ValidationError, match="bad.txt:1"):
        load_trec_run(bad)
    with pytest.raises(NotFoundError):
        load_trec_topics(tmp_path / "missing.txt")


@pytest.mark.parametrize("name", ["run.txt", "run.txt.gz"])
def test_write_trec_run_sorts_and_round_trips(tmp_path: Path, name: str) -> None:
    run = {"q2": {"b": 1.0, "a": 1.0, "c": 3.0}, "q1": {"x": 0.25}}
    path = tmp_path / "sub" / name
    write_trec_run(run, path, tag="bm25")
    opener = gzip.open if name.endswith(".gz") else open
    with opener(path, "rt") as f:
        lines = f.read().splitlines()
    assert lines == [
        "q1 Q0 x 1 0.25 bm25",
        "q2 Q0 c 1 3.0 bm25",
        "q2 Q0 a 2 1.0 bm25",  # tie broken by doc id
        "q2 Q0 b 3 1.0 bm25",
    ]
    assert load_trec_run(path) == run
    with pytest.raises(ValidationError):
        write_trec_run(run, path, tag="has space")


def test_load_run_json_inline(tmp_path: Path) -> None:
    data = [{"query": "q text", "hits": [
        {"content": "passage one", "qid": 5, "docid": "11", "rank": 1, "score": 2.0},
        {"content": "passage two", "qid": 5, "docid": "12", "rank": 2, "score": 1.5},
    ]}]
    path = tmp_path / "r.json.gz"
    path.write_bytes(gzip.compress(json.dumps(data).encode()))
    run, docs, queries = load_run_json(path)
    assert run == {"5": {"11": 2.0, "12": 1.5}}
    assert docs["12"] == Document("12", "passage two")
    assert queries == {"5": Query("5", "q text")}


# ---------------------------------------------------------------------------- real data
@needs_nfcorpus
def test_nfcorpus_counts() -> None:
    ds = load_beir_corpus(NFCORPUS)
    assert len(ds) == 3633
    docs = list(iter_beir_documents(NFCORPUS))
    assert len(docs) == 3633 and len({d.doc_id for d in docs}) == 3633
    first = docs[0]
    assert first.doc_id == "MED-10"
    assert first.title == "Statin Use and Breast Cancer Survival: A Nationwide Cohort Study from Finland"
    assert first.text.startswith("Recent studies have suggested that statins")
    assert dict(first.metadata) == {"url": "http://www.ncbi.nlm.nih.gov/pubmed/25329299"}

    queries = load_beir_queries(NFCORPUS)
    assert len(queries) == 3237
    assert queries["PLAIN-2"].text == "Do Cholesterol Statin Drugs Cause Breast Cancer?"
    test = load_beir_qrels(NFCORPUS, "test")
    assert len(test) == 323
    assert sum(len(v) for v in test.values()) == 12334
    grades = [g for v in test.values() for g in v.values()]
    assert grades.count(1) == 11758 and grades.count(2) == 576
    assert test["PLAIN-2"]["MED-2427"] == 2
    assert set(test) <= set(queries)
    ids = {d.doc_id for d in docs}
    assert all(did in ids for v in test.values() for did in v)
    dev = load_beir_qrels(NFCORPUS, "dev")
    assert (len(dev), sum(len(v) for v in dev.values())) == (324, 11385)
    train = load_beir_qrels(NFCORPUS, "train")  # qrels/train.tsv.gz
    assert (len(train), sum(len(v) for v in train.values())) == (2590, 110575)


@needs_dl19
def test_dl19_counts() -> None:
    paths = trec_dl_paths(DL19, "BM25")
    assert paths.topics.name == "topics.dl19-passage.txt"
    assert paths.run_json.name == "retrieve_results_BM25_dl19_top100.json.gz"
    assert paths.trec_run is not None and paths.trec_run.name == "trec_results_BM25_dl19_top100.txt.gz"

    topics = load_trec_topics(paths.topics)
    assert len(topics) == 43
    assert topics["156493"].text == "do goldfish grow"
    qrels = load_trec_qrels(paths.qrels)
    assert set(qrels) == set(topics)
    assert sum(len(v) for v in qrels.values()) == 9260
    grades = [g for v in qrels.values() for g in v.values()]
    assert [grades.count(g) for g in range(4)] == [5158, 1601, 1804, 697]

    run, docs, queries = load_run_json(paths.run_json)
    assert len(run) == 43 and all(len(hits) == 100 for hits in run.values())
    assert set(queries) == set(topics)
    assert queries["264014"].text == "how long is life cycle of flea"
    assert run["264014"]["5611210"] == 15.780599594116211
    assert docs["5611210"].text.startswith("5. Cancel. A flea can live up to a year")
    assert docs["5611210"].title == ""
    assert load_trec_run(paths.trec_run) == run  # the TREC file and the JSON agree exactly


@needs_dl19
def test_trec_dl_paths_unknown_run() -> None:
    with pytest.raises(NotFoundError, match=r"run 'NOPE' not found.*'BM25'.*'SPLADE_P_P_ENSEMBLE_DISTIL'"):
        trec_dl_paths(DL19, "NOPE")

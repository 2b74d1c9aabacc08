"""heedrank.data: BEIR and TREC DL loaders on tiny inline files and on the real data."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from heedrank.data import (
    iter_beir_documents,
    load_beir_corpus,
    load_beir_qrels,
    load_beir_queries,
    load_run_json,
    load_trec_qrels,
    load_trec_run,
    load_trec_topics,
    load_tsv_corpus,
    load_tsv_queries,
    normalize_trec_dl_year,
    noveleval_paths,
    run_name_of,
    trec_dl_paths,
    write_trec_run,
)
from heedrank.errors import NotFoundError, ValidationError
from heedrank.types import Document, Query

DATA = Path("/work/shared/data")
NFCORPUS = DATA / "beir-nfcorpus"
DL19 = DATA / "msmarco-trec-dl-2019-passage"
needs_nfcorpus = pytest.mark.skipif(not NFCORPUS.is_dir(), reason="NFCorpus not available")
needs_dl19 = pytest.mark.skipif(not DL19.is_dir(), reason="TREC DL 2019 not available")


@pytest.fixture(autouse=True)
def _cache_dir(tmp_path_factory, monkeypatch):
    # keep the Arrow cache of `datasets` out of the home directory
    monkeypatch.setenv("HEEDRANK_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


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


# ---------------------------------------------------------------------------- input rules (heedrank.textrules)
def test_corpus_id_with_whitespace_names_the_id_and_the_line(tmp_path: Path) -> None:
    corpus = _write_lines(tmp_path / "c" / "corpus.jsonl", [
        json.dumps({"_id": "d1", "text": "fine"}),
        "",  # Arrow skips blank lines; the reported line still counts them
        json.dumps({"_id": "a b", "text": "the id has a space"}),
    ])
    with pytest.raises(ValidationError) as err:
        list(iter_beir_documents(corpus))
    assert str(err.value) == (
        f"{corpus}:3: document id 'a b' contains whitespace (U+0020 SPACE at character 1); ids must not contain "
        "whitespace or control characters, which TREC run and qrels files cannot carry: rename it (e.g. replace "
        "spaces by '_')"
    )


@pytest.mark.parametrize(("bad_id", "what"), [
    ("d\\u00072", "a control character (U+0007"), ("tab\\tid", "whitespace (U+0009"),
])
def test_corpus_ids_with_control_characters_are_refused(tmp_path: Path, bad_id: str, what: str) -> None:
    corpus = _write_lines(tmp_path / "corpus.jsonl", ['{"_id": "ok", "text": "x"}', '{"_id": "%s", "text": "y"}' % bad_id])
    with pytest.raises(ValidationError, match=rf"corpus\.jsonl:2: document id .* contains {re.escape(what)}"):
        list(iter_beir_documents(corpus))


def test_corpus_with_a_surrogate_names_the_line_and_field(tmp_path: Path) -> None:
    corpus = _write_lines(tmp_path / "corpus.jsonl.gz", [
        json.dumps({"_id": "d1", "text": "fine"}),
        json.dumps({"_id": "d2", "title": "t", "text": "broken \ud800 text"}),  # written as the escape \ud800
    ])
    with pytest.raises(ValidationError) as err:
        load_beir_corpus(corpus)
    assert str(err.value).startswith(
        f"{corpus}:2: document 'd2' field ['text'] contains the unpaired surrogate U+D800 at character 7,")
    row = {"_id": "d1", "text": "x", "metadata": {"k": ["\udc00"]}}
    meta = _write_lines(tmp_path / "m" / "corpus.jsonl", [json.dumps(row)])
    with pytest.raises(ValidationError, match=r"corpus\.jsonl:1: document 'd1' field \['metadata'\]\['k'\]\[0\] contains "
                                              r"the unpaired surrogate U\+DC00"):
        list(iter_beir_documents(meta))


def test_corpus_not_utf8_names_the_line(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_bytes(b'{"_id": "d1", "text": "ok"}\n{"_id": "d2", "text": "caf\xe9"}\n')
    with pytest.raises(ValidationError,
                       match=r"corpus\.jsonl:2: not valid UTF-8 \(invalid continuation byte at byte 26 of the line\)"):
        list(iter_beir_documents(corpus))


def test_queries_refuse_bad_ids_and_text(tmp_path: Path) -> None:
    d = tmp_path / "beir"
    _write_lines(d / "queries.jsonl", [json.dumps({"_id": "q1", "text": "fine"}), json.dumps({"_id": "q 2", "text": "x"})])
    with pytest.raises(ValidationError, match=r"queries\.jsonl:2: query: id 'q 2' contains whitespace"):
        load_beir_queries(d)
    _write_lines(d / "queries.jsonl", [json.dumps({"_id": "q1", "text": "bad \ud800"})])
    with pytest.raises(ValidationError, match=r"queries\.jsonl:1: query 'q1' field \['text'\] contains the unpaired "
                                              r"surrogate U\+D800 at character 4"):
        load_beir_queries(d)
    _write_lines(d / "queries.jsonl", ['{"_id": "q1", "text": "fine"}', "not json"])
    with pytest.raises(ValidationError, match=r"queries\.jsonl:2: not valid JSON"):
        load_beir_queries(d)


def test_topics_refuse_ids_with_spaces(tmp_path: Path) -> None:
    topics = _write_lines(tmp_path / "topics.txt", ["1\tfine", "2 3\tid with a space"])
    with pytest.raises(ValidationError, match=r"topics\.txt:2: query: id '2 3' contains whitespace"):
        load_trec_topics(topics)
    topics.write_bytes(b"\xef\xbb\xbf1\tbom first\n")  # a UTF-8 byte-order mark is not part of the id
    assert load_trec_topics(topics) == {"1": Query("1", "bom first")}


def test_run_json_refuses_bad_ids(tmp_path: Path) -> None:
    data = [{"query": "q", "hits": [{"content": "p", "qid": 5, "docid": "a b", "rank": 1, "score": 2.0}]}]
    path = tmp_path / "r.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValidationError, match=r"r\.json: entry 0 hit 0: document: id 'a b' contains whitespace"):
        load_run_json(path)
    data[0]["hits"][0].update(docid="a", content="bad \udfff")
    path.write_text(json.dumps(data))
    with pytest.raises(ValidationError, match=r"entry 0 hit 0: content: contains the unpaired surrogate U\+DFFF"):
        load_run_json(path)


@pytest.mark.parametrize(("run", "needle"), [
    ({"q1": {"a b": 1.0}}, "query 'q1': document id 'a b' contains whitespace"),
    ({"q1": {"ok": 1.0, "x\ty": 0.5}}, "query 'q1': document id 'x\\ty' contains whitespace"),
    ({"q 1": {"a": 1.0}}, "query: id 'q 1' contains whitespace"),
    ({"q1": {"\x00": 1.0}}, "document id '\\x00' contains a control character"),
    ({"q1": {"": 1.0}}, "document id is empty"),
])
def test_write_trec_run_refuses_ids_a_run_line_cannot_carry(tmp_path: Path, run, needle: str) -> None:
    path = tmp_path / "out" / "run.trec"
    with pytest.raises(ValidationError) as err:
        write_trec_run(run, path, tag="t")
    assert needle in str(err.value) and str(path) in str(err.value)
    assert not path.exists()  # nothing half-written


@pytest.mark.parametrize("name", ["run.trec", "run.trec.gz"])
def test_trec_run_round_trip_with_unusual_ids_and_scores(tmp_path: Path, name: str) -> None:
    run = {
        "PLAIN-2": {"MED-10": 1 / 3, "pmc/123": -0.5, "naïve#1": 1e-300, "東京": 12345.678},
        "9": {"0": 0.0, "007": 2.5},
    }
    path = tmp_path / name
    write_trec_run(run, path, tag="heedrank-icr-c20")
    assert load_trec_run(path) == run  # ids and float scores exactly
    text = (gzip.open(path, "rt", encoding="utf-8") if name.endswith(".gz") else open(path, encoding="utf-8")).read()
    assert all(len(line.split()) == 6 for line in text.splitlines())
    assert text.splitlines()[0] == "9 Q0 007 1 2.5 heedrank-icr-c20"


# ---------------------------------------------------------------------------- TREC DL years and namings
RUN_JSON = [{"query": "run text of q1", "hits": [
    {"content": "first passage", "qid": "q1", "docid": "p1", "rank": 1, "score": 3.0},
    {"content": "second passage", "qid": "q1", "docid": "p2", "rank": 2, "score": 2.0},
]}]


def _dl_folder(root: Path, topics: str, qrels: str, run: str, trec_run: str | None = None) -> Path:
    _write_lines(root / topics, ["q1\tofficial text of q1"])
    _write_lines(root / qrels, ["q1 0 p2 2", "q1 0 p1 0"])
    data = json.dumps(RUN_JSON).encode()
    (root / run).write_bytes(gzip.compress(data) if run.endswith(".gz") else data)
    if trec_run:
        _write_lines(root / trec_run, ["q1 Q0 p1 1 3.0 bm25", "q1 Q0 p2 2 2.0 bm25"])
    return root


@pytest.mark.parametrize(
    ("year", "topics", "qrels", "run"),
    [
        ("dl19", "topics.dl19-passage.txt", "qrels.dl19-passage.txt", "retrieve_results_BM25_dl19_top100.json.gz"),
        ("dl20", "topics.dl20.txt", "qrels.dl20-passage.txt", "retrieve_results_BM25_dl20_top100.json"),
        ("dl21", "topics.dl21.txt", "qrels.dl21-passage.txt", "retrieve_results_BM25_dl21_top100.json.gz"),
        ("dl22", "topics.dl22.txt.gz", "qrels.dl22.txt", "retrieve_results_BM25_dl22_top100.json"),
        ("dl23", "topics.dl23-passage.txt.gz", "qrels.dl23-passage.txt.gz", "retrieve_results_BM25_dl23_top100.json"),
    ],
)
def test_trec_dl_paths_of_every_naming(tmp_path: Path, year, topics, qrels, run) -> None:
    d = _dl_folder(tmp_path / "dl", topics, qrels, run, f"trec_results_BM25_{year}_top100.txt")
    paths = trec_dl_paths(d)  # year detected from the names
    assert paths == trec_dl_paths(d, "BM25", year=year) == trec_dl_paths(d, year="20" + year[2:])
    assert (paths.topics.name, paths.qrels.name, paths.run_json.name) == (topics, qrels, run)
    assert paths.trec_run is not None and paths.trec_run.name == f"trec_results_BM25_{year}_top100.txt"
    assert paths.year == year
    assert load_trec_topics(paths.topics) == {"q1": Query("q1", "official text of q1")}
    assert load_trec_qrels(paths.qrels) == {"q1": {"p2": 2, "p1": 0}}


def test_trec_dl_folder_with_two_years_needs_a_year(tmp_path: Path) -> None:
    d = _dl_folder(tmp_path, "topics.dl20.txt", "qrels.dl20-passage.txt", "retrieve_results_BM25_dl20_top100.json")
    _dl_folder(d, "topics.dl21.txt", "qrels.dl21-passage.txt", "retrieve_results_BM25_dl21_top100.json")
    with pytest.raises(ValidationError, match=r"several TREC DL years \(dl20, dl21\); choose one with --year"):
        trec_dl_paths(d)
    assert trec_dl_paths(d, year="2021").topics.name == "topics.dl21.txt"
    assert trec_dl_paths(d, year="DL20").topics.name == "topics.dl20.txt"
    with pytest.raises(ValidationError, match="TREC DL year 'twenty' is not one of the forms"):
        trec_dl_paths(d, year="twenty")
    with pytest.raises(NotFoundError, match=r"topics and qrels for dl22 not found"):
        trec_dl_paths(d, year=22)


def test_trec_dl_explicit_paths(tmp_path: Path) -> None:
    _dl_folder(tmp_path, "my-topics.tsv", "judgements.txt", "bm25-run.json")
    paths = trec_dl_paths(None, topics=tmp_path / "my-topics.tsv", qrels=tmp_path / "judgements.txt",
                          run_file=tmp_path / "bm25-run.json")
    assert (paths.topics.name, paths.qrels.name, paths.run_json.name, paths.trec_run, paths.year) == (
        "my-topics.tsv", "judgements.txt", "bm25-run.json", None, None)
    with pytest.raises(ValidationError, match="give the TREC DL folder"):
        trec_dl_paths(None, topics=tmp_path / "my-topics.tsv")
    with pytest.raises(NotFoundError, match="no TREC DL files found in"):
        trec_dl_paths(tmp_path)  # none of the recognised names
    # an explicit file replaces the one of the folder; the year comes from the folder's names
    d = _dl_folder(tmp_path / "dl", "topics.dl20.txt", "qrels.dl20-passage.txt", "retrieve_results_BM25_dl20_top100.json")
    mixed = trec_dl_paths(d, qrels=tmp_path / "judgements.txt")
    assert (mixed.topics.name, mixed.qrels, mixed.year) == ("topics.dl20.txt", tmp_path / "judgements.txt", "dl20")
    with pytest.raises(NotFoundError, match="TREC DL file not found"):
        trec_dl_paths(d, qrels=tmp_path / "missing.txt")


def test_a_dev_tag_folder_is_found_by_its_names(tmp_path: Path) -> None:
    # msmarco-passage-dev-600's names: a dev<N> tag, topics .tsv, top-20 runs
    d = _dl_folder(tmp_path / "dev", "topics.dev600.tsv", "qrels.dev600.txt", "retrieve_results_BM25_dev600_top20.json.gz",
                   "trec_results_BM25_dev600_top20.txt.gz")
    _write_lines(d / "qrels.dev600-graded-assessors.tsv", ["q1\tp1\t5"])  # not a TREC qrels name: ignored
    paths = trec_dl_paths(d)
    assert paths == trec_dl_paths(d, year="DEV600")
    assert (paths.year, paths.topics.name, paths.qrels.name) == ("dev600", "topics.dev600.tsv", "qrels.dev600.txt")
    assert paths.run_json.name == "retrieve_results_BM25_dev600_top20.json.gz"
    assert paths.trec_run is not None and paths.trec_run.name == "trec_results_BM25_dev600_top20.txt.gz"
    assert run_name_of(paths.run_json) == "BM25" and run_name_of(tmp_path / "mine.json.gz") == "mine"
    assert normalize_trec_dl_year("dev600") == "dev600" and normalize_trec_dl_year(2019) == "dl19"
    # of one run at two depths the deepest is taken
    (d / "retrieve_results_BM25_dev600_top50.json").write_text(json.dumps(RUN_JSON))
    assert trec_dl_paths(d).run_json.name == "retrieve_results_BM25_dev600_top50.json"
    with pytest.raises(NotFoundError, match=r"run 'NOPE' not found .* available runs: \['BM25'\]"):
        trec_dl_paths(d, "NOPE")


def test_noveleval_tsv_files_are_read_as_csv(tmp_path: Path) -> None:
    d = tmp_path / "nov"
    assert noveleval_paths(tmp_path) is None
    _write_lines(d / "queries.tsv", ["0\tWho won?", "1\tWhere was it held? "])
    # pandas' quoting: a field with a tab or a quote is quoted, its quotes doubled
    _write_lines(d / "corpus.tsv", ['0-0\t"""Quoted"" start"', '0-1\t"a\ttable\trow"', "1-0\tplain text"])
    _write_lines(d / "qrels.txt", ["0 Q0 0-0 2"])
    paths = noveleval_paths(d)
    assert paths is not None and paths.corpus.name == "corpus.tsv"
    assert load_tsv_queries(paths.queries) == {"0": Query("0", "Who won?"), "1": Query("1", "Where was it held?")}
    docs = load_tsv_corpus(paths.corpus)
    assert [docs[k].text for k in ("0-0", "0-1", "1-0")] == ['"Quoted" start', "a\ttable\trow", "plain text"]
    _write_lines(d / "bad.tsv", ["0-0\ttext\tmore"])
    with pytest.raises(ValidationError, match=r"bad.tsv:1: expected 'id<TAB>text', got 3 fields"):
        load_tsv_corpus(d / "bad.tsv")
    _write_lines(d / "ids.tsv", ["0 0\ttext"])
    with pytest.raises(ValidationError, match=r"ids.tsv:1: document: id"):
        load_tsv_corpus(d / "ids.tsv")
    with pytest.raises(NotFoundError, match="TSV corpus file not found"):
        load_tsv_corpus(d / "missing.tsv")


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

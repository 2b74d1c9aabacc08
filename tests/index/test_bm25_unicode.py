"""BM25's Unicode analysis: text that is the same to a reader but not in bytes
gives the same tokens at index and query time (NFKC, case folding, zero-width characters and
soft hyphens removed); the analyzer version is recorded in the index params; an index built
with the older analyzer still answers as it did, says how to upgrade, and is upgraded by
compaction; an unknown version is refused naming the rebuild command."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from heedrank.errors import IndexMismatchError
from heedrank.index.bm25 import ANALYZER_FILE, ANALYZER_VERSION, Analyzer, BM25Params
from heedrank.index.builder import build_index
from heedrank.index.store import Index
from heedrank.retriever.bm25 import BM25Retriever
from heedrank.textrules import fold_text, is_blank
from heedrank.types import Document, Query

NFC, NFD = "caf\u00e9", "cafe\u0301"
# (what a document says, how a query spells the same word)
VARIANTS = [
    (NFC, NFD),  # NFD query, NFC document
    (NFD, NFC),  # and the other way round
    ("apple", "\uff41\uff50\uff50\uff4c\uff45"),  # full-width letters
    ("\uff21\uff30\uff30\uff2c\uff25", "apple"),
    ("vitamin", "vita\u200bmin"),  # a zero-width space inside the word
    ("vita\u200bmin", "vitamin"),
    ("vitamin", "vita\u00admin"),  # a soft hyphen
    ("fish", "\ufb01sh"),  # the "fi" ligature
    ("\ufb01sh", "fish"),
    ("strasse", "Stra\u00dfe"),  # case folding: sharp s
    ("word", "wo\u200d\u2060rd\ufeff"),  # zero-width joiner, word joiner, byte order mark
]


@pytest.mark.parametrize(("doc", "query"), VARIANTS)
def test_same_to_a_reader_same_tokens(doc, query):
    a = Analyzer()
    assert a([doc]) == a([query]) and a([doc])[0]


@pytest.mark.parametrize(("doc", "query"), VARIANTS)
def test_variants_find_the_document(doc, query):
    docs = [Document("hit", f"notes on {doc} today", ""), Document("other", "nothing relevant here at all", "")]
    index = Index.from_documents(docs)
    (ranking,) = BM25Retriever.from_index(index).retrieve([Query("q", query)], 5)
    assert ranking.doc_ids == ["hit"]


def test_fold_text_and_blank():
    assert fold_text("The Caf\u00e9") == fold_text("THE CAFE\u0301") == "the caf\u00e9"
    assert fold_text("\u00bd") == "1\u20442"  # compatibility forms become plain characters
    assert fold_text("ABC", casefold=False) == "ABC"
    assert is_blank("\u200b\u200b") and is_blank(" \u00ad\n\ufeff ") and is_blank("")
    assert not is_blank("\u200ba") and not is_blank("!")


def test_the_version_is_recorded_in_the_index_params(tmp_path: Path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"_id": "d1", "title": "", "text": f"a {NFC} review"}) + "\n", encoding="utf-8")
    params = build_index(corpus, tmp_path / "ix", dense=False, show_progress=False)
    assert ANALYZER_VERSION == 2
    assert params["bm25"]["tokenization"]["analyzer_version"] == ANALYZER_VERSION
    assert "NFKC" in params["bm25"]["tokenization"]["unicode"]
    saved = json.loads((tmp_path / "ix" / "bm25" / ANALYZER_FILE).read_text())
    assert saved["analyzer_version"] == ANALYZER_VERSION
    ix = Index.open(tmp_path / "ix")
    try:
        assert ix.describe()["bm25"]["analyzer_version"] == ANALYZER_VERSION
    finally:
        ix.close()


def _legacy_index(tmp_path: Path) -> Path:
    """An index as heedrank wrote it before the analyzer had a version (lower-casing only)."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in [
        {"_id": "d1", "title": "", "text": f"a {NFC} review"},
        {"_id": "d2", "title": "", "text": "tea and coffee"},
    ]), encoding="utf-8")
    out = tmp_path / "ix"
    build_index(corpus, out, dense=False, show_progress=False, bm25_params=BM25Params(analyzer_version=1))
    for path in (out / "bm25" / ANALYZER_FILE,):
        data = json.loads(path.read_text())
        del data["analyzer_version"]
        path.write_text(json.dumps(data))
    params = json.loads((out / "params.json").read_text())
    for key in ("analyzer_version", "unicode"):
        del params["bm25"]["tokenization"][key]
    (out / "params.json").write_text(json.dumps(params))
    return out


def _hits(ix: Index, text: str) -> list[str]:
    (ranking,) = BM25Retriever.from_index(ix).retrieve([Query("q", text)], 5)
    return ranking.doc_ids


def test_an_index_of_the_old_analyzer_answers_as_before_and_says_how_to_upgrade(tmp_path: Path, caplog):
    out = _legacy_index(tmp_path)
    with caplog.at_level(logging.WARNING, logger="heedrank.index.store"):
        ix = Index.open(out)
    try:
        warning = " ".join(r.getMessage() for r in caplog.records)
        assert "analyzer version 1" in warning and f"heedrank index compact {out}" in warning
        assert ix.bm25.params.analyzer_version == 1 and ix.describe()["bm25"]["analyzer_version"] == 1
        assert _hits(ix, NFC) == ["d1"] and _hits(ix, NFD) == []  # as it answered before: no folding
        ix.compact()  # the upgrade: BM25 rebuilt with the current analyzer
        assert ix.bm25.params.analyzer_version == ANALYZER_VERSION
        assert _hits(ix, NFD) == ["d1"] and _hits(ix, "TEA") == ["d2"]
    finally:
        ix.close()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="heedrank.index.store"):
        again = Index.open(out)
    try:
        assert again.bm25.params.analyzer_version == ANALYZER_VERSION and _hits(again, NFD) == ["d1"]
        assert json.loads((out / "params.json").read_text())["bm25"]["tokenization"]["analyzer_version"] == 2
    finally:
        again.close()
    assert not [r for r in caplog.records if "analyzer version" in r.getMessage()]


def test_an_unknown_analyzer_version_is_refused_with_the_rebuild_command(tmp_path: Path):
    out = _legacy_index(tmp_path)
    path = out / "bm25" / ANALYZER_FILE
    path.write_text(json.dumps({**json.loads(path.read_text()), "analyzer_version": 99}))
    with pytest.raises(IndexMismatchError) as err:
        Index.open(out)
    assert "analyzer version 99" in str(err.value) and "heedrank index build" in str(err.value)
    assert err.value.status_code == 409

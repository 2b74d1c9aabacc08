"""Weak labels (issue #24 lever 2): the leak guard drops pseudo-queries that are protected
queries, the folder is a BEIR folder that links (never copies) the corpus, and the first-stage
filter keeps the lists whose positive ranks high. Tiny inline data."""

from __future__ import annotations

import json

import numpy as np
import pytest

from heedrank.errors import ValidationError
from heedrank.eval.weak_labels import (
    PseudoQuery,
    clean_generation,
    first_stage_filter,
    guard,
    judged_documents,
    sample_documents,
    title_queries,
    write_folder,
)
from heedrank.types import Document


def test_guard_drops_near_copies_of_protected_queries() -> None:
    pseudo = [
        PseudoQuery("a", "Vitamin D and breast cancer", "d1"),         # a protected query, reworded case/punctuation
        PseudoQuery("b", "vitamin D, breast cancer risk", "d2"),       # 4 of 6 words shared: Jaccard 0.67
        PseudoQuery("c", "statins and muscle pain in older adults", "d3"),
        PseudoQuery("d", "!!!", "d4"),                                 # no words at all
    ]
    kept, dropped = guard(pseudo, ["vitamin d and breast cancer", "fish oil"], max_jaccard=0.6)
    assert [p.query_id for p in kept] == ["c"]
    assert [p.query_id for p in dropped] == ["a", "b", "d"]
    kept, _ = guard(pseudo, ["vitamin d and breast cancer"], max_jaccard=1.0)  # only exact word sets
    assert [p.query_id for p in kept] == ["b", "c"]
    with pytest.raises(ValidationError, match="max_jaccard"):
        guard(pseudo, [], max_jaccard=0.0)


def test_title_queries_and_generation_cleanup() -> None:
    docs = [Document("d1", "body one", "A  title\nwith breaks"), Document("d2", "body two", "  ")]
    assert title_queries(docs) == [PseudoQuery("TITLE-d1", "A title with breaks", "d1")]
    assert clean_generation('"What is the role of antioxidants?"\nExplanation: ...') == \
        "What is the role of antioxidants?"
    assert clean_generation(" ".join(["w"] * 40), max_words=5) == "w w w w w"
    assert clean_generation("\n") == ""


def test_sample_documents_is_seeded_and_excludes() -> None:
    docs = [Document(f"d{i}", "x") for i in range(20)]
    a = sample_documents(docs, 5, seed=3, exclude_docs={"d0", "d1"})
    assert a == sample_documents(docs, 5, seed=3, exclude_docs={"d0", "d1"}) and len(a) == 5
    assert not {"d0", "d1"} & {d.doc_id for d in a}
    assert [d.doc_id for d in a] == sorted((d.doc_id for d in a), key=lambda s: int(s[1:]))  # corpus order
    assert len(sample_documents(docs, None, exclude_docs={"d3"})) == 19
    assert judged_documents({"dev": {"q1": {"d1": 1}}, "test": {"q2": {"d2": 2, "d1": 1}}}) == {"d1", "d2"}


def test_write_folder_links_the_corpus(tmp_path) -> None:
    corpus = tmp_path / "corpus.jsonl.gz"
    corpus.write_bytes(b"not read")
    out = write_folder(tmp_path / "weak", [PseudoQuery("GEN-d1", "what is x?", "d1")], corpus, "readme")
    assert json.loads((out / "queries.jsonl").read_text()) == {"_id": "GEN-d1", "text": "what is x?"}
    assert (out / "qrels" / "train.tsv").read_text().splitlines() == ["query-id\tcorpus-id\tscore", "GEN-d1\td1\t1"]
    assert (out / "corpus.jsonl.gz").is_symlink() and (out / "corpus.jsonl.gz").resolve() == corpus.resolve()
    write_folder(tmp_path / "weak", [], corpus, "again")  # a rerun replaces the link
    assert (out / "README").read_text() == "again\n"


def test_first_stage_filter_keeps_lists_with_a_high_positive() -> None:
    from heedrank.eval.study import QueryItem

    def item(qid, labels):
        return QueryItem(qid, [f"d{i}" for i in range(len(labels))], np.zeros(len(labels)), np.asarray(labels), {})

    items = [item("hit", [0, 1, 0, 0]), item("deep", [0, 0, 0, 1]), item("none", [0, 0, 0, 0])]
    assert [it.query_id for it in first_stage_filter(items, 2)] == ["hit"]
    assert [it.query_id for it in first_stage_filter(items, 4)] == ["hit", "deep"]

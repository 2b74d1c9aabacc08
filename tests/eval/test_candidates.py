"""Candidate lists for training: a TREC DL folder without qrels, graded by a teacher run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from heedrank.errors import NotFoundError
from heedrank.eval.candidates import teacher_qrels, trec_dl_candidates


def _run(path: Path, lists: dict[str, list[str]]) -> None:
    path.write_text(json.dumps([
        {"query": f"text of {qid}", "hits": [
            {"content": f"passage {d}", "qid": qid, "docid": d, "rank": r, "score": 100.0 - r}
            for r, d in enumerate(docs, 1)]}
        for qid, docs in lists.items()]))


def test_teacher_grades_follow_its_ranks():
    run = {"q": {f"d{i:02d}": 50.0 - i for i in range(1, 26)}}
    grades = teacher_qrels(run)["q"]
    assert [grades[f"d{i:02d}"] for i in (1, 3, 4, 10, 11, 20)] == [3, 3, 2, 2, 1, 1]
    assert "d21" not in grades and len(grades) == 20
    # ties ordered by doc id, as every run in the project
    assert teacher_qrels({"q": {"b": 1.0, "a": 1.0}}, ((1, 2),))["q"] == {"a": 2}


def test_an_unlabelled_year_is_graded_by_its_teacher(tmp_path):
    (tmp_path / "topics.dl22.txt").write_text("1\tfirst\n2\tsecond\n")
    _run(tmp_path / "retrieve_results_BM25_dl22_top100.json", {"1": ["a", "b", "c"], "2": ["x", "y"]})
    _run(tmp_path / "retrieve_results_SPLADE_dl22_top100.json", {"1": ["c", "z", "a"], "2": ["y"]})
    queries, cands, scores, qrels = trec_dl_candidates(tmp_path, run_name="BM25", candidates=2, teacher="SPLADE")
    assert [q.query_id for q in queries] == ["1", "2"]
    assert [d.doc_id for d in cands["1"]] == ["a", "b"] and scores["1"] == [99.0, 98.0]
    assert qrels == {"1": {"c": 3, "z": 3, "a": 3}, "2": {"y": 3}}
    with pytest.raises(NotFoundError, match="available runs"):
        trec_dl_candidates(tmp_path, run_name="BM25", candidates=2, teacher="RM3")
    with pytest.raises(NotFoundError, match="qrels"):  # without a teacher the NIST qrels are needed
        trec_dl_candidates(tmp_path, run_name="BM25", candidates=2)

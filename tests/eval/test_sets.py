"""heedrank.eval.sets: candidate-list sets recognised by their folders (TREC DL, an MS MARCO dev
sample, NovelEval), their relevance levels and folds; tiny inline folders, then the real ones
(loading only, no model)."""

from __future__ import annotations

import hashlib
import json

import pytest

from set_folders import dev_folder, noveleval_folder, write

from heedrank.errors import NotFoundError, ValidationError
from heedrank.eval.metrics import evaluate_run, relevance_level
from heedrank.eval.sets import (
    NOVELEVAL_RUNS,
    SET_KINDS,
    candidate_set_kind,
    load_candidate_set,
    seeded_folds,
)


# ---------------------------------------------------------------------------- kinds and folds
def test_each_kind_s_binary_measures_use_its_relevance_level():
    assert {k: v.min_relevant for k, v in SET_KINDS.items()} == {"trec-dl": 2, "msmarco-dev": 1, "noveleval": 1}
    for kind in SET_KINDS.values():
        levels = {relevance_level(m) for m in kind.metrics} - {None}
        assert levels == {kind.min_relevant}, kind.name
        assert kind.metrics[0] == "nDCG@10"


def test_seeded_folds_are_a_quarter_of_judged_queries_and_fixed():
    ids = [f"q{i}" for i in range(40)]
    judged = ids[:30]
    folds = seeded_folds(reversed(ids), judged)  # input order does not matter
    assert len(folds["test"]) == 10 and len(folds["train"]) == 30
    assert set(folds["test"]) <= set(judged) and not set(folds["test"]) & set(folds["train"])
    assert sorted(folds["test"] + folds["train"]) == sorted(ids)
    assert folds == seeded_folds(ids, judged, seed=0)
    assert seeded_folds(ids, judged, seed=1)["test"] != folds["test"]
    # the hash picks them: the 10 judged ids whose sha256("0:<qid>") is smallest
    expect = sorted(judged, key=lambda q: hashlib.sha256(f"0:{q}".encode()).hexdigest())[:10]
    assert folds["test"] == sorted(expect)
    with pytest.raises(ValidationError, match="a test fold of 10 judged queries is needed, and only 3"):
        seeded_folds(ids, judged[:3])


# ---------------------------------------------------------------------------- inline folders
def test_a_dev_tagged_folder_loads_by_name_with_its_folds(tmp_path):
    d = dev_folder(tmp_path / "dev")
    assert candidate_set_kind(d) == "msmarco-dev"
    everything = load_candidate_set(d, split="all")
    assert (everything.name, everything.kind.name, everything.run_name, everything.split) == ("dev8", "msmarco-dev",
                                                                                               "BM25", "all")
    assert len(everything.queries) == 8 and len(everything.qrels) == 6 and len(everything.docs) == 16
    test, train = load_candidate_set(d, split="test"), load_candidate_set(d)
    assert train.split == "test" == test.split  # the default is the test fold
    train = load_candidate_set(d, split="train")
    assert len(test.queries) == 2 and len(train.queries) == 6
    assert all(test.qrels.get(q) for q in test.queries)
    assert set(test.qrels) == set(test.queries) and len(train.qrels) == 4  # a fold's judgements only
    assert sorted([*test.queries, *train.queries]) == sorted(everything.queries)
    assert set(everything.files) == {"topics", "qrels", "run_json"}
    # grade 1 is relevant: the positive second in every list gives RR 0.5 (RR(rel=2) would give 0)
    ev = evaluate_run(everything.run, everything.qrels, everything.kind.metrics)
    assert ev.aggregate["RR@10"] == pytest.approx(0.5) and ev.aggregate["R@10"] == 1.0
    with pytest.raises(ValidationError, match="unknown split 'dev'"):
        load_candidate_set(d, split="dev")


def test_noveleval_folder_loads_with_both_first_stages(tmp_path):
    d = noveleval_folder(tmp_path / "noveleval")
    assert candidate_set_kind(d) == "noveleval"
    bm25 = load_candidate_set(d)
    assert (bm25.name, bm25.kind.name, bm25.run_name, bm25.split) == ("noveleval", "noveleval", "BM25", "test")
    assert bm25.docs["0-1"].text == 'the cup was won by "Rovers"\tin extra time'  # CSV quoting undone
    assert set(bm25.run) == {"0", "1"} and set(bm25.run["0"]) == {"0-0", "0-1", "0-2"}
    # BM25 over each question's own passages: the passage naming the summit first
    assert max(bm25.run["1"], key=bm25.run["1"].__getitem__) == "1-0"
    assert bm25.run["0"]["0-0"] == 0.0  # no query term
    web = load_candidate_set(d, "web")
    assert web.run == {"0": {"0-0": 3.0, "0-1": 2.0, "0-2": 1.0}, "1": {"1-0": 3.0, "1-1": 2.0, "1-2": 1.0}}
    assert load_candidate_set(d, split="all").queries == bm25.queries
    with pytest.raises(ValidationError, match="noveleval has no train fold"):
        load_candidate_set(d, split="train")
    with pytest.raises(NotFoundError, match=r"run 'SPLADE' not found for NovelEval; available runs: \['BM25', 'web'\]"):
        load_candidate_set(d, "SPLADE")
    with pytest.raises(ValidationError, match="--year, --qrels apply to TREC DL-layout folders"):
        load_candidate_set(d, year="dl19", qrels=d / "qrels.txt")


def test_noveleval_passage_of_no_question_is_refused(tmp_path):
    d = noveleval_folder(tmp_path / "nov")
    write(d / "corpus.tsv", "0-0\ttext\n7-0\tstray\n")
    with pytest.raises(ValidationError, match="passage '7-0' names no question"):
        load_candidate_set(d)


def test_a_dl_year_keeps_grade_2_and_has_no_train_fold(tmp_path):
    d = tmp_path / "dl"
    write(d / "topics.dl20.txt", "q1\ttext\n")
    write(d / "qrels.dl20-passage.txt", "q1 0 p1 1\n")
    write(d / "retrieve_results_BM25_dl20_top100.json", json.dumps(
        [{"query": "text", "hits": [{"content": "c", "qid": "q1", "docid": "p1", "rank": 1, "score": 1.0}]}]))
    cs = load_candidate_set(d, split="all")
    assert (cs.kind.name, cs.kind.min_relevant, cs.split) == ("trec-dl", 2, "test")
    with pytest.raises(ValidationError, match="dl20 has no train fold"):
        load_candidate_set(d, split="train")
    assert candidate_set_kind(tmp_path) is None and candidate_set_kind(tmp_path / "missing") is None


# ---------------------------------------------------------------------------- real data
def test_dev600_loads_with_its_fixed_folds(dev600_dir):
    cs = load_candidate_set(dev600_dir, split="all")
    assert (cs.name, cs.kind.name, cs.kind.min_relevant) == ("dev600", "msmarco-dev", 1)
    assert len(cs.queries) == 600 and len(cs.qrels) == 540 and sum(len(v) for v in cs.run.values()) == 12000
    assert {g for v in cs.qrels.values() for g in v.values()} == {1}
    assert cs.queries["9083"].text == "____________________ is considered the father of modern medicine."
    assert cs.run["9083"]["7067274"] == 20.0  # score = 21 - rank
    test = load_candidate_set(dev600_dir, split="test")
    train = load_candidate_set(dev600_dir, split="train")
    assert (len(test.queries), len(train.queries)) == (150, 450)
    assert sum(1 for q in train.queries if cs.qrels.get(q)) == 390 and all(cs.qrels.get(q) for q in test.queries)
    # pinned: a later training run and evaluation must see these very folds
    assert sorted(test.queries)[:3] == ["1000170", "1007696", "1008911"]
    assert hashlib.sha256("\n".join(sorted(test.queries)).encode()).hexdigest()[:16] == "af0e5490d002b38a"
    ev = evaluate_run(test.run, test.qrels, test.kind.metrics, query_ids=test.queries)
    assert len(ev.query_ids) == 150
    assert ev.aggregate["nDCG@10"] == pytest.approx(0.498092, abs=1e-6)
    assert ev.aggregate["RR@10"] == pytest.approx(0.395802, abs=1e-6)


def test_noveleval_loads_and_its_bm25_is_near_the_published_figure(noveleval_dir):
    figures = {}
    for run in NOVELEVAL_RUNS:
        cs = load_candidate_set(noveleval_dir, run)
        assert len(cs.queries) == 21 and len(cs.docs) == 420 and all(len(v) == 20 for v in cs.run.values())
        figures[run] = evaluate_run(cs.run, cs.qrels, cs.kind.metrics).aggregate
    grades = [g for v in cs.qrels.values() for g in v.values()]
    assert [grades.count(g) for g in range(3)] == [290, 40, 90]
    assert cs.queries["2"].text == "Which film was the 2023 Palme d'Or winner?"
    assert cs.docs["14-17"].text.startswith("Top earning footballers June/July 2023 Player\tClub\t")
    # the source's README: BM25 nDCG@10 55.77 (its BM25 over the 20 passages); here the index's BM25
    assert figures["BM25"]["nDCG@10"] == pytest.approx(0.562211, abs=1e-6)
    assert figures["web"]["nDCG@10"] == pytest.approx(0.650262, abs=1e-6)
    assert figures["web"]["RR@10"] == pytest.approx(0.776984, abs=1e-6)

"""heedrank.lab.candidates.trec_dl_candidates on the candidate-list sets: folds and first stages
(tiny inline folders of tests/set_folders.py)."""

from __future__ import annotations

from set_folders import dev_folder, noveleval_folder

from heedrank.eval.sets import load_candidate_set
from heedrank.lab.candidates import trec_dl_candidates


def test_candidates_of_a_fold_are_its_judged_queries_in_first_stage_order(tmp_path):
    d = dev_folder(tmp_path / "dev")
    queries, cands, scores, qrels = trec_dl_candidates(d, run_name="BM25", candidates=1, split="train")
    assert [q.query_id for q in queries] == sorted(q for q in load_candidate_set(d, split="train").queries if q in qrels)
    assert all(len(c) == 1 and c[0].doc_id.endswith("-neg") for c in cands.values())
    assert all(s == [20.0] for s in scores.values())
    every, *_ = trec_dl_candidates(d, run_name=None, candidates=2)  # split all, run BM25
    assert len(every) == 6


def test_noveleval_candidates_by_run(tmp_path):
    d = noveleval_folder(tmp_path / "noveleval")
    queries, cands, _, _ = trec_dl_candidates(d, run_name="web", candidates=2)
    assert [q.query_id for q in queries] == ["0", "1"]
    assert [doc.doc_id for doc in cands["0"]] == ["0-0", "0-1"]

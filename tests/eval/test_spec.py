"""EvalSpec: one record for ``eval beir`` and ``eval trec-dl``, the one argument of
``evaluate_beir`` / ``evaluate_trec_dl``."""

from __future__ import annotations

import json

import pytest

from heedrank.config import RerankerConfig
from heedrank.data import load_trec_run
from heedrank.errors import ValidationError
from heedrank.eval.spec import EvalSpec
from heedrank.eval.trecdl import evaluate_trec_dl


def test_spec_writes_its_report(dl19_dir, tmp_path, fake_reranker):
    spec = EvalSpec(dl19_dir, run_name="BM25", rerank="fake", candidates=5, max_queries=3, seed=1, fusion=0.5,
                    reranker_config=RerankerConfig(max_doc_tokens=64), out_dir=tmp_path, show_progress=False)
    by_spec = evaluate_trec_dl(spec)
    assert by_spec.name == "msmarco-trec-dl-2019-passage-dl19-BM25-fake-c5-f0.5-t64-q3-s1"
    assert sorted(by_spec.per_query) == sorted(by_spec.query_ids) and len(by_spec.query_ids) == 3
    assert by_spec.params["fusion"] == 0.5
    assert sorted(load_trec_run(tmp_path / f"{by_spec.name}.trec")) == sorted(by_spec.query_ids)
    report = json.loads((tmp_path / f"{by_spec.name}.json").read_text())
    assert report["params"]["metrics"] == list(by_spec.params["metrics"]) and "engine" not in report["params"]


def test_fields_of_the_other_dataset_are_refused():
    EvalSpec("d", split="dev", keep_identical_ids=True).check_for("beir")
    with pytest.raises(ValidationError, match=r"run_name, year apply to eval trec-dl only"):
        EvalSpec("d", run_name="BM25", year="dl19").check_for("beir")
    with pytest.raises(ValidationError, match=r"retriever apply to eval beir only"):
        EvalSpec("d", retriever="dense").check_for("trec-dl")
    EvalSpec("d", split="train").check_for("trec-dl")  # a candidate set's fold (eval.sets)
    EvalSpec(None, topics="t", qrels="q", run_file="r").check_for("trec-dl")


def test_spec_is_frozen_and_knows_its_fields():
    spec = EvalSpec("d", rerank="icr")
    assert spec == EvalSpec(data_dir="d", rerank="icr") and spec.reranking and not EvalSpec("d").reranking
    with pytest.raises(TypeError):
        EvalSpec("d", no_such_field=1)
    with pytest.raises(AttributeError):
        spec.seed = 3  # frozen

"""EvalSpec: one record for ``eval beir`` and ``eval trec-dl``; the keyword form of
``evaluate_beir`` / ``evaluate_trec_dl`` is the same evaluation."""

from __future__ import annotations

import json

import pytest

from heedrank.config import RerankerConfig
from heedrank.errors import ValidationError
from heedrank.eval.spec import EvalSpec, as_spec
from heedrank.eval.trecdl import evaluate_trec_dl


def test_spec_and_keyword_form_write_the_same_report(dl19_dir, tmp_path, fake_reranker):
    kw = dict(run_name="BM25", rerank="fake", candidates=5, max_queries=3, seed=1, fusion=0.5,
              reranker_config=RerankerConfig(max_doc_tokens=64), show_progress=False)
    by_kw = evaluate_trec_dl(dl19_dir, out_dir=tmp_path / "kw", **kw)
    by_spec = evaluate_trec_dl(EvalSpec(dl19_dir, out_dir=tmp_path / "spec", **kw))
    assert by_spec.name == by_kw.name == "msmarco-trec-dl-2019-passage-dl19-BM25-fake-c5-f0.5-t64-q3-s1"
    assert by_spec.per_query == by_kw.per_query and by_spec.params["fusion"] == 0.5
    assert (tmp_path / "spec" / f"{by_spec.name}.trec").read_bytes() == (tmp_path / "kw" / f"{by_kw.name}.trec").read_bytes()
    report = json.loads((tmp_path / "spec" / f"{by_spec.name}.json").read_text())
    assert report["params"]["metrics"] == list(by_kw.params["metrics"]) and "engine" not in report["params"]


def test_fields_of_the_other_dataset_are_refused():
    EvalSpec("d", split="dev", keep_identical_ids=True).check_for("beir")
    with pytest.raises(ValidationError, match=r"run_name, year apply to eval trec-dl only"):
        EvalSpec("d", run_name="BM25", year="dl19").check_for("beir")
    with pytest.raises(ValidationError, match=r"split apply to eval beir only"):
        EvalSpec("d", split="dev").check_for("trec-dl")
    EvalSpec(None, topics="t", qrels="q", run_file="r").check_for("trec-dl")


def test_as_spec():
    spec = EvalSpec("d", rerank="icr")
    assert as_spec(spec, {}) is spec
    assert as_spec("d", {"rerank": "icr"}) == spec == as_spec(None, {"data_dir": "d", "rerank": "icr"})
    with pytest.raises(TypeError, match="not both"):
        as_spec(spec, {"seed": 1})
    with pytest.raises(TypeError):
        as_spec("d", {"no_such_field": 1})
    with pytest.raises(AttributeError):
        spec.seed = 3  # frozen

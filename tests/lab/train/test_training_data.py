"""Query-adapter training's data and dev callback (:mod:`heedrank.lab.train.data`) on real NFCorpus
documents: grades from qrels, the store each source reads, and the dev figures."""

from __future__ import annotations


import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from heedrank.config import RerankerConfig  # noqa: E402
from heedrank.lab.train.data import dev_evaluator, examples_from, indexes_corpus, source_store  # noqa: E402
from heedrank.eval.metrics import evaluate_run  # noqa: E402
from heedrank.reranker.cached import CachedBlockRankReranker
from heedrank.types import Query  # noqa: E402


@pytest.fixture(scope="module")
def docs(nfcorpus_head):
    return nfcorpus_head[:6]


@pytest.fixture(scope="module")
def reranker(default_lm):
    return CachedBlockRankReranker(RerankerConfig(method="blockrank-cached", max_doc_tokens=32, options={
        "query_adapter": None, "layer": 3, "scoring": "signal"}), lm=default_lm)


def test_examples_take_grades_from_qrels(docs) -> None:
    queries = [Query("q1", "statins"), Query("q2", "vitamin d"), Query("q3", "no candidates")]
    cands = {"q1": docs[:3], "q2": docs[3:]}
    qrels = {"q1": {docs[1].doc_id: 2}, "q2": {docs[5].doc_id: 1, "not-a-candidate": 1}}
    ex = examples_from(queries, cands, qrels)
    assert [e.query_id for e in ex] == ["q1", "q2"]  # q3 has no candidates
    assert ex[0].grades == (0, 2, 0) and ex[1].grades == (0, 0, 1)
    assert ex[0].documents == tuple(docs[:3])


def test_an_index_serves_only_the_collection_it_was_built_from(tmp_path) -> None:
    import json

    nf, sf = tmp_path / "beir-nfcorpus", tmp_path / "beir-scifact"
    for d in (nf, sf):
        d.mkdir()
    by_folder, by_file = tmp_path / "idx-folder", tmp_path / "idx-file"
    for idx, path in ((by_folder, nf), (by_file, nf / "corpus.jsonl.gz")):
        idx.mkdir()
        (idx / "params.json").write_text(json.dumps({"corpus": {"path": str(path)}}))
    assert indexes_corpus(by_folder, nf) and indexes_corpus(by_file, nf)
    assert indexes_corpus(by_folder, tmp_path / "." / "beir-nfcorpus")  # compared resolved
    assert not indexes_corpus(by_folder, sf) and not indexes_corpus(by_file, sf)


def test_source_store_is_a_scratch_store_or_none(reranker, tmp_path) -> None:
    index = tmp_path / "index"
    index.mkdir()  # an index without a document KV store
    assert source_store(reranker, index, None, "x") is None
    store = source_store(reranker, index, tmp_path / "scratch", "../data/beir:train")
    try:
        assert not store.readonly and (tmp_path / "scratch" / ".._data_beir_train" / "header.json").is_file()
    finally:
        store.close()


def test_dev_figures_match_the_evaluator(reranker, docs) -> None:
    queries = [Query("q1", "statins and breast cancer"), Query("q2", "diet and heart disease")]
    cands = {"q1": docs[:3], "q2": docs[3:]}
    first = {"q1": [3.0, 2.0, 1.0], "q2": [1.0, 2.0, 3.0]}
    qrels = {"q1": {docs[2].doc_id: 1}, "q2": {docs[3].doc_id: 2}}
    evaluate = dev_evaluator(queries, cands, first, qrels, objective="signal")
    got = evaluate(reranker, None)
    run = {q: {d.doc_id: s for d, s in zip(cands[q], first[q])} for q in cands}
    want_first = 100 * np.mean([v["nDCG@10"] for v in evaluate_run(run, qrels, ["nDCG@10"]).per_query.values()])
    assert got["dev_first"] == pytest.approx(want_first)
    assert 0.0 <= got["dev"] <= 100.0 and 0.0 <= got["dev_fused"] <= 100.0
    # the pure figure is the signal reranker's own order
    pure = {}
    for q in queries:
        res = reranker.rerank(q, cands[q.query_id])
        pure[q.query_id] = {h.doc_id: h.score for h in res.ranking.hits}
    want_pure = 100 * np.mean([v["nDCG@10"] for v in evaluate_run(pure, qrels, ["nDCG@10"]).per_query.values()])
    assert got["dev"] == pytest.approx(want_pure)

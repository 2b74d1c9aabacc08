"""One scorer for serving, training and the study: on a saved feature dump of
real NFCorpus candidates, the served learned scorer, the query-adapter training scorer and the
study's linear variant give the same scores (1e-6) and the same fused order, and the served
reranker's own scores match the dump's."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from heedrank.config import RerankerConfig  # noqa: E402
from heedrank.lab.study import QueryItem, block_features, load_items, save_items, variant_scores  # noqa: E402
from heedrank.fusion import fuse, standardize  # noqa: E402
from heedrank.serving import ZFusion  # noqa: E402
from heedrank.reranker.cached import CachedBlockRankReranker  # noqa: E402
from heedrank.reranker.doccache import CACHE_TEMPLATE_VERSION  # noqa: E402
from heedrank.reranker.scoring import linear_head_scores  # noqa: E402
from heedrank.types import Query, Ranking, ScoredDoc  # noqa: E402

LAYER = 5
QUERY = "vitamin d and bone fractures"


@pytest.fixture(scope="module")
def card(default_lm, tmp_path_factory):
    w = np.random.default_rng(1).normal(size=(LAYER + 1) * default_lm.num_heads)
    path = tmp_path_factory.mktemp("card") / "card.json"
    path.write_text(json.dumps({"template": CACHE_TEMPLATE_VERSION, "layer": LAYER, "max_doc_tokens": 48,
                                "spec": "heads", "weights": w.tolist(), "fusion": {"alpha": 0.6},
                                "model_sha256": default_lm.identity["sha256"]}))
    return path, w


@pytest.fixture(scope="module")
def dump(default_lm, nfcorpus_head, tmp_path_factory):
    """A saved feature dump (``lab dump``'s format) of one query's 8 candidates."""
    docs = nfcorpus_head[:8]
    r = CachedBlockRankReranker(RerankerConfig(method="blockrank-cached", max_doc_tokens=48, options={
        "layer": LAYER, "scoring": "calibrated", "query_adapter": None}), lm=default_lm)
    feats = block_features(r, QUERY, docs)
    first = np.linspace(20.0, 5.0, len(docs))  # first-stage scores, descending
    item = QueryItem("q1", [d.doc_id for d in docs], first, np.zeros(len(docs)),
                     {"calibrated": feats["calibrated"]})
    path = tmp_path_factory.mktemp("dump") / "dump.npz"
    save_items(path, [item], {"layer": LAYER})
    return docs, load_items(path)[1][0]


def test_served_training_and_study_scorers_agree_on_a_saved_dump(default_lm, card, dump) -> None:
    from heedrank.lab.train.query_adapter import differentiable_scores  # noqa: F401  (the training path's scorer)

    _, w = card
    docs, item = dump
    feats = item.features["calibrated"].astype(np.float64)  # (N, L, H)
    served = linear_head_scores(torch.as_tensor(feats), torch.as_tensor(w)).numpy()
    training = linear_head_scores(torch.as_tensor(feats), torch.as_tensor(w).double()).numpy()
    study = variant_scores(item, {"kind": "linear", "spec": "heads", "weights": w.tolist()})
    explicit = standardize(feats.reshape(len(docs), -1)) @ w  # the formula, written out
    assert np.allclose(served, study, atol=1e-6) and np.allclose(training, study, atol=1e-6)
    assert np.allclose(study, explicit, atol=1e-6)

    fused_study = variant_scores(item, {"kind": "interpolate", "alpha": 0.6,
                                        "of": {"kind": "linear", "spec": "heads", "weights": w.tolist()}})
    first = Ranking.from_hits("q1", (ScoredDoc(d, float(s)) for d, s in zip(item.doc_ids, item.first_stage)))
    reranked = Ranking.from_hits("q1", (ScoredDoc(d, float(s)) for d, s in zip(item.doc_ids, served)))
    fused_served = ZFusion(alpha=0.6).apply(first, reranked).ranking
    assert np.allclose([{h.doc_id: h.score for h in fused_served.hits}[d] for d in item.doc_ids], fused_study, atol=1e-6)
    assert np.allclose(fuse(item.first_stage, study, 0.6), fused_study, atol=1e-12)
    order = [item.doc_ids[i] for i in sorted(range(len(docs)), key=lambda i: (-fused_study[i], item.doc_ids[i]))]
    assert list(fused_served.doc_ids) == order


def test_the_served_reranker_scores_what_the_dump_says(default_lm, card, dump) -> None:
    path, w = card
    docs, item = dump
    r = CachedBlockRankReranker(RerankerConfig(method="blockrank-cached", max_doc_tokens=48, options={
        "layer": LAYER, "scorer_weights": str(path), "query_adapter": None}), lm=default_lm)
    assert r.scoring == "learned" and r.default_fusion == 0.6
    got = r.rerank(Query("q1", QUERY), docs)
    study = variant_scores(item, {"kind": "linear", "spec": "heads", "weights": w.tolist()})
    by_id = {h.doc_id: h.score for h in got.ranking.hits}
    served = np.array([by_id[d.doc_id] for d in docs])
    assert np.allclose(served, study, atol=1e-3)  # fast path against the dump's exact float32 features
    assert np.corrcoef(served, study)[0, 1] > 0.9999


def test_the_shipped_card_records_the_adapter_each_entry_was_fitted_with(default_lm) -> None:
    """The scorer the default serves was chosen with the packaged query adapter (its
    ``query_adapter_sha256``); the learned path's cut-off maps were fitted with the adapter
    packaged before, so they are not applied with this one (nor without any adapter)."""
    from pathlib import Path

    from heedrank.files import file_sha256

    data = Path(__file__).resolve().parents[2] / "reranker" / "data"
    card = json.loads((data / "smollm2-135m-instruct.blockrank-cached.json").read_text())
    packaged = file_sha256(data / "smollm2-135m-instruct.query-adapter" / "adapter.safetensors")
    assert card["scorer"]["query_adapter_sha256"] == packaged
    before = card["calibration"]["query_adapter_sha256"]
    assert before != packaged and card["configuration"]["query_adapter"].endswith(before)
    for adapter in ("auto", None):
        r = CachedBlockRankReranker(RerankerConfig(method="blockrank-cached", max_doc_tokens=128, options={
            "query_adapter": adapter, "scoring": "learned"}), lm=default_lm)
        assert r.loaded().calibration is None
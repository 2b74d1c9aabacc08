"""The default configuration as the service reports it: ``GET /info`` names what
``default`` resolves to, with its card's dev and test figures, and the methods that explain;
``Settings`` defaults to it; ``/search`` fuses by default and a request can turn it off."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from heedrank.settings import Settings

# The packaged card (rebuilt by recipes/default): /info must report its values, whatever they are.
CARD = json.loads((Path(__file__).resolve().parents[2] / "reranker" / "data"
                   / "smollm2-135m-instruct.blockrank-cached.json").read_text())


def test_settings_default_to_the_default_configuration():
    s = Settings(index="unused")
    assert s.rerank_method == "default" and s.max_doc_tokens == 128 and s.default_retriever == "bm25"
    assert Settings(index="unused", rerank_method="icr").max_doc_tokens == 160


def test_info_names_the_default_configuration_and_its_figures(client):
    info = client.get("/info").json()["reranker"]
    default = info["default"]
    assert default["method"] == "blockrank-cached" and default["fusion"] is None  # served by the card's scorer
    assert default["max_doc_tokens"] == 128
    assert default["options"]["scoring"] == "auto" and default["options"]["query_adapter"] == "auto"
    card = default["card"]
    assert card["layer"] == 15 and "configuration" not in card and "fusion" not in card  # not what is served
    learned = card["learned"]  # scoring='learned', opt-in: its record, apart from what the default serves
    assert learned["served_when"] == "scoring='learned' is asked for"
    assert learned["configuration"]["query_adapter"] == CARD["configuration"]["query_adapter"]  # the one before
    figures, packaged = learned["configuration"]["test_ndcg@10"], CARD["configuration"]
    assert figures["nfcorpus-test-hybrid50"]["default"] == pytest.approx(packaged["test_ndcg@10"]["nfcorpus-test-hybrid50"]["default"])
    assert figures["dl19-bm25-100"]["first stage"] == pytest.approx(50.6)  # BM25 on DL19, whatever the card
    assert learned["configuration"]["dev_ndcg@10"]["default"] == pytest.approx(packaged["dev_ndcg@10"]["default"])
    assert learned["configuration"]["fusion"] == pytest.approx(CARD["fusion"]["alpha"])  # the learned scorer's record
    # what the default serves: the scorer's signals, cut-off, test figures and the choice that picked it
    scorer, shipped = card["scorer"], CARD["scorer"]
    assert scorer["features"] == shipped["features"] and scorer["threshold"] == shipped["threshold"]
    assert scorer["test_ndcg@10"]["dl19-bm25-100"] == shipped["test_ndcg@10"]["dl19-bm25-100"]
    assert scorer["chosen"] == shipped["choice"]["chosen"] and "choice" not in scorer  # the summary, not the report
    assert scorer["gate"] == {k: shipped["gate"][k] for k in ("signal", "limit", "power", "toward")}  # not its rows
    assert {"default", "blockrank-cached", "icr"} <= set(info["explain_methods"])
    assert "blockrank" not in info["explain_methods"] and "default" in info["methods"]


def test_search_fusion_is_on_for_a_method_that_records_a_weight(client, monkeypatch):
    from api_fakes import FakeReranker

    body = {"query": "apples", "rerank": {"method": "fake", "candidates": 4}}
    plain = client.post("/search", json=body).json()
    assert plain["rerank"].get("fusion") is None  # the fake records no weight
    monkeypatch.setattr(FakeReranker, "default_fusion", 0.5, raising=False)
    fused = client.post("/search", json=body).json()
    assert fused["rerank"]["fusion"] == pytest.approx(0.5)
    off = client.post("/search", json={**body, "rerank": {**body["rerank"], "fusion": "none"}}).json()
    assert off["rerank"].get("fusion") is None
    assert [h["doc_id"] for h in off["results"]] == [h["doc_id"] for h in plain["results"]]


def test_search_cutoff_returns_the_calibrated_hits(client, monkeypatch):
    """``rerank.cutoff``: the reranked hits whose calibrated probability passes the threshold,
    each hit's ``score`` that probability (``rerank.calibrated``); ``rerank.cutoff`` is echoed in
    ``rerank.cutoff``."""
    from api_fakes import FakeReranker

    from heedrank.calibration import Calibration, PlattMap

    body = {"query": "apples", "top_k": 4, "rerank": {"method": "fake", "candidates": 4, "fusion": "none"}}
    plain = client.post("/search", json=body).json()
    assert plain["rerank"].get("cutoff") is None and plain["rerank"]["calibrated"] is False
    # no calibration and no score scale (a plugin's own scores): score is the reranker's own score
    assert all("probability" not in h and h["score"] == h["raw_score"] for h in plain["results"])
    r = client.post("/search", json={**body, "rerank": {**body["rerank"], "cutoff": "auto"}})
    assert r.status_code == 422 and "no calibrated scores" in r.json()["error"]
    monkeypatch.setattr(FakeReranker, "calibration", Calibration(None, {"none": PlattMap((3.0, 0.0, 0.0, 0.0), 0.0, 0.5)}),
                        raising=False)
    scored = client.post("/search", json=body).json()
    assert scored["rerank"]["calibrated"] is True
    probs = [h["score"] for h in scored["results"]]
    assert all(p is not None for p in probs) and probs == sorted(probs, reverse=True)
    cut = client.post("/search", json={**body, "rerank": {**body["rerank"], "cutoff": "auto"}}).json()
    assert cut["rerank"]["cutoff"] == 0.5
    assert [h["doc_id"] for h in cut["results"]] == [h["doc_id"] for h, p in zip(scored["results"], probs) if p >= 0.5]
    assert 0 < len(cut["results"]) < len(scored["results"])
    r = client.post("/search", json={**body, "rerank": {**body["rerank"], "fusion": 0.5, "cutoff": "auto"}})
    assert r.status_code == 422 and "calibrated only for fusion none" in r.json()["error"]

"""BlockRank: the exact linear path equals the explicit block-sparse reference on real data."""

from __future__ import annotations

import gzip
import json

import pytest

torch = pytest.importorskip("torch")

from heedrank.config import RerankerConfig  # noqa: E402
from heedrank.errors import ValidationError  # noqa: E402
from heedrank.types import Document, Query  # noqa: E402
from heedrank.reranker.blockforward import block_forward, reference_forward, signal_scores  # noqa: E402
from heedrank.reranker.blockrank import BlockRankReranker  # noqa: E402


@pytest.fixture(scope="module")
def dl19_query(dl19_dir):
    with gzip.open(dl19_dir / "retrieve_results_BM25_dl19_top100.json.gz", "rt") as f:
        item = json.load(f)[0]
    hits = item["hits"][:10]
    return Query(str(hits[0]["qid"]), item["query"]), [Document(str(h["docid"]), h["content"]) for h in hits]


@pytest.fixture(scope="module")
def blockrank(default_lm):
    return BlockRankReranker(RerankerConfig(method="blockrank", max_doc_tokens=128), lm=default_lm)


def test_linear_path_equals_block_sparse_reference(blockrank, dl19_query):
    query, docs = dl19_query
    prompt = blockrank.build_prompt(query.text, docs)
    layer = blockrank.layer
    assert layer == round(0.6 * blockrank.lm.num_layers)
    with torch.inference_mode():
        out, _ = block_forward(blockrank.lm, prompt, layer, doc_batch_size=3)  # padded batches of 3
        ref = reference_forward(blockrank.lm, prompt, layer)
    L0, D = len(prompt.instruction_ids), sum(prompt.doc_lengths)
    fast = torch.softmax(out[layer][0, :, :, L0 : L0 + D], dim=-1)
    slow = torch.softmax(ref[0, :, :, L0 : L0 + D], dim=-1)
    assert fast.shape == (blockrank.lm.num_heads, 2, D)
    assert float((fast - slow).abs().max()) < 1e-4
    s_fast = signal_scores(out[layer], L0, prompt.doc_lengths)
    s_slow = signal_scores(ref, L0, prompt.doc_lengths)
    assert float(s_fast.sum()) == pytest.approx(1.0, abs=1e-5)
    assert float((s_fast - s_slow).abs().max()) < 1e-4
    assert torch.equal(torch.argsort(s_fast, descending=True), torch.argsort(s_slow, descending=True))


def test_rerank_returns_every_candidate_with_probability_scores(blockrank, dl19_query):
    query, docs = dl19_query
    res = blockrank.rerank(query, docs)
    assert sorted(res.ranking.doc_ids) == sorted(d.doc_id for d in docs)
    assert sum(h.score for h in res.ranking.hits) == pytest.approx(1.0, abs=1e-4)
    assert all(0.0 <= h.score <= 1.0 for h in res.ranking.hits)
    assert res.details["layer"] == blockrank.layer


def test_prompt_layout(blockrank):
    docs = [Document("a", "word " * 400), Document("b", "short")]
    p = blockrank.build_prompt("q", docs)
    tok = blockrank.lm.tokenizer
    assert p.truncated == [True, False]
    assert tok.decode(p.query_ids[-p.n_signal :]).strip() == ": [".strip()
    assert p.query_offset == len(p.instruction_ids) + p.block_length
    assert tok.decode(p.doc_ids[1]).strip().startswith("ID: 1 | CONTENT: short | END ID: 1")


def test_layer_out_of_range_is_a_validation_error(default_lm):
    r = BlockRankReranker(RerankerConfig(method="blockrank", options={"layer": 99}), lm=default_lm)
    with pytest.raises(ValidationError):
        _ = r.layer


def test_layer_scores_match_the_scoring_path(blockrank):
    docs = [Document("a", "Paris is the capital of France."), Document("b", "Bananas are yellow fruit."),
            Document("c", "The Eiffel Tower stands in Paris.")]
    per_layer = blockrank.layer_scores("capital of France", docs, [3, blockrank.layer])
    direct, _ = blockrank.scores(blockrank.build_prompt("capital of France", docs))
    assert per_layer[blockrank.layer] == pytest.approx(direct, abs=1e-6)
    assert sum(per_layer[3]) == pytest.approx(1.0, abs=1e-5)


def test_selected_heads_and_reattn(default_lm):
    docs = [Document("a", "Paris is the capital of France."), Document("b", "Bananas are yellow fruit."),
            Document("c", "The Eiffel Tower stands in Paris.")]
    q = Query("q", "capital of France")
    full = BlockRankReranker(RerankerConfig(method="blockrank"), lm=default_lm)
    layer = full.layer
    # the heads of l* itself, all of them, reproduce the default scores
    every = BlockRankReranker(
        RerankerConfig(method="blockrank", options={"heads": [[layer, h] for h in range(default_lm.num_heads)]}),
        lm=default_lm,
    )
    a = full.rerank(q, docs).ranking.to_dict()
    b = every.rerank(q, docs).ranking.to_dict()
    assert b == pytest.approx(a, abs=1e-6)
    few = BlockRankReranker(RerankerConfig(method="blockrank", options={"heads": [[4, 1], [6, 2]]}), lm=default_lm)
    res = few.rerank(q, docs)
    assert sum(h.score for h in res.ranking.hits) == pytest.approx(1.0, abs=1e-5)
    re = BlockRankReranker(RerankerConfig(method="blockrank", options={"reattn": True}), lm=default_lm)
    assert sorted(re.rerank(q, docs).ranking.doc_ids) == ["a", "b", "c"]
    with pytest.raises(ValidationError):
        BlockRankReranker(RerankerConfig(method="blockrank", options={"heads": "learned"}), lm=default_lm)

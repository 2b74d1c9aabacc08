"""Cached BlockRank (``blockrank-cached``): scores from stored document blocks equal
the uncached linear path in the same mode, on real NFCorpus documents (oracle test)."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from heedrank.config import RerankerConfig  # noqa: E402
from heedrank.errors import KVStoreMismatchError, ValidationError  # noqa: E402
from heedrank.index.kv import KVStore  # noqa: E402
from heedrank.reranker.blockforward import block_forward, reference_forward, signal_scores  # noqa: E402
from heedrank.reranker.blockrank import BlockRankReranker  # noqa: E402
from heedrank.reranker.cached import CachedBlockRankReranker
from heedrank.reranker.doccache import block_key, build_layout, document_block  # noqa: E402
from heedrank.types import Query  # noqa: E402

LAYER = 6


@pytest.fixture(scope="module")
def nf_docs(nfcorpus_head):
    return nfcorpus_head[:10]


def _reranker(lm, **options) -> BlockRankReranker:
    opts = {"scoring": "signal", "query_adapter": None, "layer": LAYER, **options}
    return CachedBlockRankReranker(RerankerConfig(method="blockrank-cached", max_doc_tokens=48, options=opts), lm=lm)


def _reference(r: BlockRankReranker, query: str, docs) -> list[float]:
    """Uncached linear path over the same cached-mode prompt (every block computed now)."""
    prompt = r.build_prompt(query, docs)
    with torch.inference_mode():
        out, _ = block_forward(r.lm, prompt, LAYER)
    return signal_scores(out[LAYER], len(prompt.instruction_ids), prompt.doc_lengths).tolist()


def _scores(result, docs) -> list[float]:
    by_id = {h.doc_id: h.score for h in result.ranking.hits}
    return [by_id[d.doc_id] for d in docs]


def test_blocks_do_not_depend_on_position_or_query(default_lm, nf_docs) -> None:
    layout = build_layout(default_lm.tokenizer, 48)
    block, _ = document_block(default_lm.tokenizer, layout, nf_docs[0].content)
    again, _ = document_block(default_lm.tokenizer, layout, nf_docs[0].content)
    assert block == again and block_key(block) == block_key(again)
    r = _reranker(default_lm)
    p1 = r.build_prompt("statins and cancer", nf_docs[:3])
    p2 = r.build_prompt("vitamin d deficiency", list(reversed(nf_docs[:3])))
    assert p1.instruction_ids == p2.instruction_ids  # block 0 holds no query
    assert p1.doc_ids[0] == p2.doc_ids[2]  # a block carries no position-dependent id
    assert p1.query_offset == p2.query_offset == layout.query_offset  # fixed, not the candidates' max length


def test_cached_mode_linear_path_equals_the_masked_reference(default_lm, nf_docs) -> None:
    r = _reranker(default_lm)
    prompt = r.build_prompt("do statins reduce cancer risk", nf_docs[:5])
    with torch.inference_mode():
        out, _ = block_forward(r.lm, prompt, LAYER)
        ref = reference_forward(r.lm, prompt, LAYER)
    L0 = len(prompt.instruction_ids)
    a = signal_scores(out[LAYER], L0, prompt.doc_lengths)
    b = signal_scores(ref, L0, prompt.doc_lengths)
    assert torch.allclose(a, b, atol=1e-5)


def test_scores_from_stored_blocks_equal_the_uncached_path(default_lm, nf_docs, tmp_path) -> None:
    query = "do statins reduce cancer risk"
    first = _reranker(default_lm, kv_dtype="float16")  # the exact store; int8 has its own bound (test_kvstore)
    header = first.block_store_header()
    docs = nf_docs[:8]
    expected = _reference(first, query, docs)
    with KVStore.create(tmp_path / "kv", header) as store:
        cold = first.rerank(Query("q", query), docs, block_store=store)
        assert cold.cache == {"hits": 0, "misses": 8}
        assert len(store) == 8
    # a fresh reranker (empty RAM cache) reads every block from the store
    second = _reranker(default_lm, kv_dtype="float16")
    with KVStore.open(tmp_path / "kv", header) as store:
        warm = second.rerank(Query("q", query), docs, block_store=store)
        assert warm.cache == {"hits": 8, "misses": 0}
        # mixed: two documents never stored, computed now and written back
        mixed_docs = docs[:5] + nf_docs[8:10]
        mixed = second.rerank(Query("q", query), mixed_docs, block_store=store)
        assert mixed.cache == {"hits": 5, "misses": 2}
        assert len(store) == 10
    # blocks computed now (float32, never stored): exact
    assert max(abs(x - y) for x, y in zip(_scores(cold, docs), expected)) < 1e-5
    # blocks read back from the float16 store: within fp16's rounding (2**-11 relative on
    # every key and value), same ranking
    assert max(abs(x - y) for x, y in zip(_scores(warm, docs), expected)) < 2e-4
    order = [d.doc_id for d in sorted(docs, key=lambda d: (-expected[docs.index(d)], d.doc_id))]
    assert [h.doc_id for h in cold.ranking.hits] == [h.doc_id for h in warm.ranking.hits] == order
    mixed_expected = _reference(second, query, mixed_docs)
    assert max(abs(x - y) for x, y in zip(_scores(mixed, mixed_docs), mixed_expected)) < 2e-4
    # the two fresh blocks of the mixed query are exact; the five stored ones carry fp16 rounding
    fresh = {d.doc_id for d in nf_docs[8:10]}
    assert {h.doc_id for h in mixed.ranking.hits} == {d.doc_id for d in mixed_docs} and fresh <= {
        h.doc_id for h in mixed.ranking.hits}


def test_cached_mode_is_permutation_invariant_and_calibrated_scoring_works(default_lm, nf_docs) -> None:
    r = _reranker(default_lm, scoring="calibrated")
    q = Query("q", "vitamin d and bone health")
    a = r.rerank(q, nf_docs[:6])
    b = r.rerank(q, list(reversed(nf_docs[:6])))
    sa, sb = _scores(a, nf_docs[:6]), _scores(b, nf_docs[:6])
    assert max(abs(x - y) for x, y in zip(sa, sb)) < 1e-5
    assert b.cache["hits"] == 6  # the RAM cache served the second call
    assert len(set(round(x, 6) for x in sa)) > 1


def test_a_store_built_for_another_configuration_is_refused(default_lm, tmp_path) -> None:
    r = _reranker(default_lm)
    header = r.block_store_header()
    KVStore.create(tmp_path / "kv", header).close()
    other = _reranker(default_lm, layer=LAYER + 1).block_store_header()
    with pytest.raises(KVStoreMismatchError, match="layer"):
        KVStore.open(tmp_path / "kv", other)


def test_outside_cached_mode_there_is_no_store_header(default_lm) -> None:
    r = BlockRankReranker(RerankerConfig(method="blockrank", max_doc_tokens=48), lm=default_lm)
    assert r.block_store_header() is None
    with pytest.raises(ValidationError, match="blockrank-cached"):
        r.encode_block_arrays(["text"])


def test_learned_scorer_is_the_z_scored_weighted_sum_of_calibrated_heads(default_lm, nf_docs, tmp_path) -> None:
    import numpy as np

    from heedrank.fusion import standardize
    from heedrank.lab.study import block_features
    from heedrank.reranker.doccache import CACHE_TEMPLATE_VERSION

    L, H = LAYER + 1, default_lm.num_heads
    w = np.random.default_rng(0).normal(size=L * H)
    card = {"template": CACHE_TEMPLATE_VERSION, "layer": LAYER, "max_doc_tokens": 48, "spec": "heads",
            "weights": w.tolist(), "model_sha256": default_lm.identity["sha256"]}
    path = tmp_path / "card.json"
    path.write_text(json.dumps(card))
    docs = nf_docs[:6]
    learned = _reranker(default_lm, scoring="learned", scorer_weights=str(path))
    got = _scores(learned.rerank(Query("q", "vitamin d and bones"), docs), docs)
    feats = block_features(_reranker(default_lm, scoring="calibrated"), "vitamin d and bones", docs)["calibrated"]
    x = feats.reshape(len(docs), -1).astype(np.float64)
    assert np.allclose(got, standardize(x) @ w, atol=1e-3)
    path.write_text(json.dumps({**card, "layer": LAYER + 1}))
    with pytest.raises(ValidationError, match="refit"):
        _reranker(default_lm, scoring="learned", scorer_weights=str(path)).rerank(Query("q", "vitamin d"), docs)


def test_the_shipped_weights_card_matches_the_default_model(default_lm) -> None:
    from heedrank.reranker.cards import packaged_data_dir

    card = json.loads((packaged_data_dir() / "smollm2-135m-instruct.blockrank-cached.json").read_text())
    assert card["model_sha256"] == default_lm.identity["sha256"]
    assert len(card["weights"]) == (card["layer"] + 1) * default_lm.num_heads
    assert card["test_ndcg@10"]["dl19-bm25-100"]["first stage"] == pytest.approx(50.58, abs=0.01)
    r = CachedBlockRankReranker(RerankerConfig(method="blockrank-cached", max_doc_tokens=card["max_doc_tokens"], options={
        "query_adapter": None, "layer": card["layer"], "scoring": "learned"}), lm=default_lm)
    assert r.learned_weights().shape == (card["layer"] + 1, default_lm.num_heads)


def test_scores_from_an_int8_store_stay_close_to_the_uncached_path(default_lm, nf_docs, tmp_path) -> None:
    """The default store (int8: per-channel keys, per-token values): scores read back from it
    stay within 2% of the score range of the exact path, and the top document is the same."""
    query = "do statins reduce cancer risk"
    r = _reranker(default_lm)
    assert r.block_store_header().dtype == "int8"  # the default
    docs = nf_docs[:8]
    expected = _reference(r, query, docs)
    with KVStore.create(tmp_path / "kv", r.block_store_header()) as store:
        r.rerank(Query("q", query), docs, block_store=store)
        warm = _reranker(default_lm).rerank(Query("q", query), docs, block_store=store)
        assert warm.cache == {"hits": 8, "misses": 0}
    got = _scores(warm, docs)
    spread = max(expected) - min(expected)
    assert max(abs(x - y) for x, y in zip(got, expected)) < 0.02 * spread
    assert warm.ranking.hits[0].doc_id == docs[max(range(8), key=lambda i: expected[i])].doc_id


def test_a_block_computed_now_scores_as_the_stored_one(default_lm, nf_docs, tmp_path) -> None:
    """A block computed at query time goes through the int8 codec's round trip: the same scores
    cold (computed and written back), warm (read from the store) and with no store at all."""
    query = "do statins reduce cancer risk"
    docs = nf_docs[:8]
    r = _reranker(default_lm)
    with KVStore.create(tmp_path / "kv", r.block_store_header()) as store:
        cold = r.rerank(Query("q", query), docs, block_store=store)
        warm = _reranker(default_lm).rerank(Query("q", query), docs, block_store=store)
        assert cold.cache == {"hits": 0, "misses": 8} and warm.cache == {"hits": 8, "misses": 0}
    alone = _reranker(default_lm).rerank(Query("q", query), docs)
    assert _scores(cold, docs) == _scores(warm, docs) == _scores(alone, docs)

"""The window-store scorer (issue #23, ``attend = m`` with read layers) against the masked
full-store pass it replaces.

Oracle: the query pass over a context assembled from window blocks (keys of the read layers
and of ``m..l*-1``, values of ``m..l*-1``, zeros elsewhere) gives the scores of the pass over
today's full context under ``CandidateMask(below = m)``, read at the same layers; and a
window store serves them again within each codec's tolerance.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from heedrank.config import RerankerConfig  # noqa: E402
from probe_helpers import MASK_LAYER, calibrated_cached  # noqa: E402
from heedrank.reranker.blockrank import calibrated_forward  # noqa: E402
from heedrank.reranker.cached import CachedBlockRankReranker  # noqa: E402
from heedrank.reranker.scoring import masked_document_scores, spans_from_lengths  # noqa: E402
from heedrank.types import Query  # noqa: E402

M, READ = 3, [1, 4]
"""attend from layer 3; read layers 1 (below m: a probe of keys) and 4 (the deepest)."""


def _window(lm, **options):
    opts = {"layer": MASK_LAYER, "scoring": "calibrated", "query_adapter": None, "attend": M, "probe_layers": READ,
            **options}
    return CachedBlockRankReranker(RerankerConfig(method="blockrank-cached", max_doc_tokens=40, options=opts), lm=lm)


def test_window_layers_and_header(default_lm) -> None:
    r = _window(default_lm, kv_dtype="int4")
    assert r.window and not r.probe and r.kv_depth == 4 and r.feature_layers == READ
    assert r.window_layers == ((1, 3, 4), (3,))
    h = r.block_store_header()
    assert h.layout == "window" and h.layers == (1, 3, 4) and h.value_layers == (3,) and h.layer == 4
    assert h.dtype == "int4" and not h.keys_only
    assert calibrated_cached(default_lm).block_store_header().layout == "full"


@pytest.mark.parametrize("fast", [True, False])
def test_window_scores_equal_the_masked_full_pass(default_lm, nfcorpus_head, fast) -> None:
    docs = nfcorpus_head[:10]
    query = Query("q", "do statins reduce cancer risk")
    r = _window(default_lm)
    r.fast_path = fast
    got = r.rerank(query, docs)
    full = calibrated_cached(default_lm)
    prompt = full.build_prompt(query.text, docs)
    with torch.inference_mode():
        kv = full.cached_context(prompt).kv
        qo, co, _ = calibrated_forward(full.lm, prompt, max(READ), read_layers=READ, kv=kv, fast=fast,
                                       candidates_below=M)
    L0, D = len(prompt.instruction_ids), sum(prompt.doc_lengths)
    c = sum((qo[l][0, :, L0: L0 + D] - co[l][0, :, L0: L0 + D]).sum(0) for l in READ)
    want = masked_document_scores(c, spans_from_lengths(prompt.doc_lengths), full.options.mask_std)
    scores = {h.doc_id: h.score for h in got.ranking.hits}
    for doc, w in zip(docs, want):
        assert abs(scores[doc.doc_id] - w) < 1e-5
    assert max(want) - min(want) > 1e-3  # a real signal


@pytest.mark.parametrize("dtype", ["float16", "int8", "int4"])
def test_window_store_serves_the_same_scores(default_lm, nfcorpus_head, tmp_path, dtype) -> None:
    from heedrank.index.kv import KVStore

    r = _window(default_lm, kv_dtype=dtype)
    header = r.block_store_header()
    docs = nfcorpus_head[:12]
    query = Query("q", "vitamin d and bone health")
    with KVStore.create(tmp_path / "window", header) as store:
        first = r.rerank(query, docs, block_store=store)
        assert first.details["cache"] == {"hits": 0, "misses": len(docs)}
    with KVStore.open(tmp_path / "window", header, readonly=True) as store:
        again = _window(default_lm, kv_dtype=dtype).rerank(query, docs, block_store=store)
        assert again.details["cache"]["hits"] == len(docs)
        k, v = store.get(store.keys()[0])
        assert k.shape[:2] == (3, 3) and v.shape[:2] == (1, 3)
    fresh = {h.doc_id: h.score for h in first.ranking.hits}
    stored = {h.doc_id: h.score for h in again.ranking.hits}
    spread = max(fresh.values()) - min(fresh.values())  # codec error relative to the score range
    # (values feed the layers above m: the error compounds more than a probe store's keys-only error)
    tol = {"float16": 3e-3, "int8": 0.15, "int4": 0.3}[dtype] * spread
    assert max(abs(fresh[d] - stored[d]) for d in fresh) <= tol
    if dtype == "float16":
        assert [h.doc_id for h in first.ranking.hits] == [h.doc_id for h in again.ranking.hits]


def test_window_options_are_checked(default_lm, nfcorpus_head) -> None:
    from heedrank.errors import ValidationError

    with pytest.raises(ValidationError, match="attend='none'"):
        _window(default_lm, attend=4).block_store_header()
    with pytest.raises(ValidationError, match="signal"):
        _window(default_lm, scoring="signal").rerank(Query("q", "x"), nfcorpus_head[:2])



def test_a_card_with_read_layers_under_todays_pass_is_design_b(default_lm, nfcorpus_head, tmp_path) -> None:
    """A weights card that says ``attend: all`` with ``layers`` (what ``bench/probe_layers.py
    --attend all --export`` writes) reads the full store cut at its deepest layer, without
    that layer's values: a window store with ``m = 0``."""
    import json

    card = {"format": 1, "kind": "blockrank-cached-learned-heads", "template": "blockrank-cached-v1",
            "model": "smollm2-135m-instruct", "layer": MASK_LAYER, "max_doc_tokens": 40, "spec": "heads",
            "attend": "all", "layers": [0, 1, 2, 3], "kv_dtype": "int8",
            "weights": [0.01] * (4 * default_lm.num_heads)}
    path = tmp_path / "card.json"
    path.write_text(json.dumps(card))
    r = CachedBlockRankReranker(RerankerConfig(method="blockrank-cached", max_doc_tokens=40, options={
        "scorer_weights": str(path), "query_adapter": None}), lm=default_lm)
    assert r.scoring == "learned" and r.window and r.candidates_below == 0 and r.kv_dtype == "int8"
    h = r.block_store_header()
    assert h.layout == "window" and h.layers == (0, 1, 2, 3) and h.value_layers == (0, 1, 2) and h.layer == 3
    docs = nfcorpus_head[:4]
    got = r.rerank(Query("q", "vitamin d and bone health"), docs)
    assert sorted(h.doc_id for h in got.ranking.hits) == sorted(d.doc_id for d in docs)
    assert len({round(h.score, 9) for h in got.ranking.hits}) == len(docs)  # real, distinct scores

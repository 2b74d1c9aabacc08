"""The probe scorer (issue #23, design A) against the masked pass it replaces.

Oracle: a query pass against block 0 alone, its rows then dotted with the candidates'
keys (:mod:`heedrank.reranker.probe`), gives the same calibrated per-(layer, head) mass as
the full-context pass under ``CandidateMask(below = l* + 1)``, on both the fast and the
exact (differentiable) paths, at every layer.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from heedrank.config import RerankerConfig  # noqa: E402
from probe_helpers import MASK_LAYER, calibrated_cached  # noqa: E402
from heedrank.reranker import probe  # noqa: E402
from heedrank.reranker.blockrank import calibrated_forward  # noqa: E402
from heedrank.reranker.cached import CachedBlockRankReranker  # noqa: E402
from heedrank.reranker.scoring import per_head_document_mass  # noqa: E402

LAYER = MASK_LAYER


@pytest.fixture(scope="module")
def setup(default_lm, nfcorpus_head):
    r = calibrated_cached(default_lm)
    prompt = r.build_prompt("do statins reduce cancer risk", nfcorpus_head[:9])
    layers = list(range(LAYER + 1))
    L0 = len(prompt.instruction_ids)
    D = sum(prompt.doc_lengths)
    with torch.inference_mode():
        kv = r.cached_context(prompt).kv
        qo, co, _ = calibrated_forward(r.lm, prompt, LAYER, read_layers=layers, kv=kv, candidates_below=LAYER + 1)
        want = per_head_document_mass(qo, L0, prompt.doc_lengths, layers, minus=co).float()
        keys = {l: kv[l][0][0, :, L0:L0 + D].clone() for l in layers}
    return r, prompt, layers, keys, want


@pytest.mark.parametrize("fast", [True, False])
def test_probe_equals_the_masked_pass(setup, fast) -> None:
    r, prompt, layers, keys, want = setup
    with torch.inference_mode():
        rows = probe.probe_query_pass(r.lm, prompt, r.instruction_kv(), layers, fast=fast)
        got = probe.probe_features(rows, keys, prompt.doc_lengths, layers)
    assert got.shape == want.shape == (len(prompt.doc_lengths), LAYER + 1, r.lm.num_heads)
    assert torch.allclose(got, want, atol=2e-6), float((got - want).abs().max())
    assert float(want.abs().max()) > 1e-3  # a real signal, not zeros


def test_probe_chunks_and_a_layer_subset(setup, monkeypatch) -> None:
    r, prompt, layers, keys, want = setup
    monkeypatch.setattr(probe, "PROBE_CHUNK", 37)
    with torch.inference_mode():
        rows = probe.probe_query_pass(r.lm, prompt, r.instruction_kv(), [2, LAYER])
        got = probe.probe_features(rows, keys, prompt.doc_lengths, [2, LAYER])
    assert torch.allclose(got, want[:, [2, LAYER]], atol=2e-6)


def test_probe_mass_is_a_share_of_one(setup) -> None:
    r, prompt, layers, keys, _ = setup
    with torch.inference_mode():
        rows = probe.probe_query_pass(r.lm, prompt, r.instruction_kv(), [LAYER])
        m = probe.probe_mass(rows, LAYER, keys[LAYER], prompt.doc_lengths)
    assert m.shape == (2, len(prompt.doc_lengths), r.lm.num_heads)
    total = m.sum(dim=1)
    assert bool(((total > 0) & (total < 1)).all())


def _probe_reranker(lm, **options):
    opts = {"layer": LAYER, "scoring": "calibrated", "query_adapter": None, "attend": "none", **options}
    return CachedBlockRankReranker(RerankerConfig(method="blockrank-cached", max_doc_tokens=40, options=opts), lm=lm)


@pytest.mark.parametrize("dtype", ["float16", "int8", "int4"])
def test_probe_store_holds_keys_of_its_layers_only_and_serves_the_same_scores(default_lm, nfcorpus_head, tmp_path,
                                                                               dtype) -> None:
    from heedrank.index.kv import KVStore
    from heedrank.types import Query

    r = _probe_reranker(default_lm, probe_layers=[3, LAYER], kv_dtype=dtype)
    header = r.block_store_header()
    assert header.keys_only is True and header.layers == (3, LAYER) and header.dtype == dtype
    docs = nfcorpus_head[:12]
    query = Query("q", "do statins reduce cancer risk")
    with KVStore.create(tmp_path / "kv", header) as store:
        first = r.rerank(query, docs, block_store=store)
        assert first.details["cache"] == {"hits": 0, "misses": len(docs)}
    with KVStore.open(tmp_path / "kv", header, readonly=True) as store:
        again = _probe_reranker(default_lm, probe_layers=[3, LAYER], kv_dtype=dtype).rerank(query, docs,
                                                                                          block_store=store)
        assert again.details["cache"]["hits"] == len(docs)
        k, v = store.get(store.keys()[0])
        assert v is None and k.shape[0] == 2 and k.shape[1] == 3
    fresh = {h.doc_id: h.score for h in first.ranking.hits}
    stored = {h.doc_id: h.score for h in again.ranking.hits}
    spread = max(fresh.values()) - min(fresh.values())  # codec error relative to the score range
    tol = {"float16": 1e-3, "int8": 0.05, "int4": 0.3}[dtype] * spread
    assert max(abs(fresh[d] - stored[d]) for d in fresh) <= tol
    if dtype == "float16":
        assert [h.doc_id for h in first.ranking.hits] == [h.doc_id for h in again.ranking.hits]


def test_probe_reranker_equals_the_masked_full_pass(default_lm, nfcorpus_head) -> None:
    """Served scores of the probe store equal those of the full-store pass under attend='none'
    computed the long way (today's context, every layer masked), for calibrated scoring
    summed over the same layers."""
    from heedrank.types import Query

    docs = nfcorpus_head[10:22]
    query = Query("q", "vitamin d and bone health")
    got = _probe_reranker(default_lm, probe_layers=list(range(LAYER + 1))).rerank(query, docs)
    r = _probe_reranker(default_lm)
    prompt = r.build_prompt(query.text, docs)
    layers = list(range(LAYER + 1))
    with torch.inference_mode():
        kv = r.cached_context(prompt).kv
        qo, co, _ = calibrated_forward(r.lm, prompt, LAYER, read_layers=layers, kv=kv, candidates_below=LAYER + 1)
    want = per_head_document_mass(qo, len(prompt.instruction_ids), prompt.doc_lengths, layers, minus=co).sum(dim=(1, 2))
    scores = {h.doc_id: h.score for h in got.ranking.hits}
    for doc, w in zip(docs, want.tolist()):
        assert abs(scores[doc.doc_id] - w) < 1e-5


def test_probe_options_are_checked(default_lm) -> None:
    from heedrank.errors import ValidationError

    cut = CachedBlockRankReranker(RerankerConfig(method="blockrank-cached", options={
        "layer": LAYER, "scoring": "calibrated", "query_adapter": None, "probe_layers": [3], "attend": "all"}),
        lm=default_lm)  # design B: the full store cut at layer 3, without its values there
    assert cut.window and cut.window_layers == ((0, 1, 2, 3), (0, 1, 2)) and cut.kv_depth == 3
    r = _probe_reranker(default_lm, probe_layers=[LAYER + 3])
    with pytest.raises(ValidationError, match="above l"):
        _ = r.probe_layers
    full = CachedBlockRankReranker(RerankerConfig(method="blockrank-cached", options={
        "layer": LAYER, "scoring": "calibrated", "query_adapter": None, "kv_dtype": "int4"}), lm=default_lm)
    h = full.block_store_header()  # int4 now codes values too (per token)
    assert h.dtype == "int4" and h.layout == "full" and h.n_value_layers == LAYER + 1
    late = CachedBlockRankReranker(RerankerConfig(method="blockrank-cached", options={
        "layer": LAYER, "scoring": "calibrated", "query_adapter": None, "attend": LAYER, "probe_layers": [LAYER]}),
        lm=default_lm)
    with pytest.raises(ValidationError, match="attend='none'"):
        late.block_store_header()


def test_the_shipped_probe_card_selects_the_probe_store_by_itself(default_lm) -> None:
    """``reranker/data/<model>.blockrank-probe.json`` (issue #23's best probe point, not the
    default): the card alone turns on attend='none', layers 7-9 and the int4 store."""
    from heedrank.reranker.heads import packaged_data_dir

    card = packaged_data_dir() / "smollm2-135m-instruct.blockrank-probe.json"
    r = CachedBlockRankReranker(RerankerConfig(method="blockrank-cached", options={
        "scorer_weights": str(card), "query_adapter": None}), lm=default_lm)
    assert r.probe and r.probe_layers == (7, 8, 9) and r.kv_dtype == "int4" and r.default_fusion == 0.5
    h = r.block_store_header()
    assert h.keys_only and h.layers == (7, 8, 9) and h.layer == 9 and h.entry_nbytes(132) == 42_624
    assert r.learned_weights().shape == (3, default_lm.num_heads)
    default = CachedBlockRankReranker(RerankerConfig(method="default"), lm=default_lm)
    assert not default.probe and default.attend == "all" and not default.block_store_header().keys_only

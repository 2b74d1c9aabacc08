"""Cached BlockRank on other causal-LM architectures than SmolLM2 (tiny random weights).

Users bring any local Hugging Face causal-LM folder (``--model DIR``). These tests build
tiny random-weight models of several architectures in the test (no download), each saved
with a small byte-level BPE tokenizer trained here, load them through the project's own
loader (:func:`heedrank.reranker.lm.load_lm` on the folder) and run every path of cached
BlockRank (:mod:`heedrank.reranker.cached`) against its oracle:

* block encoding and the document KV store round trip (blocks written to a float16
  :class:`heedrank.index.kv.KVStore`, read back by a fresh reranker): the signal scores
  equal the uncached linear BlockRank forward and the one-pass masked reference
  (:func:`heedrank.reranker.blockforward.reference_forward`);
* the merged query + ``N/A`` pass (``calibrated`` and ``learned`` scoring) equals the exact
  two-pass path (``fast_path=False``), key by key and score by score;
* learned scoring with a weights card shaped for the model (``(l* + 1) * heads`` weights);
* a query-side LoRA adapter (peft) on the query passes only, served from a store built
  without it;
* evidence spans (character offsets into the document text).

Architectures: Llama with grouped-query attention and tied embeddings; Llama with one KV
head (multi-query), a head dimension unequal to ``hidden / heads`` and untied embeddings;
Qwen2 (biases on q/k/v); Mistral (sliding window, 4 query heads per KV head); Gemma 3
text (sliding-window and full layers, ``query_pre_attn_scalar`` scaling, q/k norms).
Sliding windows are set larger than every position in the cached layout (as the shipped
Gemma 3 270M with 128-token blocks); a window the layout runs past is a separate test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from heedrank.config import RerankerConfig  # noqa: E402
from heedrank.index.kv import KVStore  # noqa: E402
from heedrank.reranker.blockforward import (  # noqa: E402
    block_forward,
    calibrated_forward,
    reference_forward,
    signal_scores,
)
from heedrank.reranker.cached import CachedBlockRankReranker  # noqa: E402
from heedrank.reranker.doccache import CACHE_TEMPLATE_VERSION  # noqa: E402
from heedrank.reranker.lm import load_lm  # noqa: E402
from heedrank.types import Document, Query  # noqa: E402

MAX_DOC_TOKENS = 32
WINDOW = 512  # sliding window of the windowed configurations: past every position of the layout

DOCS = [
    Document("d0", "Statins lower cholesterol and may reduce the risk of some cancers in older adults."),
    Document("d1", "Vitamin D supports bone health; deficiency is common in northern winters."),
    Document("d2", "A diet rich in fibre and vegetables is linked to a lower risk of colon cancer, "
                   "according to several large cohort studies across Europe and Asia."),
    Document("d3", "Green tea contains catechins, antioxidants studied for heart disease."),
    Document("d4", "Exercise improves insulin sensitivity in type 2 diabetes."),
    Document("d5", "Processed meat intake is associated with higher colorectal cancer incidence."),
]
QUERY = "do statins reduce cancer risk"


def _small(**kw):
    """Shared tiny shape: 4 layers, hidden 64 (under a second per model on one core)."""
    base = {"num_hidden_layers": 4, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
            "num_key_value_heads": 2, "max_position_embeddings": 1024}
    return {**base, **kw}


def _configs() -> dict[str, tuple[str, dict]]:
    """name -> (config class name in transformers, keyword arguments)."""
    return {
        "llama-gqa-tied": ("LlamaConfig", _small(head_dim=16, tie_word_embeddings=True)),
        "llama-mqa-untied-headdim32": ("LlamaConfig", _small(num_key_value_heads=1, head_dim=32,
                                                             tie_word_embeddings=False)),
        "qwen2-bias": ("Qwen2Config", _small(tie_word_embeddings=True, use_sliding_window=False)),
        "mistral-window": ("MistralConfig", _small(num_attention_heads=8, head_dim=8, sliding_window=WINDOW,
                                                   tie_word_embeddings=False)),
        "gemma3-text": ("Gemma3TextConfig", _small(head_dim=16, sliding_window=WINDOW, query_pre_attn_scalar=16,
                                                   layer_types=["sliding_attention", "sliding_attention",
                                                                "full_attention", "sliding_attention"])),
    }


LAYER = 2  # l*: the third of four layers (Gemma: its one full-attention layer below the top)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> Path:
    """A byte-level BPE tokenizer (~400 tokens, offsets for evidence) trained on the prompt's
    own text and the documents, saved with ``save_pretrained``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from heedrank.reranker.doccache import ANSWER, DOC_CLOSE, DOC_OPEN, FINAL, INSTRUCTION

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    corpus = [INSTRUCTION, FINAL, ANSWER, DOC_OPEN, DOC_CLOSE, QUERY] + [d.text for d in DOCS]
    tok.train_from_iterator(corpus * 4, trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                                pad_token="<pad>")
    path = tmp_path_factory.mktemp("tokenizer")
    fast.save_pretrained(path)
    return path


@pytest.fixture(scope="module", params=sorted(_configs()))
def arch(request, tokenizer_dir, tmp_path_factory):
    """``(name, LoadedLM)``: a tiny random-weight model saved with the tokenizer to a folder
    and loaded through :func:`heedrank.reranker.lm.load_lm` (as ``--model DIR`` does)."""
    name = request.param
    cls_name, kw = _configs()[name]
    return name, _build(name, cls_name, kw, tokenizer_dir, tmp_path_factory.mktemp(name))


def _build(name: str, cls_name: str, kw: dict, tokenizer_dir: Path, path: Path):
    """A random-weight ``cls_name(**kw)`` model saved with the tokenizer to ``path``, loaded by
    :func:`heedrank.reranker.lm.load_lm`."""
    cls = getattr(transformers, cls_name, None)
    if cls is None:
        pytest.skip(f"this transformers ({transformers.__version__}) has no {cls_name}")
    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    cfg = cls(vocab_size=len(tok), pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
              eos_token_id=tok.eos_token_id, **kw)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # larger than the default 0.02 init, so that attention is far from uniform
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.2)
            elif name.startswith("qwen2") and p.dim() == 1 and p.abs().sum() == 0:
                p.normal_(0.0, 0.2)  # q/k/v biases start at zero: make them count
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return load_lm(str(path))


def _reranker(lm, scoring: str = "signal", fast: bool = True, **options) -> CachedBlockRankReranker:
    opts = {"query_adapter": None, "layer": LAYER, "scoring": scoring, "chat_template": False,
            "kv_dtype": "float16", **options}
    r = CachedBlockRankReranker(RerankerConfig(method="blockrank-cached", max_doc_tokens=MAX_DOC_TOKENS,
                                               options=opts), lm=lm)
    r.fast_path = fast
    return r


def _scores(result) -> list[float]:
    by_id = {h.doc_id: h.score for h in result.ranking.hits}
    return [by_id[d.doc_id] for d in DOCS]


def _max_err(a, b) -> float:
    return max(abs(x - y) for x, y in zip(a, b))


def _write_card(path: Path, lm, *, heads: int | None = None, seed: int = 1) -> Path:
    """A weights card (as ``heedrank lab fit --export`` writes it) for this model at ``l*``."""
    g = torch.Generator().manual_seed(seed)
    n = (LAYER + 1) * (heads or lm.num_heads)
    card = {"layer": LAYER, "max_doc_tokens": MAX_DOC_TOKENS, "template": CACHE_TEMPLATE_VERSION, "spec": "heads",
            "model_sha256": lm.identity["sha256"], "weights": torch.randn(n, generator=g).tolist()}
    path.write_text(json.dumps(card))
    return path


def test_loaded_shapes_and_store_header(arch) -> None:
    name, lm = arch
    cfg = lm.model.config
    header = _reranker(lm).block_store_header()
    assert header.kv_heads == cfg.num_key_value_heads
    assert header.head_dim == (getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    assert header.layer == LAYER and header.max_doc_tokens == _reranker(lm).layout.max_block_tokens
    if name.startswith("llama-mqa"):
        assert header.head_dim * cfg.num_attention_heads != cfg.hidden_size  # head_dim is not hidden / heads
        assert lm.model.lm_head.weight.data_ptr() != lm.model.model.embed_tokens.weight.data_ptr()  # untied


def test_cached_blocks_and_store_round_trip_equal_the_uncached_paths(arch, tmp_path) -> None:
    """Signal scores: blocks encoded now, and read back from a float16 store by a fresh
    reranker, equal the uncached linear forward and the masked one-pass reference."""
    _, lm = arch
    r = _reranker(lm)
    prompt = r.build_prompt(QUERY, DOCS)
    L0 = len(prompt.instruction_ids)
    assert any(prompt.truncated)  # the budget cuts (at least) the long document
    with torch.inference_mode():
        lin, _ = block_forward(lm, prompt, LAYER, fast=False)  # blocks computed in the pass, no store
        ref = reference_forward(lm, prompt, LAYER)
    expected = signal_scores(lin[LAYER], L0, prompt.doc_lengths).tolist()
    masked = signal_scores(ref, L0, prompt.doc_lengths).tolist()
    assert _max_err(expected, masked) < 1e-5
    assert max(expected) - min(expected) > 1e-3  # the scores separate the candidates

    # block encoding: (l* + 1, kv_heads, T, head_dim) per text
    header = r.block_store_header()
    arrays = r.encode_block_arrays([d.text for d in DOCS])
    for (key, k, v), ids in zip(arrays, prompt.doc_ids):
        assert k.shape == v.shape == (LAYER + 1, header.kv_heads, len(ids), header.head_dim)

    with KVStore.create(tmp_path / "kv", header) as store:
        cold = r.rerank(Query("q", QUERY), DOCS, block_store=store)
        assert len(store) == len(DOCS)
    with KVStore.open(tmp_path / "kv", header, readonly=True) as store:
        for key, k, v in arrays:  # the stored arrays are the encoded ones, to float16 rounding
            sk, sv = store.get(key)
            assert abs(sk.astype("float32") - k).max() <= 2e-3 * max(1.0, abs(k).max())
            assert abs(sv.astype("float32") - v).max() <= 2e-3 * max(1.0, abs(v).max())
        warm = _reranker(lm).rerank(Query("q", QUERY), DOCS, block_store=store)
    assert cold.cache == {"hits": 0, "misses": len(DOCS)} and warm.cache == {"hits": len(DOCS), "misses": 0}
    assert _max_err(_scores(cold), expected) < 1e-5  # blocks computed now (float32)
    assert _max_err(_scores(warm), expected) < 5e-4  # blocks read back from float16
    # without a store (RAM tier), a second query on the same reranker hits every block
    again = r.rerank(Query("q", QUERY), DOCS)
    assert _max_err(_scores(again), expected) < 1e-5


def test_merged_query_and_na_pass_equals_two_passes(arch) -> None:
    """The merged query + ``N/A`` pass (fast path) equals two exact passes key by key, and the
    calibrated scores agree."""
    _, lm = arch
    r = _reranker(lm, "calibrated")
    prompt = r.build_prompt(QUERY, DOCS)
    layers = list(range(LAYER + 1))
    with torch.inference_mode():
        ctx = r.cached_context(prompt)
        qo, co, _ = calibrated_forward(lm, prompt, LAYER, read_layers=layers, kv=ctx.kv)
        ctx = r.cached_context(prompt)
        qe, ce, _ = calibrated_forward(lm, prompt, LAYER, read_layers=layers, kv=ctx.kv, fast=False)
    for l in layers:
        assert qo[l].shape == qe[l].shape and co[l].shape == ce[l].shape
        assert torch.allclose(qo[l], qe[l], atol=1e-6) and torch.allclose(co[l], ce[l], atol=1e-6)
        assert torch.allclose(qo[l].sum(-1), torch.ones(1, lm.num_heads), atol=1e-5)
    fast = r.rerank(Query("q", QUERY), DOCS)
    exact = _reranker(lm, "calibrated", fast=False).rerank(Query("q", QUERY), DOCS)
    assert _max_err(_scores(fast), _scores(exact)) < 1e-5
    assert [h.doc_id for h in fast.ranking.hits] == [h.doc_id for h in exact.ranking.hits]


def test_learned_scoring_with_a_card_shaped_for_the_model(arch, tmp_path) -> None:
    """A weights card of ``(l* + 1) * heads`` weights for this model scores on both paths
    alike; a card shaped for another head count is refused with a typed error."""
    from heedrank.errors import HeedrankError

    _, lm = arch
    card = _write_card(tmp_path / "card.json", lm)
    fast = _reranker(lm, "learned", scorer_weights=str(card))
    assert fast.scoring == "learned" and fast.learned_weights().shape == (LAYER + 1, lm.num_heads)
    got = fast.rerank(Query("q", QUERY), DOCS)
    want = _reranker(lm, "learned", fast=False, scorer_weights=str(card)).rerank(Query("q", QUERY), DOCS)
    tol = 1e-5 * max(1.0, float(abs(fast.learned_weights()).sum()))  # z-scored sums amplify rounding
    assert _max_err(_scores(got), _scores(want)) < tol
    assert [h.doc_id for h in got.ranking.hits] == [h.doc_id for h in want.ranking.hits]
    wrong = _write_card(tmp_path / "wrong.json", lm, heads=lm.num_heads + 1)
    with pytest.raises((HeedrankError, ValueError)):
        _reranker(lm, "learned", scorer_weights=str(wrong)).rerank(Query("q", QUERY), DOCS)


def test_query_adapter_changes_the_query_passes_only(arch, tmp_path) -> None:
    """A LoRA query adapter (q/v projections of every layer) runs on the query and ``N/A``
    passes of a private copy; blocks come from a store built without it."""
    import copy

    from heedrank.reranker.adapters import inject_lora, save_adapter

    _, lm = arch
    model = copy.deepcopy(lm.model)
    inject_lora(model, 2, 4, ["q_proj", "v_proj"])
    with torch.no_grad():
        g = torch.Generator().manual_seed(3)
        for n, p in model.named_parameters():
            if "lora_B" in n:  # peft starts B at zero (no change): make the adapter count
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    card = {"layer": LAYER, "max_doc_tokens": MAX_DOC_TOKENS, "template": CACHE_TEMPLATE_VERSION,
            "lora": {"r": 2, "alpha": 4, "target_modules": ["q_proj", "v_proj"]},
            "model": {"sha256": lm.identity["sha256"]}}
    path = save_adapter(tmp_path / "adapter", model, card)
    base = _reranker(lm, "calibrated")
    header = base.block_store_header()
    with KVStore.create(tmp_path / "kv", header) as store:
        plain = base.rerank(Query("q", QUERY), DOCS, block_store=store)
    adapted = _reranker(lm, "calibrated", query_adapter=str(path))
    assert adapted.adapter is not None and adapted.lm is not lm and adapted.base_lm is lm
    assert adapted.block_store_header() == header  # the store serves the adapter
    with KVStore.open(tmp_path / "kv", header, readonly=True) as store:
        got = adapted.rerank(Query("q", QUERY), DOCS, block_store=store)
        want = _reranker(lm, "calibrated", fast=False, query_adapter=str(path)).rerank(
            Query("q", QUERY), DOCS, block_store=store)
    assert got.cache == {"hits": len(DOCS), "misses": 0}
    assert _max_err(_scores(got), _scores(want)) < 1e-5
    assert _max_err(_scores(got), _scores(plain)) > 1e-4  # the adapter changes the scores
    # blocks encoded through the adapter's reranker are the base model's
    (_, k0, _), = base.encode_block_arrays([DOCS[0].text])
    (_, k1, _), = adapted.encode_block_arrays([DOCS[0].text])
    assert abs(k0 - k1).max() < 1e-6


@pytest.mark.parametrize("scoring", ["calibrated", "signal"])
def test_evidence_spans_index_the_document_text(arch, scoring) -> None:
    _, lm = arch
    r = _reranker(lm, scoring)
    result = r.rerank_with_evidence(Query("q", QUERY), DOCS, max_spans=2)
    plain = _reranker(lm, scoring).rerank(Query("q", QUERY), DOCS)
    assert [h.doc_id for h in result.ranking.hits] == [h.doc_id for h in plain.ranking.hits]
    assert _max_err(_scores(result), _scores(plain)) < 1e-6
    by_id = {d.doc_id: d for d in DOCS}
    assert set(result.evidence) == set(by_id) and any(result.evidence.values())
    for doc_id, spans in result.evidence.items():
        assert len(spans) <= 2
        for s in spans:
            field = by_id[doc_id].text if s.field == "text" else by_id[doc_id].title
            assert field[s.start:s.end] == s.text and s.text.strip()


@pytest.mark.parametrize("cls_name", ["MistralConfig", "Gemma3TextConfig"])
def test_a_sliding_window_the_layout_runs_past_is_a_typed_error(cls_name, tokenizer_dir, tmp_path) -> None:
    """Past a sliding window the block mask is not the model's attention (measured: a 16-token
    Mistral window moved the signal scores by 0.03 from the masked reference, with no error).
    The cached reranker refuses such a layout with ContextOverflowError (lower max_doc_tokens);
    the window of a layer above l* does not count (it never runs)."""
    from heedrank.errors import ContextOverflowError
    from heedrank.reranker.blockforward import sliding_window

    kw = _small(head_dim=16, sliding_window=64)
    if cls_name == "Gemma3TextConfig":
        kw["layer_types"] = ["full_attention"] * 3 + ["sliding_attention"]  # only the top layer slides
    lm = _build(cls_name, cls_name, kw, tokenizer_dir, tmp_path / "model")
    r = _reranker(lm)
    assert r.layout.query_offset > 64  # the layout runs past the window
    if cls_name == "MistralConfig":
        assert sliding_window(lm.model.config, LAYER) == 64 and r.position_limit == 64
        with pytest.raises(ContextOverflowError, match="sliding attention window 64 in layers 0..2.*max_doc_tokens"):
            r.rerank(Query("q", QUERY), DOCS)
    else:  # the window is above l* = 2: nothing to refuse, and the oracle holds past it
        assert sliding_window(lm.model.config, LAYER) is None and r.position_limit == 1024
        assert sliding_window(lm.model.config, 3) == 64
        prompt = r.build_prompt(QUERY, DOCS)
        with torch.inference_mode():
            lin, _ = block_forward(lm, prompt, LAYER, fast=False)
            ref = reference_forward(lm, prompt, LAYER)
        L0 = len(prompt.instruction_ids)
        got = _scores(r.rerank(Query("q", QUERY), DOCS))
        assert _max_err(got, signal_scores(ref, L0, prompt.doc_lengths).tolist()) < 1e-5
        assert _max_err(got, signal_scores(lin[LAYER], L0, prompt.doc_lengths).tolist()) < 1e-5


def _independent(r, query: str, docs) -> torch.Tensor:
    """``F(d)`` of :mod:`heedrank.reranker.cached.independent` for ``docs`` in one list."""
    from heedrank.reranker.cached.independent import document_features, query_states

    prompt = r.build_prompt(query, docs)
    with torch.inference_mode():
        kv = r.cached_context(prompt).kv
        states, groups = query_states(r.lm, prompt, kv, list(range(LAYER + 1)))
        return document_features(states, groups, kv, len(prompt.instruction_ids), prompt.doc_lengths)


def test_independent_features_do_not_depend_on_the_list(arch) -> None:
    """A document's list-independent features are the same alone, in the full list, and in the
    list reversed (to float32 rounding), and they differ between documents."""
    from heedrank.reranker.cached.independent import GROUPS

    _, lm = arch
    r = _reranker(lm, scoring="calibrated")
    full = _independent(r, QUERY, DOCS)
    assert full.shape == (len(DOCS), LAYER + 1, lm.num_heads, len(GROUPS))
    back = _independent(r, QUERY, DOCS[::-1]).flip(0)
    assert (full - back).abs().max() < 1e-4
    for i in (0, 3):
        alone = _independent(r, QUERY, [DOCS[i]])[0]
        assert (full[i] - alone).abs().max() < 1e-4
    assert (full[0] - full[1]).abs().max() > 1e-3
    # computing only some groups (the rows they read) gives the same values for those groups
    from heedrank.reranker.cached.independent import document_features, query_states

    prompt = r.build_prompt(QUERY, DOCS)
    with torch.inference_mode():
        kv = r.cached_context(prompt).kv
        states, groups = query_states(r.lm, prompt, kv, list(range(LAYER + 1)))
        some = document_features(states, groups, kv, len(prompt.instruction_ids), prompt.doc_lengths, used=[1, 4, 7])
    assert (some[..., [1, 4, 7]] - full[..., [1, 4, 7]]).abs().max() < 1e-5
    assert some[..., [0, 2, 3, 5, 6]].abs().max() == 0


def test_independent_features_at_layer_0_are_log_attention_odds(arch) -> None:
    """At layer 0 the query's states do not depend on the context, so ``f_r(d)`` equals the log of
    the attention a query row puts on the document over what it puts on block 0 when it
    does see the document (the exact two-pass query pass's per-row probabilities)."""
    from heedrank.reranker.attention import AttentionCapture
    from heedrank.reranker.blockforward import query_pass
    from heedrank.reranker.cached.independent import GROUPS

    _, lm = arch
    r = _reranker(lm, scoring="calibrated")
    doc = DOCS[1]
    prompt = r.build_prompt(QUERY, [doc])
    L0, T = len(prompt.instruction_ids), prompt.doc_lengths[0]
    with torch.inference_mode():
        kv = r.cached_context(prompt).kv
        cap = AttentionCapture(layers={0}, mode="probs", stop_after=0)
        query_pass(lm, prompt, [(k[:, :, : L0 + T], v[:, :, : L0 + T]) for k, v in kv], cap, fast=False)
    p = cap.out[0][0]  # (H, Lq, K)
    ratio = torch.log(p[:, :, L0: L0 + T].sum(-1)) - torch.log(p[:, :, :L0].sum(-1))  # (H, Lq)
    f = _independent(r, QUERY, [doc])[0, 0]  # (H, G)
    q_last = GROUPS.index("q_last")
    assert (f[:, q_last] - ratio[:, -1]).abs().max() < 1e-4


def test_independent_scoring_serves_each_pairs_log_odds(arch, tmp_path) -> None:
    """``scoring='independent'`` with a card entry shaped for the model: the scores are the
    entry's affine map of the features, a document scores the same alone, and evidence has a
    share per token; an entry for another depth is refused with a typed error."""
    from heedrank.errors import ValidationError
    from heedrank.reranker.cached.independent import GROUPS

    _, lm = arch
    g = torch.Generator().manual_seed(5)
    n = (LAYER + 1) * lm.num_heads * len(GROUPS)
    entry = {"layers": LAYER + 1, "heads": lm.num_heads, "groups": list(GROUPS),
             "weights": (0.1 * torch.randn(n, generator=g)).tolist(), "bias": -1.0, "fusion_alpha": 0.3,
             "threshold": 0.2}
    card = _write_card(tmp_path / "card.json", lm)
    card.write_text(json.dumps({**json.loads(card.read_text()), "independent": entry}))
    r = _reranker(lm, "independent", scorer_weights=str(card))
    traits = r.serving()
    assert r.scoring == "independent" and r.default_fusion == 0.3 and traits.independent is not None
    assert traits.independent.threshold == 0.2 and traits.scorer is None
    got = _scores(r.rerank(Query("q", QUERY), DOCS))
    feats = _independent(r, QUERY, DOCS).double()
    want = (torch.einsum("nlhg,lhg->n", feats, torch.tensor(entry["weights"], dtype=torch.float64)
                         .reshape(LAYER + 1, lm.num_heads, len(GROUPS))) - 1.0).tolist()
    assert _max_err(got, want) < 1e-4
    alone = _scores_of(r.rerank(Query("q", QUERY), [DOCS[2]]))[DOCS[2].doc_id]
    assert abs(alone - got[2]) < 1e-4
    evidence = r.rerank_with_evidence(Query("q", QUERY), DOCS[:2], max_spans=2)
    assert set(evidence.evidence) == {DOCS[0].doc_id, DOCS[1].doc_id}
    short = {**entry, "layers": LAYER, "weights": entry["weights"][: LAYER * lm.num_heads * len(GROUPS)]}
    card.write_text(json.dumps({**json.loads(card.read_text()), "independent": short}))
    with pytest.raises(ValidationError, match="layer"):
        _reranker(lm, "independent", scorer_weights=str(card)).rerank(Query("q", QUERY), DOCS)


def _scores_of(result) -> dict[str, float]:
    return {h.doc_id: h.score for h in result.ranking.hits}


def test_auto_scoring_keeps_learned_when_the_card_has_an_independent_entry(arch, tmp_path) -> None:
    from heedrank.reranker.cached.independent import GROUPS
    from heedrank.reranker.cached.state import auto_scoring
    from heedrank.reranker.cards import read_card

    _, lm = arch
    card = _write_card(tmp_path / "card.json", lm)
    assert auto_scoring(read_card(card), True) == "learned" and auto_scoring(read_card(card), False) == "calibrated"
    n = (LAYER + 1) * lm.num_heads * len(GROUPS)
    entry = {"layers": LAYER + 1, "heads": lm.num_heads, "groups": list(GROUPS), "weights": [0.01] * n, "bias": 0.0,
             "threshold": 0.5}
    card.write_text(json.dumps({**json.loads(card.read_text()), "independent": entry}))
    assert auto_scoring(read_card(card), True) == "learned"
    assert _reranker(lm, "auto", scorer_weights=str(card)).scoring == "learned"
    assert _reranker(lm, "independent", scorer_weights=str(card)).scoring == "independent"

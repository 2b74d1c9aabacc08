"""Query-side adapter on cached BlockRank: the training score is the served score, the
adapter never touches stored blocks, gradients reach only LoRA, saving/loading and resuming
are exact. Real NFCorpus documents, a shallow l* to keep it fast."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from heedrank.config import RerankerConfig  # noqa: E402
from heedrank.errors import NotFoundError, ValidationError  # noqa: E402
from heedrank.reranker.blockrank import BlockRankReranker  # noqa: E402
from heedrank.reranker.cached import CachedBlockRankReranker  # noqa: E402
from heedrank.reranker.doccache import encode_blocks  # noqa: E402
from heedrank.reranker.lm import load_trainable_lm  # noqa: E402
from heedrank.reranker.adapters import adapter_disabled, has_adapter, inject_lora, load_adapter, save_adapter  # noqa: E402
from heedrank.lab.train.query_adapter import (  # noqa: E402
    QueryAdapterConfig,
    RankingExample,
    base_instruction_kv,
    context_for,
    differentiable_scores,
    sample_candidates,
    train_query_adapter,
)
from heedrank.lab.train.losses import listwise_loss, pairwise_loss  # noqa: E402
from heedrank.types import Document, Query  # noqa: E402
from adapter_helpers import random_query_adapter  # noqa: E402

LAYER = 3
TOKENS = 32


@pytest.fixture(scope="module")
def nf_docs(nfcorpus_head):
    return nfcorpus_head[:8]


@pytest.fixture()
def lm():
    """A private copy of the LM: LoRA is injected in place, never into the shared one."""
    return load_trainable_lm()


def _card(path, lm, seed: int = 0):
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(LAYER + 1) * lm.num_heads)
    from heedrank.reranker.doccache import CACHE_TEMPLATE_VERSION

    path.write_text(json.dumps({"layer": LAYER, "max_doc_tokens": TOKENS, "template": CACHE_TEMPLATE_VERSION,
                                "spec": "heads", "model_sha256": lm.identity.get("sha256"), "weights": w.tolist()}))
    return str(path)


def _reranker(lm, card) -> BlockRankReranker:
    return CachedBlockRankReranker(RerankerConfig(method="blockrank-cached", max_doc_tokens=TOKENS, options={
        "query_adapter": None, "layer": LAYER, "scoring": "learned", "scorer_weights": card}), lm=lm)


def _served(r, query, docs) -> list[float]:
    res = r.rerank(Query("q", query), docs)
    by_id = {h.doc_id: h.score for h in res.ranking.hits}
    return [by_id[d.doc_id] for d in docs]


def _train_scores(r, query, docs, weights=None) -> list[float]:
    prompt = r.build_prompt(query, docs)
    kv = context_for(r, prompt, base_instruction_kv(r))
    w = torch.tensor(r.learned_weights().reshape(-1)) if weights is None else weights
    with torch.no_grad():
        return differentiable_scores(r, prompt, kv, "learned", w).tolist()


def test_training_score_is_the_served_learned_score(lm, nf_docs, tmp_path) -> None:
    r = _reranker(lm, _card(tmp_path / "card.json", lm))
    query = "do statins reduce cancer risk"
    served = _served(r, query, nf_docs[:6])
    trained = _train_scores(r, query, nf_docs[:6])
    # float32 attention, z-scored: agreement to ~1e-5 relative on scores of magnitude ~10
    assert np.allclose(served, trained, rtol=0, atol=1e-4)
    assert np.argsort(served).tolist() == np.argsort(trained).tolist()


def test_adapter_changes_query_passes_not_blocks(lm, nf_docs, tmp_path) -> None:
    r = _reranker(lm, _card(tmp_path / "card.json", lm))
    query = "vitamin d and breast cancer"
    before = _train_scores(r, query, nf_docs[:5])
    kv0 = base_instruction_kv(r)
    prompt = r.build_prompt(query, nf_docs[:5])
    with torch.no_grad():
        blocks_base = encode_blocks(lm, kv0, prompt.doc_ids[:2], LAYER)
    inject_lora(lm.model, 4, 8, ("q_proj", "v_proj", "up_proj"))
    with torch.no_grad():  # a non-zero adapter (LoRA B starts at zero)
        for n, p in lm.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    after = _train_scores(r, query, nf_docs[:5])
    assert max(abs(a - b) for a, b in zip(before, after)) > 1e-3  # the query passes see the adapter
    with torch.no_grad(), adapter_disabled(lm.model):
        blocks_off = encode_blocks(lm, base_instruction_kv(r), prompt.doc_ids[:2], LAYER)
        assert np.allclose(_train_scores(r, query, nf_docs[:5]), before, atol=1e-5)
    with torch.no_grad():  # with the adapter on, encode_blocks still runs the base model: the store stays valid
        blocks_on = encode_blocks(lm, base_instruction_kv(r), prompt.doc_ids[:2], LAYER)
    for (k0, v0), (k1, v1), (k2, v2) in zip(blocks_base, blocks_off, blocks_on):
        assert torch.equal(k0, k1) and torch.equal(v0, v1) and torch.equal(k0, k2) and torch.equal(v0, v2)
    assert np.allclose(_train_scores(r, query, nf_docs[:5]), after, atol=1e-9)  # the adapter is on again


def test_gradient_reaches_lora_only(lm, nf_docs, tmp_path) -> None:
    r = _reranker(lm, _card(tmp_path / "card.json", lm))
    n = inject_lora(lm.model, 4, 8, ("q_proj", "k_proj", "v_proj", "o_proj"), range(LAYER + 1))
    assert n == sum(p.numel() for name, p in lm.model.named_parameters() if "lora_" in name) > 0
    prompt = r.build_prompt("fish oil and heart disease", nf_docs[:4])
    kv = context_for(r, prompt, base_instruction_kv(r))
    with torch.no_grad():
        for name, p in lm.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.01)
    w = torch.tensor(r.learned_weights().reshape(-1), requires_grad=True)
    loss = listwise_loss(differentiable_scores(r, prompt, kv, "learned", w), [1, 0, 0, 2], 1.0)
    loss.backward()
    grads = {name: p.grad for name, p in lm.model.named_parameters() if "lora_" in name}
    # every layer's query and key projections learn (at l* the pass stops after the attention
    # weights, so its o_proj never runs and gets no gradient)
    for layer in range(LAYER + 1):
        for proj in ("q_proj", "k_proj"):
            g = [v for n, v in grads.items() if f"layers.{layer}.self_attn.{proj}.lora_A" in n]
            assert len(g) == 1 and g[0] is not None and float(g[0].abs().sum()) > 0, (layer, proj)
    assert all(v is None for n, v in grads.items() if f"layers.{LAYER}.self_attn.o_proj" in n)
    assert all(p.grad is None for name, p in lm.model.named_parameters() if "lora_" not in name)
    assert w.grad is not None and float(w.grad.abs().sum()) > 0
    assert all(not k.requires_grad and not v.requires_grad for k, v in kv)


def test_listwise_loss_by_hand() -> None:
    s = torch.tensor([2.0, 1.0, 0.0], dtype=torch.float64)
    # positives: grade 1 (weight 1) and grade 2 (weight 3) -> -log((e^2 + 3 e^0) / (e^2 + e + 1))
    want = -math.log((math.e ** 2 + 3.0) / (math.e ** 2 + math.e + 1.0))
    assert float(listwise_loss(s, [1, 0, 2], 1.0)) == pytest.approx(want, rel=1e-12)
    # temperature scales scores: tau = 2 halves them
    want2 = -math.log((math.e + 3.0) / (math.e + math.e ** 0.5 + 1.0))
    assert float(listwise_loss(s, [1, 0, 2], 2.0)) == pytest.approx(want2, rel=1e-12)


def test_pairwise_loss_by_hand() -> None:
    s = torch.tensor([0.5, 1.0, -0.2], dtype=torch.float64)
    sp = lambda x: math.log1p(math.exp(-x))  # noqa: E731
    # pairs (better, worse, weight): (0, 1, 1), (2, 1, 2), (2, 0, 1) for grades [1, 0, 2]
    want = (1 * sp(0.5 - 1.0) + 2 * sp(-0.2 - 1.0) + 1 * sp(-0.2 - 0.5)) / 4
    assert float(pairwise_loss(s, [1, 0, 2], 1.0)) == pytest.approx(want, rel=1e-12)
    assert float(pairwise_loss(s, [1, 0, 2], 2.0)) == pytest.approx(
        (sp(-0.25) + 2 * sp(-0.6) + sp(-0.35)) / 4, rel=1e-12)
    flat = s.clone().requires_grad_(True)
    assert float(pairwise_loss(flat, [0, 0, 0], 1.0).detach()) == 0.0  # no pair of different grades
    with pytest.raises(ValidationError, match="loss must be"):
        QueryAdapterConfig(out_dir="x", loss="pointwise")


def test_training_warm_starts_from_an_adapter(lm, nf_docs, tmp_path) -> None:
    """``init``: step 0 scores what the given adapter scores; another LoRA config is refused."""
    card = _card(tmp_path / "card.json", lm)
    path, _ = random_query_adapter(tmp_path, lm.identity, layer=LAYER, tokens=TOKENS)
    examples = [RankingExample("q0", "statins and cancer", tuple(nf_docs[:4]), (1, 0, 0, 0))]
    seen = []

    def evaluate(reranker, weights):
        seen.append(_train_scores(reranker, "statins and cancer", nf_docs[:4], weights))
        return {"dev": 0.0}

    cfg = QueryAdapterConfig(out_dir=str(tmp_path / "run"), steps=1, batch_queries=1, max_candidates=4, lora_r=4, lora_alpha=8,
                             target_modules=("q_proj", "k_proj", "v_proj", "o_proj"), eval_every=1, lr=1e-3,
                             init=str(path), loss="pairwise")
    train_query_adapter(_reranker(lm, card), examples, cfg, evaluate=evaluate, show_progress=False)
    want_lm = load_trainable_lm()
    load_adapter(path, want_lm.model, want_lm.identity)
    want = _train_scores(_reranker(want_lm, _card(tmp_path / "card2.json", want_lm)), "statins and cancer", nf_docs[:4])
    base = _train_scores(_reranker(load_trainable_lm(), _card(tmp_path / "card3.json", lm)), "statins and cancer",
                         nf_docs[:4])
    assert seen[0] == pytest.approx(want, abs=1e-6) and seen[0] != pytest.approx(base, abs=1e-4)
    other = QueryAdapterConfig(**{**cfg.__dict__, "out_dir": str(tmp_path / "run2"), "lora_r": 2})
    with pytest.raises(ValidationError, match="has LoRA"):
        train_query_adapter(_reranker(load_trainable_lm(), card), examples, other, show_progress=False)


def test_sample_candidates_keeps_order_caps_positives() -> None:
    docs = tuple(Document(f"d{i}", f"text {i}") for i in range(10))
    grades = (0, 1, 0, 1, 1, 0, 0, 1, 0, 0)
    ex = RankingExample("q", "query", docs, grades)
    picked, g = sample_candidates(ex, 5, 2, random.Random(0))
    ids = [d.doc_id for d in picked]
    assert len(picked) == 5 and sum(1 for x in g if x > 0) == 2
    assert ids == sorted(ids, key=lambda d: int(d[1:]))  # first-stage order kept
    assert [d for d, x in zip(ids, g) if x == 0] == ["d0", "d2", "d5"]  # hardest negatives first
    assert sample_candidates(RankingExample("q", "x", docs[:2], (0, 0)), 5, 2, random.Random(0)) is None


def test_save_load_roundtrip_and_wrong_model(lm, nf_docs, tmp_path) -> None:
    r = _reranker(lm, _card(tmp_path / "card.json", lm))
    inject_lora(lm.model, 4, 8, ("q_proj", "v_proj"))
    with torch.no_grad():
        for name, p in lm.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    w = torch.tensor(r.learned_weights().reshape(-1)) * 1.5
    card = {"model": lm.identity, "lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}}
    save_adapter(tmp_path / "ad", lm.model, card, w)
    want = _train_scores(r, "omega 3 and depression", nf_docs[:4], w)
    fresh = load_trainable_lm()
    _, loaded_w = load_adapter(tmp_path / "ad", fresh.model, fresh.identity)
    r2 = _reranker(fresh, _card(tmp_path / "card2.json", fresh))
    got = _train_scores(r2, "omega 3 and depression", nf_docs[:4], loaded_w.double())
    assert np.allclose(want, got, atol=1e-6)
    with pytest.raises(ValidationError, match="trained for model"):
        load_adapter(tmp_path / "ad", load_trainable_lm().model, {"sha256": "other"})
    with pytest.raises(NotFoundError, match="train one"):
        load_adapter(tmp_path / "missing", fresh.model)


def test_training_resumes_from_its_checkpoint(lm, nf_docs, tmp_path) -> None:
    card = _card(tmp_path / "card.json", lm)
    examples = [RankingExample(f"q{i}", q, tuple(nf_docs[i : i + 4]), (1, 0, 0, 0))
                for i, q in enumerate(["statins and cancer", "vitamin d deficiency", "fish oil heart"])]
    calls = []

    def evaluate(reranker, weights):
        calls.append(1)
        return {"dev": float(len(calls))}  # strictly increasing: every evaluation is the new best

    cfg = QueryAdapterConfig(out_dir=str(tmp_path / "run"), steps=2, batch_queries=1, max_candidates=4,
                             lora_r=2, checkpoint_every=1, eval_every=1, lr=1e-3, train_weights=True)
    s1 = train_query_adapter(_reranker(lm, card), examples, cfg, evaluate=evaluate, show_progress=False)
    assert s1["steps"] == 2 and s1["best"]["step"] == 2
    assert (tmp_path / "run" / "best" / "adapter.safetensors").is_file()
    # a longer run over the same folder continues at step 2, with the same LoRA tensors
    more = QueryAdapterConfig(**{**cfg.__dict__, "steps": 3})
    fresh = load_trainable_lm()
    s2 = train_query_adapter(_reranker(fresh, _card(tmp_path / "card2.json", fresh)), examples, more,
                             evaluate=evaluate, show_progress=False)
    assert s2["steps"] == 3 and s2["steps_this_run"] == 1
    assert [h["step"] for h in s2["history"] if "loss" in h] == [1, 2, 3]
    with pytest.raises(ValidationError, match="relevant and a non-relevant"):
        train_query_adapter(_reranker(load_trainable_lm(), card), [examples[0].__class__("q", "x", (nf_docs[0],), (0,))],
                            cfg, show_progress=False)


def test_served_scores_with_the_query_adapter_option(default_lm, nf_docs, tmp_path) -> None:
    card = _card(tmp_path / "card.json", default_lm)
    path, carrier = random_query_adapter(tmp_path, default_lm.identity, layer=LAYER, tokens=TOKENS)
    served_r = CachedBlockRankReranker(RerankerConfig(method="blockrank-cached", max_doc_tokens=TOKENS, options={
        "layer": LAYER, "scoring": "learned", "scorer_weights": card,
        "query_adapter": str(path)}), lm=default_lm)
    query = "omega 3 fatty acids and depression"
    served = _served(served_r, query, nf_docs[:5])
    want = _train_scores(_reranker(carrier, card), query, nf_docs[:5])  # the model the adapter was built in
    assert np.allclose(served, want, rtol=0, atol=1e-4)
    base = _served(_reranker(default_lm, card), query, nf_docs[:5])
    assert max(abs(a - b) for a, b in zip(served, base)) > 1e-3  # the adapter changes the query passes
    assert not has_adapter(default_lm.model)  # the shared LM is untouched: the reranker works on a copy
    assert served_r.describe()["query_adapter"]["step"] == 7
    # blocks stay the base model's: the store a plain cached reranker builds serves this one
    assert served_r.encode_block_arrays([nf_docs[0].content])[0][1].tolist() == \
        _reranker(default_lm, card).encode_block_arrays([nf_docs[0].content])[0][1].tolist()


def test_query_adapter_option_refuses_a_mismatch(default_lm, tmp_path) -> None:
    path, _ = random_query_adapter(tmp_path, default_lm.identity, layer=2, tokens=TOKENS)
    r = CachedBlockRankReranker(RerankerConfig(method="blockrank-cached", max_doc_tokens=TOKENS, options={
        "scoring": "signal", "layer": LAYER, "query_adapter": str(path)}), lm=default_lm)
    with pytest.raises(ValidationError, match="trained for"):
        _ = r.lm
    with pytest.raises(ValidationError, match="unknown blockrank option 'query_adapter'"):
        RerankerConfig(method="blockrank", options={"query_adapter": "packaged"})
    with pytest.raises(NotFoundError, match="not a query adapter"):
        _ = CachedBlockRankReranker(RerankerConfig(method="blockrank-cached", max_doc_tokens=TOKENS, options={
            "scoring": "signal", "layer": LAYER, "query_adapter": str(tmp_path / "none")}), lm=default_lm).lm



def _independent_card(path, lm, seed: int = 1):
    """A card with learned weights and a random ``independent`` entry for ``l* = LAYER``."""
    from heedrank.reranker.cached.independent import GROUPS

    data = json.loads(open(_card(path, lm)).read())
    rng = np.random.default_rng(seed)
    data["independent"] = {"layers": LAYER + 1, "heads": lm.num_heads, "groups": list(GROUPS), "bias": -2.0,
                           "threshold": 0.5, "layer": LAYER, "max_doc_tokens": TOKENS,
                           "weights": (0.1 * rng.normal(size=(LAYER + 1) * lm.num_heads * len(GROUPS))).tolist()}
    path.write_text(json.dumps(data))
    return str(path)


def test_the_independent_objective_is_the_served_independent_score(default_lm, nf_docs, tmp_path) -> None:
    """Oracle: the training path of ``objective="independent"`` (query and N/A blocks against
    block 0, with gradients) gives the served ``scoring='independent'`` log-odds, adapter on; and
    its gradient reaches the LoRA tensors."""
    from heedrank.lab.train.query_adapter import independent_scores
    from heedrank.reranker.cached.state import independent_weights

    card = _independent_card(tmp_path / "card.json", default_lm)
    path, carrier = random_query_adapter(tmp_path, default_lm.identity, layer=LAYER, tokens=TOKENS)
    opts = {"layer": LAYER, "scoring": "independent", "scorer_weights": card}
    served_r = CachedBlockRankReranker(RerankerConfig(method="blockrank-cached", max_doc_tokens=TOKENS, options={
        **opts, "query_adapter": str(path)}), lm=default_lm)
    query = "omega 3 fatty acids and depression"
    docs = nf_docs[:5]
    served = served_r.score_documents(query, docs).scores
    r = CachedBlockRankReranker(RerankerConfig(method="blockrank-cached", max_doc_tokens=TOKENS, options={
        **opts, "query_adapter": None}), lm=carrier)  # the model the adapter was built in
    state = r.loaded()
    weights = independent_weights(state.card, state.lm, r.layer)
    prompt = r.build_prompt(query, docs)
    kv = context_for(r, prompt, base_instruction_kv(r))
    trained = independent_scores(r, prompt, kv, weights)
    assert np.allclose(served, trained.detach().numpy(), rtol=0, atol=1e-4)
    base = CachedBlockRankReranker(RerankerConfig(method="blockrank-cached", max_doc_tokens=TOKENS, options={
        **opts, "query_adapter": None}), lm=default_lm).score_documents(query, docs).scores
    assert max(abs(a - b) for a, b in zip(served, base)) > 1e-3  # the adapter changes the score
    for p in carrier.model.parameters():
        p.requires_grad_(False)
    lora = [p for n, p in carrier.model.named_parameters() if "lora_" in n]
    for p in lora:
        p.requires_grad_(True)
    listwise_loss(independent_scores(r, prompt, kv, weights), [1, 0, 0, 1, 0], 1.0).backward()
    assert sum(float(p.grad.abs().sum()) for p in lora if p.grad is not None) > 0

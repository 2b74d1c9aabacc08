"""The document tower (issue #24 lever 3): a LoRA adapter active only while candidate blocks
are encoded. Training moves it and nothing else (the query adapter stays fixed, the base
model's blocks stay the base model's); the reranker served with ``document_adapter`` scores
what training scored, and its store header names the adapter. Real NFCorpus documents, a
shallow l*."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from heedrank.config import RerankerConfig  # noqa: E402
from heedrank.errors import ValidationError  # noqa: E402
from heedrank.reranker.adapters import DOCUMENT, QUERY, adapter_hash, adapter_state, inject_lora, only_adapter  # noqa: E402
from heedrank.reranker.blockrank import BlockRankReranker  # noqa: E402
from heedrank.reranker.doccache import assemble_kv, encode_blocks  # noqa: E402
from heedrank.reranker.lm import load_trainable_lm  # noqa: E402
from heedrank.reranker.query_adapter import (  # noqa: E402
    QueryAdapterConfig,
    RankingExample,
    _with_in_batch,
    base_instruction_kv,
    differentiable_scores,
    train_query_adapter,
)
from heedrank.types import Document, Query  # noqa: E402
from adapter_helpers import TARGETS, random_query_adapter  # noqa: E402

LAYER = 3
TOKENS = 32


@pytest.fixture(scope="module")
def nf_docs(nfcorpus_head):
    return nfcorpus_head[:8]


def _card(path, lm) -> str:
    from heedrank.reranker.doccache import CACHE_TEMPLATE_VERSION

    w = np.random.default_rng(0).normal(size=(LAYER + 1) * lm.num_heads)
    path.write_text(json.dumps({"layer": LAYER, "max_doc_tokens": TOKENS, "template": CACHE_TEMPLATE_VERSION,
                                "spec": "heads", "model_sha256": lm.identity.get("sha256"), "weights": w.tolist()}))
    return str(path)


def _query_adapter(tmp_path, identity):
    return random_query_adapter(tmp_path, identity, layer=LAYER, tokens=TOKENS, name="qa")[0]


def _reranker(lm, card, **options) -> BlockRankReranker:
    return BlockRankReranker(RerankerConfig(method="blockrank-cached", max_doc_tokens=TOKENS, options={
        "layer": LAYER, "scoring": "learned", "scorer_weights": card, **options}), lm=lm)


def _scores(r, query, docs, adapter) -> list[float]:
    """The training path's scores with blocks encoded under ``adapter`` (None: base model)."""
    prompt = r.build_prompt(query, docs)
    kv0 = base_instruction_kv(r)
    with torch.no_grad():
        blocks = encode_blocks(r.lm, kv0, prompt.doc_ids, LAYER, adapter=adapter)
        kv = assemble_kv(kv0, blocks, LAYER)
        w = torch.tensor(r.learned_weights().reshape(-1))
        return differentiable_scores(r, prompt, kv, "learned", w, kv0).tolist()


def test_document_tower_trains_its_adapter_only(default_lm, nf_docs, tmp_path) -> None:
    card = _card(tmp_path / "card.json", default_lm)
    qa = _query_adapter(tmp_path, default_lm.identity)
    r = _reranker(default_lm, card, query_adapter=str(qa))
    query = "statins and cancer"
    before = _scores(r, query, nf_docs[:4], None)
    query_lora = adapter_state(r.lm.model, QUERY)
    examples = [RankingExample(f"q{i}", q, tuple(nf_docs[i : i + 4]), (1, 0, 0, 0))
                for i, q in enumerate([query, "vitamin d deficiency", "fish oil heart"])]
    cfg = QueryAdapterConfig(out_dir=str(tmp_path / "run"), steps=3, batch_queries=2, max_candidates=4, lora_r=4,
                             lora_alpha=8, target_modules=TARGETS, lr=5e-3, eval_every=0, tower="document",
                             in_batch=1, loss="pairwise")
    summary = train_query_adapter(r, examples, cfg, show_progress=False)
    assert summary["steps"] == 3
    assert r.block_adapter == DOCUMENT
    after_q = adapter_state(r.lm.model, QUERY)
    assert all(torch.equal(query_lora[n], after_q[n]) for n in query_lora)  # the query side is fixed
    doc = adapter_state(r.lm.model, DOCUMENT)
    assert doc and any(float(t.abs().sum()) > 0 for n, t in doc.items() if "lora_B" in n)  # it moved from zero
    # the base model's blocks (and so a base store) are unchanged; the document tower's differ
    assert np.allclose(_scores(r, query, nf_docs[:4], None), before, atol=1e-6)
    moved = _scores(r, query, nf_docs[:4], DOCUMENT)
    assert max(abs(a - b) for a, b in zip(moved, before)) > 1e-4
    # the dev callback's path (context_for: the reranker's block source) encodes with the tower too
    from heedrank.reranker.query_adapter import context_for

    r.block_source().memory.clear()
    prompt = r.build_prompt(query, nf_docs[:4])
    kv0 = base_instruction_kv(r)
    with torch.no_grad():
        w = torch.tensor(r.learned_weights().reshape(-1))
        via = differentiable_scores(r, prompt, context_for(r, prompt, kv0), "learned", w, kv0).tolist()
    assert np.allclose(via, moved, atol=1e-6)
    card_out = json.loads((tmp_path / "run" / "final" / "adapter.json").read_text())
    assert card_out["tower"] == "document" and card_out["query_adapter"]["sha256"] == adapter_hash(qa)


def test_document_adapter_option_serves_the_trained_blocks(default_lm, nf_docs, tmp_path) -> None:
    card = _card(tmp_path / "card.json", default_lm)
    qa = _query_adapter(tmp_path, default_lm.identity)
    trainer = _reranker(load_trainable_lm(), card, query_adapter=str(qa))
    examples = [RankingExample("q0", "omega 3 and depression", tuple(nf_docs[:4]), (1, 0, 0, 0))]
    cfg = QueryAdapterConfig(out_dir=str(tmp_path / "run"), steps=2, batch_queries=1, max_candidates=4, lora_r=4,
                             lora_alpha=8, target_modules=TARGETS, lr=5e-3, eval_every=0, tower="document")
    train_query_adapter(trainer, examples, cfg, show_progress=False)
    path = tmp_path / "run" / "final"
    want = _scores(trainer, "omega 3 and depression", nf_docs[:5], DOCUMENT)
    served_r = _reranker(default_lm, card, query_adapter=str(qa), document_adapter=str(path))
    res = served_r.rerank(Query("q", "omega 3 and depression"), nf_docs[:5])
    by_id = {h.doc_id: h.score for h in res.ranking.hits}
    assert np.allclose([by_id[d.doc_id] for d in nf_docs[:5]], want, rtol=0, atol=1e-4)
    assert served_r.block_store_header().adapter_hash == adapter_hash(path)
    assert served_r.describe()["document_adapter"]["sha256"] == adapter_hash(path)
    plain = _reranker(default_lm, card, query_adapter=str(qa))
    assert plain.block_store_header().adapter_hash is None  # a base store never serves the document tower
    assert not np.allclose(served_r.encode_block_arrays([nf_docs[0].content])[0][1],
                           plain.encode_block_arrays([nf_docs[0].content])[0][1])
    with pytest.raises(ValidationError, match="query-side adapter"):  # a query adapter is not a document one
        _ = _reranker(default_lm, card, document_adapter=str(qa)).lm


def test_only_adapter_runs_one_adapter_and_restores(default_lm, nf_docs, tmp_path) -> None:
    lm = load_trainable_lm()
    inject_lora(lm.model, 4, 8, TARGETS, range(LAYER + 1), DOCUMENT)
    with torch.no_grad():
        for name, p in lm.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
    r = _reranker(lm, _card(tmp_path / "card.json", lm))
    base = _reranker(load_trainable_lm(), _card(tmp_path / "card2.json", lm))
    # a document adapter alone never runs in the query passes; it runs inside only_adapter
    assert np.allclose(_scores(r, "x", nf_docs[:3], None), _scores(base, "x", nf_docs[:3], None), atol=1e-6)
    with only_adapter(lm.model, DOCUMENT):
        pass
    assert np.allclose(_scores(r, "x", nf_docs[:3], None), _scores(base, "x", nf_docs[:3], None), atol=1e-6)
    assert not np.allclose(_scores(r, "x", nf_docs[:3], DOCUMENT), _scores(base, "x", nf_docs[:3], None), atol=1e-4)


def test_in_batch_negatives() -> None:
    docs = tuple(Document(f"d{i}", f"text {i}") for i in range(6))
    a = RankingExample("a", "qa", docs[:3], (1, 0, 0))
    b = RankingExample("b", "qb", (docs[3], docs[0], docs[4]), (1, 1, 0))
    c = RankingExample("c", "qc", (docs[5],), (1,))
    got, grades = _with_in_batch(a, list(a.documents), list(a.grades), [a, b, c], 2, random.Random(0))
    # b's positives minus what a already lists (d0), then c's; all graded 0, appended
    assert [d.doc_id for d in got] == ["d0", "d1", "d2", "d3", "d5"] and grades == [1, 0, 0, 0, 0]
    got, _ = _with_in_batch(a, list(a.documents), list(a.grades), [a, b, c], 1, random.Random(0))
    assert len(got) == 4
    with pytest.raises(ValidationError, match="in_batch"):
        QueryAdapterConfig(out_dir="x", in_batch=1)
    with pytest.raises(ValidationError, match="tower"):
        QueryAdapterConfig(out_dir="x", tower="both")

"""BlockRank fine-tuning: a tiny configuration runs, lowers the loss, resumes, and loads as a reranker."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from heedrank.config import RerankerConfig  # noqa: E402
from heedrank.errors import ValidationError  # noqa: E402
from heedrank.types import Document, Query  # noqa: E402
from heedrank.reranker.blockrank import BlockRankReranker  # noqa: E402
from heedrank.lab.train.blockrank import TrainConfig, TrainingExample, example_losses, train_blockrank  # noqa: E402

DOCS = (
    Document("cat", "Cats are small furry pets."),
    Document("water", "Water boils at 100 degrees Celsius at sea level."),
    Document("rome", "Rome is the capital of Italy."),
)
EXAMPLES = [
    TrainingExample("q1", "boiling point of water", DOCS, target=1, positives=(1,)),
    TrainingExample("q2", "capital of Italy", DOCS, target=2, positives=(2,)),
]


def test_losses_are_finite_and_aux_is_differentiable(default_lm):
    cfg = TrainConfig(out_dir="unused", max_doc_tokens=16, aux_only=True)
    r = BlockRankReranker(RerankerConfig(method="blockrank", max_doc_tokens=16), lm=default_lm)
    with torch.no_grad():
        losses = example_losses(r, EXAMPLES[0], cfg)
    assert losses["ntp"] is None
    assert 0.0 < float(losses["aux"]) < 10.0
    with torch.no_grad():
        both = example_losses(r, EXAMPLES[0], TrainConfig(out_dir="unused", max_doc_tokens=16))
    assert float(both["ntp"]) > 0.0
    assert float(both["aux"]) == pytest.approx(float(losses["aux"]), abs=1e-4)  # same l* attention either way
    assert float(both["total"]) == pytest.approx(float(both["ntp"]) + 0.1 * float(both["aux"]), rel=1e-5)


def test_tiny_aux_only_run_resumes_and_loads(tmp_path):
    out = tmp_path / "run"
    cfg = TrainConfig(out_dir=str(out), max_doc_tokens=16, steps=3, grad_accum=2, lr=1e-4, checkpoint_every=2,
                      eval_every=2, aux_only=True)
    summary = train_blockrank(EXAMPLES, cfg, dev_examples=EXAMPLES[:1], show_progress=False)
    assert summary["steps"] == 3
    hist = [h for h in summary["history"] if "loss" in h]
    assert len(hist) == 3 and all(h["aux"] > 0 and "ntp" not in h for h in hist)
    assert (out / "losses.png").stat().st_size > 1000
    assert (out / "model.safetensors").exists() and (out / "checkpoints" / "step-3").exists()
    # resuming with more steps continues from step 3
    more = train_blockrank(EXAMPLES, TrainConfig(**{**cfg.__dict__, "steps": 4}), show_progress=False)
    assert more["steps"] == 4 and more["steps_this_run"] == 1
    meta = json.loads((out / "heedrank-train.json").read_text())
    assert meta["config"]["steps"] == 4
    # the output directory loads as the reranker's model
    r = BlockRankReranker(RerankerConfig(method="blockrank", model=str(out), max_doc_tokens=16))
    res = r.rerank(Query("q", "boiling point of water"), list(DOCS))
    assert sorted(res.ranking.doc_ids) == ["cat", "rome", "water"]


@pytest.mark.slow
def test_full_objective_lowers_the_training_loss(tmp_path):
    cfg = TrainConfig(out_dir=str(tmp_path / "full"), max_doc_tokens=16, steps=6, grad_accum=2, lr=1e-4,
                      checkpoint_every=6, eval_every=6)
    summary = train_blockrank(EXAMPLES, cfg, show_progress=False)
    hist = [h for h in summary["history"] if "loss" in h]
    assert all(h["ntp"] > 0 for h in hist)
    assert hist[-1]["loss"] < hist[0]["loss"]


def test_freeze_below_trains_only_the_upper_layers(tmp_path):
    from safetensors.torch import load_file

    from heedrank.reranker.lm import load_trainable_lm

    base = load_trainable_lm().model.state_dict()
    out = tmp_path / "frozen"
    cfg = TrainConfig(out_dir=str(out), max_doc_tokens=16, steps=1, grad_accum=1, lr=1e-3, checkpoint_every=10,
                      eval_every=10, aux_only=True, layer=4, freeze_below=3)
    train_blockrank(EXAMPLES[:1], cfg, show_progress=False)
    tuned = load_file(str(out / "model.safetensors"))
    assert torch.equal(tuned["model.embed_tokens.weight"], base["model.embed_tokens.weight"])
    assert torch.equal(tuned["model.layers.2.self_attn.q_proj.weight"], base["model.layers.2.self_attn.q_proj.weight"])
    assert not torch.equal(tuned["model.layers.3.mlp.up_proj.weight"], base["model.layers.3.mlp.up_proj.weight"])
    with pytest.raises(ValidationError, match="freeze_below"):
        train_blockrank(EXAMPLES[:1], TrainConfig(out_dir=str(tmp_path / "bad"), freeze_below=99, aux_only=True),
                        show_progress=False)

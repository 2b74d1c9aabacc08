"""BlockRank fine-tuning with the auxiliary contrastive attention loss.

Source: Gupta et al. 2025, "Scalable In-context Ranking with Generative Models"
(arXiv 2510.05396), Section 4 (repo nilesh2797/BlockRank, ``losses.py``); docs/design/algorithms.md
section 3:

    L = L_NTP + lambda * L_aux,   L_aux = -log( sum_{p in pos} exp(S_p / tau) / sum_k exp(S_k / tau) )

with ``S`` the signal tokens' block-restricted attention at layer ``l*``
(:func:`heedrank.reranker.blockforward.signal_scores`), ``lambda = 0.1``, ``tau = 0.05``. ``L_NTP`` is the
cross-entropy of the relevant document's id and the closing ``]`` after the answer prefix
``Final Answer: [``; LM logits are computed for those answer tokens only. Training runs
through the same exact linear block forward as inference (:func:`heedrank.reranker.blockforward.context_kv`,
:func:`heedrank.reranker.blockforward.query_pass`), never the dense 4-D mask. ``aux_only`` runs layers
``0..l*`` only (no LM head, no NTP).

Checkpoints (``out/checkpoints/step-N``: weights or LoRA adapter, optimizer, the sampler
and RNG state), written by the shared loop :func:`heedrank.lab.train.loop.run_loop`, make a run
resumable; the final model is saved to ``out/`` (LoRA merged) with its tokenizer and
loads as a reranker model (``--model out``).
"""

from __future__ import annotations

import json
import logging
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heedrank.config import RerankerConfig
from heedrank.errors import ValidationError
from heedrank.lab.train.losses import weighted_listwise_loss
from heedrank.lab.train.loop import Checkpoints, LoopConfig, run_loop
from heedrank.reranker.options import CachedBlockRankOptions
from heedrank.types import Document

if TYPE_CHECKING:
    from heedrank.reranker.blockrank import BlockRankReranker

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainingExample:
    """One training query: candidates in prompt order and the target.

    Attributes:
        query_id: Query identifier.
        query: Query text.
        documents: Candidates (shuffled; hard negatives plus positives).
        target: Index of the positive whose ``ID: i`` label (``BlockPrompt.labels``) is the
            next-token target.
        positives: Indices of every relevant candidate (all count in ``L_aux``).
    """

    query_id: str
    query: str
    documents: tuple[Document, ...]
    target: int
    positives: tuple[int, ...]


@dataclass(frozen=True)
class TrainConfig:
    """Options of a BlockRank fine-tuning run (see ``heedrank lab train blockrank --help``)."""

    out_dir: str
    model: str | None = None
    max_doc_tokens: int = CachedBlockRankOptions.default_max_doc_tokens
    layer: int | None = None
    aux_lambda: float = 0.1
    tau: float = 0.05
    aux_only: bool = False
    lora: bool = False
    lora_r: int = 16
    lora_alpha: int = 32
    freeze_below: int = 0
    lr: float = 2e-5
    weight_decay: float = 0.0
    steps: int = 100
    grad_accum: int = 4
    max_grad_norm: float = 1.0
    checkpoint_every: int = 25
    eval_every: int = 25
    keep_checkpoints: int = 2
    seed: int = 0
    device: str = "cpu"


def example_losses(reranker: BlockRankReranker, ex: TrainingExample, cfg: TrainConfig) -> dict[str, Any]:
    """``{"total", "aux", "ntp"}`` loss tensors of one example (``ntp`` is None with ``aux_only``).

    Each is a 0-d float tensor (``aux``: float32 from the signal scores ``(N,)``; ``ntp``:
    float32 cross-entropy over the answer tokens), differentiable when called with grad enabled.
    """
    import torch

    from heedrank.reranker.attention import AttentionCapture
    from heedrank.reranker.blockforward import context_kv, query_pass, signal_scores
    from heedrank.reranker.prompt import encode_trusted

    lm = reranker.lm
    layer = reranker.layer
    prompt = reranker.build_prompt(ex.query, ex.documents)
    Lq = len(prompt.query_ids)
    rows = slice(Lq - prompt.n_signal, Lq)
    grad = torch.is_grad_enabled()
    ntp = None
    if cfg.aux_only:
        kv, _ = context_kv(lm, prompt, layer)
        cap = AttentionCapture(layers={layer}, rows=rows, mode="logits", stop_after=layer, detach=not grad)
        query_pass(lm, prompt, kv, cap)
    else:
        answer = encode_trusted(lm.tokenizer, f"{prompt.labels[ex.target]}]")  # the target's ID label
        kv, _ = context_kv(lm, prompt, lm.num_layers - 1)
        cap = AttentionCapture(layers={layer}, rows=rows, mode="logits", stop_after=None, detach=not grad)
        out = query_pass(lm, prompt, kv, cap, query_ids=prompt.query_ids + answer, stop=False)
        hidden = out.last_hidden_state[0, Lq - 1 : Lq - 1 + len(answer)]
        logits = lm.model.lm_head(hidden)
        ntp = torch.nn.functional.cross_entropy(logits.float(), torch.tensor(answer, device=logits.device))
    S = signal_scores(cap.out[layer], len(prompt.instruction_ids), prompt.doc_lengths)
    z = S / cfg.tau
    gains = torch.zeros_like(z)
    gains[torch.tensor(list(ex.positives), device=z.device)] = 1.0
    aux = weighted_listwise_loss(z, gains)  # minus the log of the positives' softmax mass
    total = cfg.aux_lambda * aux if ntp is None else ntp + cfg.aux_lambda * aux
    return {"total": total, "aux": aux, "ntp": ntp}


class _BlockRankTask:
    """:class:`heedrank.lab.train.loop.TrainingTask` of BlockRank fine-tuning: ``grad_accum``
    examples per optimizer step; checkpoints hold the weights (full fine-tuning) or the LoRA
    adapter, and the optimizer."""

    def __init__(self, reranker: BlockRankReranker, peft_model: Any, opt: Any, params: list[Any],
                 examples: Sequence[TrainingExample], cfg: TrainConfig) -> None:
        self.reranker, self.peft_model, self.opt, self.params = reranker, peft_model, opt, params
        self.examples, self.cfg = examples, cfg

    def train_step(self, draw: Callable[[], int], rng: random.Random) -> dict[str, float]:
        import torch

        cfg = self.cfg
        self.reranker.lm.model.train()
        self.opt.zero_grad(set_to_none=True)
        agg = {"total": 0.0, "aux": 0.0, "ntp": 0.0}
        for _ in range(cfg.grad_accum):
            losses = example_losses(self.reranker, self.examples[draw()], cfg)
            (losses["total"] / cfg.grad_accum).backward()
            for k in agg:
                if losses[k] is not None:
                    agg[k] += float(losses[k].detach()) / cfg.grad_accum
        torch.nn.utils.clip_grad_norm_(self.params, cfg.max_grad_norm)
        self.opt.step()
        rec = {"loss": agg["total"], "aux": agg["aux"]}
        if not cfg.aux_only:
            rec["ntp"] = agg["ntp"]
        return rec

    def save_state(self, folder: Path) -> None:
        import torch

        lm = self.reranker.lm
        if self.peft_model is not None:
            self.peft_model.save_pretrained(str(folder / "adapter"))
        else:
            from safetensors.torch import save_file

            sd = {k: v.detach().contiguous() for k, v in lm.model.state_dict().items()}
            if getattr(lm.model.config, "tie_word_embeddings", False):
                sd.pop("lm_head.weight", None)
            save_file(sd, str(folder / "model.safetensors"))
        torch.save(self.opt.state_dict(), folder / "optimizer.pt")

    def load_state(self, folder: Path) -> None:
        """The optimizer, and the weights of full fine-tuning (a LoRA adapter was read when the
        model was built: :func:`train_blockrank`)."""
        import torch

        if self.peft_model is None:
            from safetensors.torch import load_file

            self.reranker.lm.model.load_state_dict(load_file(str(folder / "model.safetensors")), strict=False)
        self.opt.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=False))

    def dev_loss(self, dev_examples: Sequence[TrainingExample]) -> float:
        """Mean auxiliary loss of ``dev_examples`` (no gradient)."""
        import torch

        model = self.reranker.lm.model
        model.eval()
        with torch.no_grad():
            vals = [float(example_losses(self.reranker, ex, self.cfg)["aux"]) for ex in dev_examples]
        model.train()
        return sum(vals) / len(vals)


def checkpoints_of(out: str | Path, keep: int = 2) -> Checkpoints:
    """The checkpoints of a BlockRank run in ``out``: ``out/checkpoints/step-N``."""
    return Checkpoints.numbered(Path(out) / "checkpoints", keep=keep)


def train_blockrank(
    examples: Sequence[TrainingExample],
    cfg: TrainConfig,
    *,
    dev_examples: Sequence[TrainingExample] = (),
    show_progress: bool = True,
) -> dict[str, Any]:
    """Fine-tune the LM for BlockRank; resumes from the latest checkpoint in ``cfg.out_dir``.

    Runs :func:`heedrank.lab.train.loop.run_loop`: ``cfg.grad_accum`` examples per step (sampled
    by the loop, seeded), the dev auxiliary loss (``dev_aux``, lower is better) at step 0,
    every ``cfg.eval_every`` steps and at the end, a checkpoint every ``cfg.checkpoint_every``
    steps (the last ``cfg.keep_checkpoints`` kept).

    Returns:
        Summary: steps, seconds per step, history (per-step ``loss``/``aux``/``ntp`` records
        and ``dev_aux`` records), best dev record, final model folder, loss plot.

    Raises:
        ValidationError: no examples, or options that do not fit the model.
    """
    import torch

    from heedrank.reranker.blockrank import BlockRankReranker
    from heedrank.reranker.lm import LoadedLM, load_trainable_lm

    if not examples:
        raise ValidationError("no training examples")
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    checkpoints = checkpoints_of(out, cfg.keep_checkpoints)
    resume = checkpoints.latest()
    lm = load_trainable_lm(cfg.model, device=cfg.device)
    peft_model = None
    if cfg.lora:
        from peft import LoraConfig, PeftModel, get_peft_model

        lcfg = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                          target_modules=["q_proj", "k_proj", "v_proj", "o_proj"])
        if resume is not None:
            peft_model = PeftModel.from_pretrained(lm.model, str(resume / "adapter"), is_trainable=True)
        else:
            peft_model = get_peft_model(lm.model, lcfg)
        lm = LoadedLM(peft_model.get_base_model(), lm.tokenizer, lm.identity, lm.device)
    reranker = BlockRankReranker(
        RerankerConfig(method="blockrank", max_doc_tokens=cfg.max_doc_tokens, device=cfg.device,
                       options={} if cfg.layer is None else {"layer": cfg.layer}),
        lm=lm,
    )
    if cfg.freeze_below:
        _freeze_below(lm, cfg.freeze_below)
    params = [p for p in lm.model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    task = _BlockRankTask(reranker, peft_model, opt, params, examples, cfg)
    loop_cfg = LoopConfig(steps=cfg.steps, checkpoint_every=cfg.checkpoint_every, eval_every=cfg.eval_every,
                          seed=cfg.seed, metric="dev_aux", higher_is_better=False, desc="train blockrank")
    result = run_loop(task, len(examples), loop_cfg, checkpoints,
                      evaluate=(lambda step: {"dev_aux": task.dev_loss(dev_examples)}) if dev_examples else None,
                      show_progress=show_progress)
    state, steps_run = result.state, result.steps_this_run
    final = _save_final(out, lm, peft_model)
    plot_losses(state.history, out / "losses.png")
    summary = {
        "steps": state.step, "steps_this_run": steps_run,
        "seconds_per_step": result.seconds_this_run / steps_run if steps_run else None,
        "history": state.history, "best": state.best, "model_dir": str(final), "plot": str(out / "losses.png"),
    }
    (out / "heedrank-train.json").write_text(json.dumps({"config": asdict(cfg), **summary}, indent=1))
    return summary


def _freeze_below(lm: Any, first_trained: int) -> None:
    """Freeze the embeddings and decoder layers ``0..first_trained-1``.

    The backward pass then stops at layer ``first_trained`` (nothing below needs a
    gradient), which cuts the cost of a step roughly by the share of layers frozen.

    Raises:
        ValidationError: ``first_trained`` outside ``0..num_layers-1``.
    """
    n = lm.num_layers
    if not 0 <= first_trained < n:
        raise ValidationError(f"freeze_below must be in 0..{n - 1} for a {n}-layer model, got {first_trained}")
    inner = getattr(lm.model, "model", lm.model)
    for p in inner.embed_tokens.parameters():
        p.requires_grad_(False)
    for layer in inner.layers[:first_trained]:
        for p in layer.parameters():
            p.requires_grad_(False)


def _save_final(out: Path, lm: Any, peft_model: Any) -> Path:
    """The final model in ``out`` (LoRA merged) with its tokenizer: a reranker model folder."""
    model = peft_model.merge_and_unload() if peft_model is not None else lm.model
    model.eval()
    model.save_pretrained(str(out), safe_serialization=True)
    lm.tokenizer.save_pretrained(str(out))
    return out


def plot_losses(history: Sequence[dict[str, float]], path: str | Path) -> Path | None:
    """PNG of the training losses (and the dev auxiliary loss) against the step."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - optional extra
        logger.warning("matplotlib is not installed (pip install -e '.[train]' (in the heedrank checkout)); no loss plot")
        return None
    fig, ax = plt.subplots(figsize=(7, 4))
    for key, style in (("loss", "-"), ("aux", "-"), ("ntp", "-"), ("dev_aux", "o-")):
        pts = [(h["step"], h[key]) for h in history if h.get(key) is not None and not math.isnan(h[key])]
        if pts:
            ax.plot(*zip(*pts), style, label=key, markersize=4)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    ax.set_title("BlockRank fine-tuning")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return Path(path)

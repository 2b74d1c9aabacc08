"""BlockRank fine-tuning with the auxiliary contrastive attention loss.

Source: Gupta et al. 2025, "Scalable In-context Ranking with Generative Models"
(arXiv 2510.05396), Section 4 (repo nilesh2797/BlockRank, ``losses.py``); ALGORITHMS.md
section 3:

    L = L_NTP + lambda * L_aux,   L_aux = -log( sum_{p in pos} exp(S_p / tau) / sum_k exp(S_k / tau) )

with ``S`` the signal tokens' block-restricted attention at layer ``l*``
(:func:`heedrank.reranker.blockforward.signal_scores`), ``lambda = 0.1``, ``tau = 0.05``. ``L_NTP`` is the
cross-entropy of the relevant document's id and the closing ``]`` after the answer prefix
``Final Answer: [``; LM logits are computed for those answer tokens only. Training runs
through the same exact linear block forward as inference (:func:`heedrank.reranker.blockforward.context_kv`,
:func:`heedrank.reranker.blockforward.query_pass`), never the dense 4-D mask. ``aux_only`` runs layers
``0..l*`` only (no LM head, no NTP).

Checkpoints (``out/checkpoints/step-N``: weights or LoRA adapter, optimizer, state) make
a run resumable; the final model is saved to ``out/`` (LoRA merged) with its tokenizer and
loads as a reranker model (``--model out``).
"""

from __future__ import annotations

import json
import logging
import math
import random
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heedrank.config import RerankerConfig
from heedrank.files import replace_dir
from heedrank.errors import ValidationError
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
    max_doc_tokens: int = 128
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

    Differentiable when called with grad enabled.
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
    pos = torch.tensor(list(ex.positives), device=z.device)
    aux = -(torch.logsumexp(z[pos], 0) - torch.logsumexp(z, 0))
    total = cfg.aux_lambda * aux if ntp is None else ntp + cfg.aux_lambda * aux
    return {"total": total, "aux": aux, "ntp": ntp}


@dataclass
class _State:
    step: int = 0
    cursor: int = 0
    order: list[int] = field(default_factory=list)
    history: list[dict[str, float]] = field(default_factory=list)


def _checkpoints(out: Path) -> list[Path]:
    """``out/checkpoints/step-N`` folders in step order (not the ``.tmp`` / ``.old`` ones a
    save in progress leaves)."""
    found = [p for p in (out / "checkpoints").glob("step-*") if p.name[5:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[5:]))


def _latest_checkpoint(out: Path) -> Path | None:
    ckpts = _checkpoints(out)
    return ckpts[-1] if ckpts else None


def train_blockrank(
    examples: Sequence[TrainingExample],
    cfg: TrainConfig,
    *,
    dev_examples: Sequence[TrainingExample] = (),
    show_progress: bool = True,
) -> dict[str, Any]:
    """Fine-tune the LM for BlockRank; resumes from the latest checkpoint in ``cfg.out_dir``.

    Returns:
        Summary: steps, seconds per step, final and dev losses, output paths.

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
    resume = _latest_checkpoint(out)
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
    elif resume is not None:
        from safetensors.torch import load_file

        lm.model.load_state_dict(load_file(str(resume / "model.safetensors")), strict=False)
    reranker = BlockRankReranker(
        RerankerConfig(method="blockrank", max_doc_tokens=cfg.max_doc_tokens, device=cfg.device,
                       options={} if cfg.layer is None else {"layer": cfg.layer}),
        lm=lm,
    )
    if cfg.freeze_below:
        _freeze_below(lm, cfg.freeze_below)
    params = [p for p in lm.model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    state = _State()
    rng = random.Random(cfg.seed)
    if resume is not None:
        opt.load_state_dict(torch.load(resume / "optimizer.pt", weights_only=False))
        raw = json.loads((resume / "state.json").read_text())
        state = _State(raw["step"], raw["cursor"], raw["order"], raw["history"])
        rng.setstate(tuple(raw["rng"][:1]) + (tuple(raw["rng"][1]),) + tuple(raw["rng"][2:]))
        logger.info("resumed from %s (step %d)", resume, state.step)
    if not state.order:
        state.order = list(range(len(examples)))
        rng.shuffle(state.order)

    def next_example() -> TrainingExample:
        if state.cursor >= len(state.order):
            rng.shuffle(state.order)
            state.cursor = 0
        ex = examples[state.order[state.cursor]]
        state.cursor += 1
        return ex

    def dev_loss() -> float | None:
        if not dev_examples:
            return None
        lm.model.eval()
        with torch.no_grad():
            vals = [float(example_losses(reranker, ex, cfg)["aux"]) for ex in dev_examples]
        lm.model.train()
        return sum(vals) / len(vals)

    bar: Any = None
    if show_progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.steps, initial=state.step, desc="train blockrank", unit="step")
    if state.step == 0 and dev_examples:
        state.history.append({"step": 0, "dev_aux": dev_loss()})
    t_start = time.perf_counter()
    steps_run = 0
    lm.model.train()
    while state.step < cfg.steps:
        opt.zero_grad(set_to_none=True)
        agg = {"total": 0.0, "aux": 0.0, "ntp": 0.0}
        for _ in range(cfg.grad_accum):
            losses = example_losses(reranker, next_example(), cfg)
            (losses["total"] / cfg.grad_accum).backward()
            for k in agg:
                if losses[k] is not None:
                    agg[k] += float(losses[k].detach()) / cfg.grad_accum
        torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
        opt.step()
        state.step += 1
        steps_run += 1
        rec: dict[str, float] = {"step": state.step, "loss": agg["total"], "aux": agg["aux"]}
        if not cfg.aux_only:
            rec["ntp"] = agg["ntp"]
        if dev_examples and (state.step % cfg.eval_every == 0 or state.step == cfg.steps):
            rec["dev_aux"] = dev_loss()
        state.history.append(rec)
        if bar is not None:
            bar.update(1)
            bar.set_postfix({k: f"{v:.3f}" for k, v in rec.items() if k != "step" and v is not None})
        if state.step % cfg.checkpoint_every == 0 or state.step == cfg.steps:
            _save_checkpoint(out, lm, peft_model, opt, state, rng, cfg)
    if bar is not None:
        bar.close()
    seconds = time.perf_counter() - t_start
    final = _save_final(out, lm, peft_model, state, cfg)
    plot_losses(state.history, out / "losses.png")
    summary = {
        "steps": state.step, "steps_this_run": steps_run,
        "seconds_per_step": seconds / steps_run if steps_run else None,
        "history": state.history, "model_dir": str(final), "plot": str(out / "losses.png"),
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


def _save_checkpoint(out: Path, lm: Any, peft_model: Any, opt: Any, state: _State, rng: random.Random,
                     cfg: TrainConfig) -> None:
    import torch

    ckpt = out / "checkpoints" / f"step-{state.step}"
    tmp = ckpt.with_name(ckpt.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if peft_model is not None:
        peft_model.save_pretrained(str(tmp / "adapter"))
    else:
        from safetensors.torch import save_file

        sd = {k: v.detach().contiguous() for k, v in lm.model.state_dict().items()}
        if getattr(lm.model.config, "tie_word_embeddings", False):
            sd.pop("lm_head.weight", None)
        save_file(sd, str(tmp / "model.safetensors"))
    torch.save(opt.state_dict(), tmp / "optimizer.pt")
    st = rng.getstate()
    (tmp / "state.json").write_text(json.dumps({
        "step": state.step, "cursor": state.cursor, "order": state.order, "history": state.history,
        "rng": [st[0], list(st[1]), st[2]],
    }))
    replace_dir(tmp, ckpt)  # fsynced, then renamed: a crash leaves a complete checkpoint or none
    ckpts = _checkpoints(out)
    for old in ckpts[: -cfg.keep_checkpoints]:
        shutil.rmtree(old, ignore_errors=True)


def _save_final(out: Path, lm: Any, peft_model: Any, state: _State, cfg: TrainConfig) -> Path:
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

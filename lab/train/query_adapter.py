"""Query-side adapter for cached BlockRank: LoRA on the query passes only.

Source: docs/results/training.md, "A query-side adapter"; LoRA is Hu et
al. 2021 (arXiv 2106.09685); the scorer trained through it is the learned per-(layer,
head) calibrated attention mass of :func:`heedrank.reranker.scoring.linear_head_scores`
(QRRanker-style head weights), or BlockRank's signal-token attention (Gupta et al. 2025,
arXiv 2510.05396, Section 4, ``L_aux``).

A document KV store holds candidate blocks computed by the *base* model. An adapter that
changes only the query block's computation keeps every stored block valid: the adapter is
enabled for the query and ``N/A`` calibration passes and disabled while block 0 and
candidate blocks are encoded (:func:`heedrank.reranker.adapters.adapter_disabled`). Training therefore reads every
candidate block from the store (or computes it once with the base model) and back-propagates
through the query passes alone: a step costs two query-block passes, not a prompt.

Files of a trained adapter (``DIR``): ``adapter.safetensors`` (LoRA tensors and, when
trained, ``scorer.weights`` float32 ``(l* + 1) * heads``), ``adapter.json`` (LoRA config,
model identity, ``l*``, block length, layout version, data and figures).
"""

from __future__ import annotations

import json
import logging
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heedrank.errors import ValidationError
from heedrank.reranker.adapters import adapter_state, inject_lora, save_adapter
from heedrank.lab.train.loop import Checkpoints, LoopConfig, run_loop
from heedrank.lab.train.losses import listwise_loss, pairwise_loss
from heedrank.types import Document

if TYPE_CHECKING:
    from heedrank.reranker.cached import CachedBlockRankReranker

logger = logging.getLogger(__name__)

OBJECTIVES = ("learned", "signal", "independent")
"""What the adapter is trained through (:attr:`QueryAdapterConfig.objective`)."""

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class RankingExample:
    """One training query with graded candidates.

    Attributes:
        query_id: Query identifier.
        query: Query text.
        documents: Candidates (first-stage order).
        grades: Relevance grade per candidate (0 = not relevant / unjudged).
        source: Name of the data source (selects its document KV store in training).
    """

    query_id: str
    query: str
    documents: tuple[Document, ...]
    grades: tuple[int, ...]
    source: str = ""


@dataclass(frozen=True)
class QueryAdapterConfig:
    """Options of a query-adapter training run (``heedrank lab train query-adapter --help``).

    Attributes:
        out_dir: Output folder (checkpoints, the adapter, the history).
        objective: ``"learned"`` (listwise softmax over the learned head-weight score,
            z-scored calibrated mass per (layer, head) times the weights card),
            ``"signal"`` (BlockRank's ``L_aux`` on the signal tokens at ``l*``) or
            ``"independent"`` (the served list-independent log-odds: the query and ``N/A``
            blocks against block 0 alone, read on the candidates' stored keys, times the card's
            ``independent`` weights; :mod:`heedrank.reranker.cached.independent`).
        lora_r, lora_alpha: LoRA rank and scale.
        target_modules: Linear layers that get LoRA (names inside each decoder layer).
        train_weights: Also train the head weights (initialised from the card).
        lr: AdamW learning rate of the LoRA tensors.
        weights_lr: Learning rate of the head weights.
        steps: Optimizer steps.
        batch_queries: Queries per optimizer step (gradient accumulation).
        max_candidates: Candidates per example (all positives up to ``max_positives``,
            then the highest-ranked negatives, then random ones), bounding a step's cost.
        max_positives: Positives kept per example.
        temperature: Softmax temperature of the listwise loss (``signal``: BlockRank's
            ``tau = 0.05``; ``learned``: 1.0 on the z-scored weighted sum); the pairwise
            loss divides score differences by it.
        loss: ``"listwise"`` (:func:`listwise_loss`) or ``"pairwise"`` (:func:`pairwise_loss`,
            RankNet over the step's candidate pairs of different grades).
        init: A trained adapter folder to start from (its LoRA config must match), or ``None``
            (LoRA's zero start: the base model).
        eval_every: Steps between dev evaluations (the callback), 0 = only at the end.
        checkpoint_every: Steps between checkpoints.
        seed: Seed of sampling and initialisation.
    """

    out_dir: str
    objective: str = "learned"
    lora_r: int = 8
    lora_alpha: int = 16
    target_modules: tuple[str, ...] = DEFAULT_TARGETS
    train_weights: bool = False
    lr: float = 3e-4
    weights_lr: float = 1e-2
    steps: int = 300
    batch_queries: int = 4
    max_candidates: int = 20
    max_positives: int = 5
    temperature: float | None = None
    loss: str = "listwise"
    init: str | None = None
    eval_every: int = 100
    checkpoint_every: int = 25
    seed: int = 0

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValidationError(f"objective must be one of {list(OBJECTIVES)}, got {self.objective!r}")
        if self.loss not in ("listwise", "pairwise"):
            raise ValidationError(f"loss must be 'listwise' or 'pairwise', got {self.loss!r}")
        for name in ("lora_r", "steps", "batch_queries", "max_candidates", "max_positives", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValidationError(f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def tau(self) -> float:
        return self.temperature if self.temperature is not None else (0.05 if self.objective == "signal" else 1.0)


# ----------------------------------------------------------------------------- scoring
def context_for(reranker: CachedBlockRankReranker, prompt: Any, kv0: Any, *, store: Any = None) -> list[tuple[Any, Any]]:
    """Block 0's and the candidates' keys/values for layers ``0..l*`` (``assemble_kv``
    layout), computed or read by the base model (the block encoders switch a query adapter
    off), as ordinary (non-inference) tensors without gradient: constants of a training step."""
    import torch

    from heedrank.reranker.doccache import assemble_kv

    lm = reranker.lm
    with torch.no_grad():
        blocks, _ = reranker.block_source.fetch(lm, kv0, prompt.doc_ids, reranker.layer, store=store,
                                                  batch_size=reranker.options.doc_batch_size,
                                                  round_trip=reranker.block_round_trip())
        return assemble_kv(kv0, blocks, reranker.layer)


def base_instruction_kv(reranker: CachedBlockRankReranker) -> list[tuple[Any, Any]]:
    """Block 0's keys/values from the base model, ``l* + 1`` entries ``(1, kv_heads, L0, d)``."""
    import torch

    from heedrank.reranker.doccache import instruction_kv

    with torch.no_grad():
        return instruction_kv(reranker.lm, reranker.layout.instruction_ids, reranker.layer)


def differentiable_scores(reranker: CachedBlockRankReranker, prompt: Any, kv: Any, objective: str, weights: Any = None) -> Any:
    """Candidate scores ``(N,)`` float64 with gradients through the query passes.

    ``"learned"``: z-scored calibrated attention mass per (layer, head) over layers
    ``0..l*`` (query rows' mean attention minus the ``N/A`` query's) times ``weights``
    (``((l* + 1) * heads,)``); unitless. ``"signal"``: the signal tokens' attention mass per
    candidate at ``l*`` (probabilities summing to 1, :func:`heedrank.reranker.blockforward.signal_scores`).
    ``"independent"``: the served list-independent log-odds of P(relevant) (``weights``: the
    card's :class:`heedrank.reranker.cached.independent.IndependentWeights`), each candidate's
    own: the query pass runs against block 0 alone (:func:`independent_scores`).
    """
    if objective == "independent":
        return independent_scores(reranker, prompt, kv, weights)

    from heedrank.reranker.attention import AttentionCapture
    from heedrank.reranker.blockforward import query_pass, signal_scores
    from heedrank.reranker.scoring import linear_head_scores, per_head_document_mass

    lm = reranker.lm
    layer = reranker.layer
    L0 = len(prompt.instruction_ids)
    lengths = prompt.doc_lengths
    if objective == "signal":
        Lq = len(prompt.query_ids)
        cap = AttentionCapture(layers={layer}, rows=slice(Lq - prompt.n_signal, Lq), mode="logits",
                               stop_after=layer, detach=False)
        query_pass(lm, prompt, kv, cap)
        return signal_scores(cap.out[layer], L0, lengths).double()
    layers = list(range(layer + 1))

    def mean_attention(ids: list[int]) -> dict[int, Any]:
        cap = AttentionCapture(layers=set(layers), mode="mean", stop_after=layer, detach=False)
        query_pass(lm, prompt, kv, cap, query_ids=ids)
        return cap.out

    feats = per_head_document_mass(mean_attention(prompt.query_ids), L0, lengths, layers,
                                   minus=mean_attention(prompt.calib_ids))
    return linear_head_scores(feats, weights.double())


def independent_scores(reranker: CachedBlockRankReranker, prompt: Any, kv: Any, weights: Any) -> Any:
    """``(N,)`` float64 log-odds ``bias + W . F(d)`` (docs/design/algorithms.md, "List-independent
    scoring"), with gradients through the query and ``N/A`` blocks' pass against block 0
    (:func:`heedrank.reranker.cached.independent.query_states` with ``detach=False``)."""
    import torch

    from heedrank.reranker.cached.independent import GROUPS, document_features, query_states

    w = weights.tensor()
    used = [g for g in range(len(GROUPS)) if bool(w[:, :, g].abs().sum() > 0)]
    states, groups = query_states(reranker.lm, prompt, kv, list(range(weights.layers)), detach=False)
    feats = document_features(states, groups, kv, len(prompt.instruction_ids), prompt.doc_lengths, used).double()
    return torch.einsum("nlhg,lhg->n", feats, w) + weights.bias


def sample_candidates(ex: RankingExample, max_candidates: int, max_positives: int, rng: random.Random
                      ) -> tuple[list[Document], list[int]] | None:
    """Candidates of one step: up to ``max_positives`` positives (random), then negatives in
    first-stage order (the hard ones) up to ``max_candidates``; ``None`` when the example has
    no positive or no negative. The returned list keeps first-stage order."""
    pos = [i for i, g in enumerate(ex.grades) if g > 0]
    neg = [i for i, g in enumerate(ex.grades) if g <= 0]
    if not pos or not neg:
        return None
    if len(pos) > max_positives:
        pos = rng.sample(pos, max_positives)
    keep = sorted(pos + neg[: max(1, max_candidates - len(pos))])
    return [ex.documents[i] for i in keep], [ex.grades[i] for i in keep]


# ----------------------------------------------------------------------------- training
class _AdapterTask:
    """:class:`heedrank.lab.train.loop.TrainingTask` of the query adapter: ``batch_queries``
    examples per optimizer step; checkpoints hold the LoRA tensors (and the trained head
    weights, ``scorer.weights``) and the optimizer."""

    def __init__(self, reranker: CachedBlockRankReranker, examples: Sequence[RankingExample], cfg: QueryAdapterConfig,
                 weights: Any, opt: Any, lora_params: list[Any], kv0: Any, block_stores: Mapping[str, Any],
                 independent: Any = None) -> None:
        self.reranker, self.examples, self.cfg = reranker, examples, cfg
        self.weights, self.opt, self.lora_params, self.kv0, self.block_stores = weights, opt, lora_params, kv0, block_stores
        self.scoring_weights = independent if independent is not None else weights

    def train_step(self, draw: Callable[[], int], rng: random.Random) -> dict[str, float]:
        import torch

        cfg, reranker = self.cfg, self.reranker
        self.opt.zero_grad(set_to_none=True)
        total = 0.0
        for _ in range(cfg.batch_queries):
            ex = self.examples[draw()]
            picked = sample_candidates(ex, cfg.max_candidates, cfg.max_positives, rng)
            assert picked is not None  # usable examples have a positive and a negative
            docs, grades = picked
            prompt = reranker.build_prompt(ex.query, docs)
            kv = context_for(reranker, prompt, self.kv0, store=self.block_stores.get(ex.source))
            reranker.lm.model.train()
            scores = differentiable_scores(reranker, prompt, kv, cfg.objective, self.scoring_weights)
            loss = (pairwise_loss if cfg.loss == "pairwise" else listwise_loss)(scores, grades, cfg.tau)
            (loss / cfg.batch_queries).backward()
            total += float(loss.detach()) / cfg.batch_queries
        torch.nn.utils.clip_grad_norm_(self.lora_params, 1.0)
        self.opt.step()
        return {"loss": total}

    def save_state(self, folder: Path) -> None:
        import torch
        from safetensors.torch import save_file

        tensors = adapter_state(self.reranker.lm.model)
        if self.weights.numel():
            tensors["scorer.weights"] = self.weights.detach().clone()
        save_file(tensors, str(folder / "adapter.safetensors"))
        torch.save(self.opt.state_dict(), folder / "optimizer.pt")

    def load_state(self, folder: Path) -> None:
        import torch
        from safetensors.torch import load_file

        tensors = load_file(str(folder / "adapter.safetensors"))
        params = dict(self.reranker.lm.model.named_parameters())
        with torch.no_grad():
            w = tensors.pop("scorer.weights", None)
            if w is not None and self.weights.numel():
                self.weights.copy_(w)
            for n, t in tensors.items():
                params[n].copy_(t)
        self.opt.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=False))


def train_query_adapter(
    reranker: CachedBlockRankReranker, examples: Sequence[RankingExample], cfg: QueryAdapterConfig, *,
    block_stores: Mapping[str, Any] | None = None,
    evaluate: Callable[[CachedBlockRankReranker, Any], dict[str, float]] | None = None,
    card: dict[str, Any] | None = None, show_progress: bool = True,
) -> dict[str, Any]:
    """Train a query-side LoRA adapter on cached BlockRank; resumable.

    Runs :func:`heedrank.lab.train.loop.run_loop`. Every step takes ``cfg.batch_queries``
    examples, reads their candidate blocks (base model, from ``block_store`` or computed once
    and kept in the reranker's RAM cache), runs the query (and ``N/A``) passes with the
    adapter and back-propagates the listwise loss through them. A checkpoint (adapter,
    optimizer, sampler and RNG state) is written every ``cfg.checkpoint_every`` steps to
    ``out/checkpoint`` atomically; a rerun continues from it (``kill -9`` loses at most that
    many steps). ``evaluate(reranker, weights)`` (e.g. dev nDCG@10, key ``"dev"``) runs at
    step 0, every ``cfg.eval_every`` steps and at the end; the best dev adapter is saved to
    ``out/best``.

    Args:
        reranker: A :class:`heedrank.reranker.cached.CachedBlockRankReranker`; its LM gets
            the LoRA layers in place.
        examples: Training queries (those without a positive or a negative are skipped).
        block_stores: Document KV store per example ``source`` (read-only is fine; a writable
            one keeps the blocks it lacked); a source without one uses the RAM cache.
        evaluate: Dev callback returning figures; higher ``"dev"`` is better. ``weights``:
            float64 ``((l* + 1) * heads,)`` head weights (``objective="learned"``), else ``None``.
        card: Extra fields for ``adapter.json`` (data, commands).

    Returns:
        Summary: steps, seconds per step, examples/s, history, best dev figure and step, paths.

    Raises:
        ValidationError: a reranker not in cached mode, or no usable example.
        NotFoundError, ValidationError: ``cfg.init`` is not an adapter of this LoRA config.
    """
    import torch

    from heedrank.reranker.cached import CachedBlockRankReranker

    if not isinstance(reranker, CachedBlockRankReranker):
        raise ValidationError("query adapters train on cached BlockRank: use method 'blockrank-cached'")
    usable = [ex for ex in examples if any(g > 0 for g in ex.grades) and any(g <= 0 for g in ex.grades)]
    if not usable:
        raise ValidationError("no training query has both a relevant and a non-relevant candidate")
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    lm = reranker.lm
    lora_layers = list(range(reranker.layer + 1))
    n_params = inject_lora(lm.model, cfg.lora_r, cfg.lora_alpha, cfg.target_modules, lora_layers)
    if cfg.init is not None:
        _warm_start(lm.model, Path(cfg.init), cfg, lora_layers)
    weights = torch.zeros(0)
    if cfg.objective == "learned":
        weights = torch.tensor(reranker.learned_weights().reshape(-1), dtype=torch.float64)
    weights.requires_grad_(cfg.train_weights and cfg.objective == "learned")
    independent = None
    if cfg.objective == "independent":
        from heedrank.reranker.cached.state import independent_weights

        state = reranker.loaded()
        independent = independent_weights(state.card, state.lm, reranker.layer)
    lora_params = [p for n, p in lm.model.named_parameters() if p.requires_grad]
    groups: list[dict[str, Any]] = [{"params": lora_params, "lr": cfg.lr}]
    if weights.requires_grad:
        groups.append({"params": [weights], "lr": cfg.weights_lr, "weight_decay": 0.0})
    opt = torch.optim.AdamW(groups, weight_decay=0.0)
    kv0 = base_instruction_kv(reranker)
    base_card = {
        "model": lm.identity, "layer": reranker.layer, "max_doc_tokens": reranker.config.max_doc_tokens,
        "template": reranker.layout_version, "objective": cfg.objective,
        "lora": {"r": cfg.lora_r, "alpha": cfg.lora_alpha, "target_modules": list(cfg.target_modules),
                 "layers": lora_layers},
        "config": asdict(cfg), "trainable_parameters": n_params, **(card or {}),
    }
    saved_weights = weights if cfg.objective == "learned" else None
    task = _AdapterTask(reranker, usable, cfg, weights, opt, lora_params, kv0, block_stores or {}, independent)

    def run_eval(step: int) -> dict[str, float]:
        assert evaluate is not None
        lm.model.eval()
        return evaluate(reranker, weights.detach() if cfg.objective == "learned" else independent)

    def save_best(step: int, figures: Mapping[str, float]) -> None:
        save_adapter(out / "best", lm.model, {**base_card, "step": step, "dev": dict(figures)}, saved_weights)

    loop_cfg = LoopConfig(steps=cfg.steps, checkpoint_every=cfg.checkpoint_every, eval_every=cfg.eval_every,
                          seed=cfg.seed, metric="dev", higher_is_better=True, desc="train query adapter")
    result = run_loop(task, len(usable), loop_cfg, checkpoints_of(out), evaluate=None if evaluate is None else run_eval,
                      on_best=save_best, show_progress=show_progress)
    state = result.state
    final = save_adapter(out / "final", lm.model, {**base_card, "step": state.step}, saved_weights)
    per_step = state.seconds / state.step if state.step else math.nan
    summary = {
        "steps": state.step, "steps_this_run": result.steps_this_run, "seconds_this_run": result.seconds_this_run,
        "train_seconds_per_step": per_step,
        "examples_per_second": cfg.batch_queries / per_step if state.step else math.nan,
        "trainable_parameters": n_params, "best": state.best, "history": state.history,
        "final": str(final), "best_dir": str(out / "best") if state.best else None,
    }
    (out / "summary.json").write_text(json.dumps({"config": asdict(cfg), **summary}, indent=1))
    return summary


def checkpoints_of(out: str | Path) -> Checkpoints:
    """The checkpoint of a query-adapter run in ``out``: one folder, ``out/checkpoint``."""
    return Checkpoints.rolling(Path(out) / "checkpoint")


def _warm_start(model: Any, path: Path, cfg: QueryAdapterConfig, layers: Sequence[int]) -> None:
    """Copy a trained adapter's LoRA tensors into the freshly injected ones (step 0 of a run
    started with ``init``; a resumed run reads its checkpoint instead).

    Raises:
        NotFoundError: ``path`` is not an adapter folder.
        ValidationError: its LoRA config differs from ``cfg``'s.
    """
    import torch
    from safetensors.torch import load_file

    from heedrank.errors import NotFoundError

    if not (path / "adapter.json").is_file() or not (path / "adapter.safetensors").is_file():
        raise NotFoundError(f"--init {path} is not a query adapter (adapter.json and adapter.safetensors expected)")
    lora = json.loads((path / "adapter.json").read_text())["lora"]
    want = {"r": cfg.lora_r, "alpha": cfg.lora_alpha, "target_modules": list(cfg.target_modules), "layers": list(layers)}
    got = {k: lora.get(k) for k in want}
    if got != want:
        raise ValidationError(f"--init {path} has LoRA {got}, this run {want}: use the same --lora-r and layer")
    tensors = load_file(str(path / "adapter.safetensors"))
    tensors.pop("scorer.weights", None)
    params = dict(model.named_parameters())
    missing = set(adapter_state(model)) - set(tensors)
    if missing:
        raise ValidationError(f"--init {path} lacks {len(missing)} LoRA tensors (e.g. {sorted(missing)[0]})")
    with torch.no_grad():
        for n, t in tensors.items():
            params[n].copy_(t)
    logger.info("query adapter initialised from %s", path)

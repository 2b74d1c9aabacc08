"""The one resumable training loop: BlockRank fine-tuning (:mod:`heedrank.lab.train.blockrank`)
and the query adapter (:mod:`heedrank.lab.train.query_adapter`) both run through it.

A trainer supplies a :class:`TrainingTask` (one optimizer step, and how its weights and
optimizer are written to and read from a checkpoint folder); the loop owns everything a
resumed run must get back exactly:

* the step counter and the history of figures (one ``{"step", ...}`` record per step and
  per evaluation);
* the sampler: a seeded permutation of the example indices, read with a cursor and
  reshuffled (same ``random.Random``) at the end of each epoch;
* the RNG state: the ``random.Random(seed)`` that shuffles and that the task may draw from
  (e.g. candidate sampling), and torch's CPU generator;
* the best evaluation figure so far (and an ``on_best`` hook, e.g. saving the best adapter).

Checkpoints (:class:`Checkpoints`) are written to ``NAME.tmp`` and put in place by
:func:`heedrank.files.replace_dir` (every file fsynced before the renames), so a crash leaves
a complete checkpoint (``NAME``, or the ``NAME.old`` a save stopped between its renames
left, :func:`heedrank.files.existing_dir`) and never reads a ``.tmp`` folder. A run killed
at any point and started again with the same arguments continues from its last checkpoint
and ends where an uninterrupted run ends (losing at most ``checkpoint_every`` steps of work).
"""

from __future__ import annotations

import json
import logging
import random
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from heedrank.errors import ValidationError
from heedrank.files import existing_dir, replace_dir

logger = logging.getLogger(__name__)

STATE_FILE = "state.json"
"""The loop's own state in a checkpoint folder (step, sampler, history, best, Python RNG)."""
TORCH_RNG_FILE = "torch_rng.pt"
"""torch's CPU generator state in a checkpoint folder (absent in checkpoints of older runs)."""


class TrainingTask(Protocol):
    """What a trainer gives :func:`run_loop`: its step and its part of a checkpoint."""

    def train_step(self, draw: Callable[[], int], rng: random.Random) -> dict[str, float]:
        """Run one optimizer step (zero the gradients, accumulate, clip, step).

        Args:
            draw: Returns the index of the next training example (the loop's sampler);
                call it once per example the step uses.
            rng: The loop's seeded generator, for any other sampling the step does (its state
                is checkpointed with the sampler).

        Returns:
            The step's figures (e.g. ``{"loss": ...}``), recorded with ``"step"`` in the history.
        """
        ...

    def save_state(self, folder: Path) -> None:
        """Write the trainable weights and the optimizer state into ``folder`` (it exists and
        is empty; the loop adds its own files and makes it durable)."""
        ...

    def load_state(self, folder: Path) -> None:
        """Read back what :meth:`save_state` wrote (weights and optimizer) from ``folder``."""
        ...


@dataclass(frozen=True)
class LoopConfig:
    """Options of :func:`run_loop`.

    Attributes:
        steps: Optimizer steps of the whole run (a resumed run continues up to it).
        checkpoint_every: Steps between checkpoints (and one at the last step).
        eval_every: Steps between evaluations (and one at step 0 and at the last step);
            0 = only at step 0 and at the end.
        seed: Seed of the sampler's ``random.Random``.
        metric: The evaluation figure whose best value is kept (``LoopState.best``).
        higher_is_better: Direction of ``metric`` (a loss: ``False``).
        desc: Label of the progress bar.

    Raises:
        ValidationError: ``steps``, ``checkpoint_every`` < 1 or ``eval_every`` < 0.
    """

    steps: int
    checkpoint_every: int = 25
    eval_every: int = 0
    seed: int = 0
    metric: str = "dev"
    higher_is_better: bool = True
    desc: str = "train"

    def __post_init__(self) -> None:
        for name in ("steps", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ValidationError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.eval_every < 0:
            raise ValidationError(f"eval_every must be >= 0, got {self.eval_every}")


@dataclass
class LoopState:
    """What a checkpoint holds besides the task's tensors.

    Attributes:
        step: Optimizer steps done.
        cursor: Position of the sampler in ``order``.
        order: The current epoch's permutation of example indices.
        history: Figures per step (``{"step", **figures}``) and per evaluation
            (``{"step", **figures, "eval_seconds"}``), in order.
        best: The evaluation record with the best ``metric`` so far (``{}``: none yet).
        seconds: Seconds spent in training steps over all runs (evaluations and checkpoints
            not counted).
    """

    step: int = 0
    cursor: int = 0
    order: list[int] = field(default_factory=list)
    history: list[dict[str, Any]] = field(default_factory=list)
    best: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0


@dataclass(frozen=True)
class LoopResult:
    """What :func:`run_loop` returns.

    Attributes:
        state: The final :class:`LoopState` (``state.step == cfg.steps``).
        steps_this_run: Steps run by this call (0 when the checkpoint was already final).
        seconds_this_run: Wall-clock seconds of this call's steps, evaluations and checkpoints
            (the step-0 evaluation not counted).
        resumed_from: The checkpoint folder this call started from, or ``None``.
    """

    state: LoopState
    steps_this_run: int
    seconds_this_run: float
    resumed_from: Path | None


class Checkpoints:
    """Where a run's checkpoints live, in one of two layouts:

    * :meth:`rolling`: one folder (e.g. ``out/checkpoint``) replaced at every save;
    * :meth:`numbered`: ``root/step-N`` per save, the last ``keep`` kept.

    Either way a save writes ``NAME.tmp`` and :func:`heedrank.files.replace_dir` puts it in
    place, and :meth:`latest` reads only complete folders (``NAME``, or ``NAME.old`` when a save
    stopped between its two renames), never a ``.tmp`` one.
    """

    def __init__(self, root: Path, *, name: str | None = None, keep: int = 0) -> None:
        self.root = Path(root)
        self.name = name
        self.keep = keep

    @classmethod
    def rolling(cls, path: str | Path) -> Checkpoints:
        """One checkpoint folder ``path``, replaced at each save."""
        path = Path(path)
        return cls(path.parent, name=path.name)

    @classmethod
    def numbered(cls, root: str | Path, keep: int = 2) -> Checkpoints:
        """``root/step-N`` folders; after a save all but the last ``keep`` are removed
        (``keep <= 0``: all are kept)."""
        return cls(Path(root), keep=keep)

    def folder(self, step: int) -> Path:
        """The folder the checkpoint of ``step`` is saved to."""
        return self.root / (self.name if self.name is not None else f"step-{step}")

    def saved(self) -> list[Path]:
        """Complete checkpoint folders, oldest first (numbered: in step order)."""
        if self.name is not None:
            found = existing_dir(self.root / self.name)
            return [found] if found is not None else []
        steps: dict[int, Path] = {}
        for p in self.root.glob("step-*"):
            num, _, suffix = p.name[5:].partition(".")
            if num.isdigit() and suffix in ("", "old") and p.is_dir():
                if suffix == "" or int(num) not in steps:  # step-N.old only when step-N is missing
                    steps[int(num)] = p
        return [steps[k] for k in sorted(steps)]

    def latest(self) -> Path | None:
        """The newest complete checkpoint folder, or ``None``."""
        found = self.saved()
        return found[-1] if found else None

    def save(self, step: int, write: Callable[[Path], None]) -> Path:
        """Write a checkpoint of ``step``: ``write(tmp)`` fills a fresh ``NAME.tmp`` folder,
        which is then fsynced and renamed into place (numbered: older ones pruned).

        Raises:
            OSError: a write, fsync or rename failed (the previous checkpoint is intact).
        """
        final = self.folder(step)
        tmp = final.with_name(final.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        write(tmp)
        replace_dir(tmp, final)  # fsynced, then renamed: a crash leaves this or the previous checkpoint
        if self.name is None and self.keep > 0:
            for old in self.saved()[: -self.keep]:
                shutil.rmtree(old, ignore_errors=True)
        return final


def _write_loop_state(folder: Path, state: LoopState, rng: random.Random) -> None:
    import torch

    st = rng.getstate()
    (folder / STATE_FILE).write_text(json.dumps({
        "step": state.step, "cursor": state.cursor, "order": state.order, "history": state.history,
        "best": state.best, "seconds": state.seconds, "rng": [st[0], list(st[1]), st[2]],
    }))
    torch.save(torch.get_rng_state(), folder / TORCH_RNG_FILE)


def _read_loop_state(folder: Path, state: LoopState, rng: random.Random) -> None:
    import torch

    raw = json.loads((folder / STATE_FILE).read_text())
    state.step, state.cursor, state.order = raw["step"], raw["cursor"], raw["order"]
    state.history, state.best, state.seconds = raw["history"], raw.get("best", {}), raw.get("seconds", 0.0)
    st = raw["rng"]
    rng.setstate((st[0], tuple(st[1]), st[2]))
    if (folder / TORCH_RNG_FILE).is_file():
        torch.set_rng_state(torch.load(folder / TORCH_RNG_FILE, weights_only=True))


def run_loop(
    task: TrainingTask, n_examples: int, cfg: LoopConfig, checkpoints: Checkpoints, *,
    evaluate: Callable[[int], Mapping[str, float]] | None = None,
    on_best: Callable[[int, Mapping[str, float]], None] | None = None,
    show_progress: bool = True,
) -> LoopResult:
    """Train ``task`` for ``cfg.steps`` optimizer steps, resuming from the latest checkpoint.

    Order of work: the latest complete checkpoint (if any) is loaded (``task.load_state``,
    then the loop's state and RNGs); a fresh run shuffles ``range(n_examples)`` with
    ``random.Random(cfg.seed)``; ``evaluate(0)`` runs when nothing was recorded yet; then each
    step runs ``task.train_step``, records its figures, evaluates when due (every
    ``cfg.eval_every`` steps and at the last) and checkpoints when due (every
    ``cfg.checkpoint_every`` steps, at the last step, and after every evaluation, so the best
    figure is never lost).

    Args:
        task: The trainer's step and checkpoint parts (:class:`TrainingTask`).
        n_examples: Number of training examples the sampler draws indices from.
        cfg: Steps, checkpoint and evaluation cadence, seed, the kept metric.
        checkpoints: Where checkpoints are written and found (:class:`Checkpoints`).
        evaluate: ``evaluate(step) -> figures`` (e.g. ``{"dev": nDCG@10}``), recorded with
            ``"step"`` and ``"eval_seconds"``; ``None``: no evaluation.
        on_best: Called with ``(step, figures)`` when ``figures[cfg.metric]`` is the best so far.
        show_progress: A tqdm bar over the steps.

    Returns:
        :class:`LoopResult`.

    Raises:
        ValidationError: ``n_examples < 1``.
        Whatever ``task`` or ``evaluate`` raise (the last checkpoint stays; a rerun resumes).
    """
    if n_examples < 1:
        raise ValidationError("no training examples")
    state = LoopState()
    rng = random.Random(cfg.seed)
    resume = checkpoints.latest()
    if resume is not None and (resume / STATE_FILE).is_file():
        task.load_state(resume)
        _read_loop_state(resume, state, rng)
        logger.info("resumed %s from %s (step %d)", cfg.desc, resume, state.step)
    else:
        resume = None
    if not state.order:
        state.order = list(range(n_examples))
        rng.shuffle(state.order)

    def draw() -> int:
        if state.cursor >= len(state.order):
            rng.shuffle(state.order)
            state.cursor = 0
        i = state.order[state.cursor]
        state.cursor += 1
        return i

    def run_eval() -> None:
        assert evaluate is not None
        t0 = time.perf_counter()
        figures = dict(evaluate(state.step))
        rec = {"step": state.step, **figures, "eval_seconds": time.perf_counter() - t0}
        state.history.append(rec)
        logger.info("%s step %d: %s", cfg.desc, state.step,
                    {k: round(v, 4) if isinstance(v, float) else v for k, v in rec.items()})
        value = figures.get(cfg.metric)
        if value is None:
            return
        if not state.best or (value > state.best[cfg.metric] if cfg.higher_is_better else value < state.best[cfg.metric]):
            state.best = {"step": state.step, **figures}
            if on_best is not None:
                on_best(state.step, figures)

    def save() -> None:
        def write(folder: Path) -> None:
            task.save_state(folder)
            _write_loop_state(folder, state, rng)

        checkpoints.save(state.step, write)

    if evaluate is not None and state.step == 0 and not state.history:
        run_eval()
    bar: Any = None
    if show_progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=cfg.steps, initial=state.step, desc=cfg.desc, unit="step")
    steps_run = 0
    t_run = time.perf_counter()
    while state.step < cfg.steps:
        t_step = time.perf_counter()
        figures = task.train_step(draw, rng)
        state.step += 1
        steps_run += 1
        state.seconds += time.perf_counter() - t_step
        state.history.append({"step": state.step, **figures})
        if bar is not None:
            bar.update(1)
            bar.set_postfix({k: f"{v:.3f}" for k, v in figures.items() if v is not None})
        last = state.step == cfg.steps
        evaluated = evaluate is not None and (last or (cfg.eval_every > 0 and state.step % cfg.eval_every == 0))
        if evaluated:
            run_eval()
        if evaluated or last or state.step % cfg.checkpoint_every == 0:
            save()
    if bar is not None:
        bar.close()
    return LoopResult(state, steps_run, time.perf_counter() - t_run, resume)

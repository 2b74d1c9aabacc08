"""The one training loop (:mod:`heedrank.lab.train.loop`) on a toy task (a linear model, no LM):
a run killed mid-way and started again ends exactly where an uninterrupted run ends;
``.tmp`` folders are never read as checkpoints; every file is fsynced before the rename; the
evaluation hook keeps the best; numbered checkpoints are pruned."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from heedrank.errors import ValidationError  # noqa: E402
from heedrank.lab.train.loop import STATE_FILE, Checkpoints, LoopConfig, run_loop  # noqa: E402

N = 7  # examples: epochs end mid-step, so the sampler's reshuffle is exercised


class Killed(Exception):
    pass


class ToyTask:
    """Least squares on seeded data; each step draws 3 examples, a coin from the loop's RNG and
    noise from torch's generator, so any RNG or sampler state lost on resume changes the result."""

    def __init__(self, kill_at: int | None = None) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(N, 4, generator=g)
        self.y = self.x @ torch.tensor([1.0, -2.0, 0.5, 3.0])
        torch.manual_seed(1)
        self.model = torch.nn.Linear(4, 1)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=0.05)
        self.kill_at, self.steps = kill_at, 0
        self.seen: list[int] = []

    def train_step(self, draw, rng: random.Random) -> dict[str, float]:
        self.steps += 1
        if self.kill_at is not None and self.steps == self.kill_at:
            raise Killed()
        self.opt.zero_grad()
        idx = [draw() for _ in range(3)]
        self.seen += idx
        scale = 1.0 + rng.random()
        noise = 0.01 * torch.randn(3)
        loss = (((self.model(self.x[idx]).squeeze(-1) - self.y[idx]) * scale + noise) ** 2).mean()
        loss.backward()
        self.opt.step()
        return {"loss": float(loss.detach())}

    def save_state(self, folder: Path) -> None:
        torch.save({"model": self.model.state_dict(), "opt": self.opt.state_dict()}, folder / "toy.pt")

    def load_state(self, folder: Path) -> None:
        sd = torch.load(folder / "toy.pt", weights_only=False)
        self.model.load_state_dict(sd["model"])
        self.opt.load_state_dict(sd["opt"])


def _eval_of(task: ToyTask):
    def evaluate(step: int) -> dict[str, float]:
        with torch.no_grad():
            return {"dev": -float(((task.model(task.x).squeeze(-1) - task.y) ** 2).mean())}
    return evaluate


def _run(folder: Path, task: ToyTask, steps: int = 9, **kw):
    cfg = LoopConfig(steps=steps, checkpoint_every=2, eval_every=3, seed=5, desc="toy")
    return run_loop(task, N, cfg, Checkpoints.numbered(folder / "checkpoints", keep=2), evaluate=_eval_of(task),
                    show_progress=False, **kw)


def _timeless(history):
    return [{k: v for k, v in h.items() if k != "eval_seconds"} for h in history]


@pytest.mark.parametrize("kill_at", [2, 5, 8])
def test_a_killed_run_resumes_to_the_uninterrupted_result(tmp_path, kill_at) -> None:
    whole = _run(tmp_path / "whole", ToyTask())
    assert whole.state.step == 9 and whole.steps_this_run == 9 and whole.resumed_from is None
    with pytest.raises(Killed):
        _run(tmp_path / "killed", ToyTask(kill_at=kill_at))
    torch.manual_seed(1234)  # whatever the process did meanwhile: the checkpoint restores torch's generator
    random.seed(99)
    task = ToyTask()
    again = _run(tmp_path / "killed", task)
    done_before = 2 * ((kill_at - 1) // 2)  # the last checkpoint before the kill
    assert again.steps_this_run == 9 - done_before
    assert (again.resumed_from is None) == (done_before == 0)
    assert _timeless(again.state.history) == _timeless(whole.state.history)
    assert (again.state.order, again.state.cursor) == (whole.state.order, whole.state.cursor)
    want = torch.load(tmp_path / "whole" / "checkpoints" / "step-9" / "toy.pt", weights_only=False)["model"]
    for k, v in task.model.state_dict().items():
        assert torch.equal(v, want[k]), k
    # a rerun of a finished run does nothing and returns the same state
    over = _run(tmp_path / "killed", ToyTask())
    assert over.steps_this_run == 0 and _timeless(over.state.history) == _timeless(whole.state.history)


def test_the_sampler_visits_every_example_once_per_epoch(tmp_path) -> None:
    task = ToyTask()
    _run(tmp_path / "run", task, steps=7)  # 21 draws: three epochs of 7
    for epoch in range(3):
        assert sorted(task.seen[epoch * N:(epoch + 1) * N]) == list(range(N))
    assert task.seen[:N] != task.seen[N:2 * N]  # reshuffled


def test_tmp_and_old_folders(tmp_path) -> None:
    _run(tmp_path / "run", ToyTask(), steps=4)
    ckpts = Checkpoints.numbered(tmp_path / "run" / "checkpoints", keep=2)
    assert [p.name for p in ckpts.saved()] == ["step-3", "step-4"]  # after the eval at 3, and at 4; step-2 pruned
    # a save killed before its renames leaves step-N.tmp: never read as a checkpoint
    bad = tmp_path / "run" / "checkpoints" / "step-6.tmp"
    bad.mkdir()
    (bad / STATE_FILE).write_text("{not json")
    assert ckpts.latest() == tmp_path / "run" / "checkpoints" / "step-4"
    resumed = _run(tmp_path / "run", ToyTask(), steps=5)
    assert resumed.resumed_from == tmp_path / "run" / "checkpoints" / "step-4" and resumed.steps_this_run == 1
    # a save killed between its renames leaves only step-N.old: found
    (tmp_path / "run" / "checkpoints" / "step-5").rename(tmp_path / "run" / "checkpoints" / "step-5.old")
    assert ckpts.latest() == tmp_path / "run" / "checkpoints" / "step-5.old"
    rolling = Checkpoints.rolling(tmp_path / "r" / "checkpoint")
    (tmp_path / "r" / "checkpoint.tmp").mkdir(parents=True)
    assert rolling.latest() is None
    (tmp_path / "r" / "checkpoint.old").mkdir()
    assert rolling.latest() == tmp_path / "r" / "checkpoint.old"


def test_every_file_is_fsynced_before_the_rename(tmp_path, monkeypatch) -> None:
    synced: list[str] = []
    renamed: list[int] = []
    real_fsync, real_rename = os.fsync, Path.rename
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real_fsync(fd)))

    def rename(self, target):
        renamed.append(len(synced))
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", rename)
    _run(tmp_path / "run", ToyTask(), steps=1)
    first = renamed[0]  # fsyncs done before the first rename of the first checkpoint
    files = {Path(s).name for s in synced[:first] if "step-1.tmp" in s}
    assert {"toy.pt", STATE_FILE, "torch_rng.pt"} <= files


def test_the_evaluation_hook_keeps_the_best(tmp_path) -> None:
    figures = iter([5.0, 3.0, 4.0, 1.0, 2.0])
    best_calls: list[tuple[int, float]] = []
    task = ToyTask()
    cfg = LoopConfig(steps=4, checkpoint_every=10, eval_every=1, metric="dev_loss", higher_is_better=False)
    res = run_loop(task, N, cfg, Checkpoints.rolling(tmp_path / "checkpoint"),
                   evaluate=lambda step: {"dev_loss": next(figures)},
                   on_best=lambda step, f: best_calls.append((step, f["dev_loss"])), show_progress=False)
    assert best_calls == [(0, 5.0), (1, 3.0), (3, 1.0)]
    assert res.state.best == {"step": 3, "dev_loss": 1.0}
    evals = [h for h in res.state.history if "dev_loss" in h]
    assert [h["step"] for h in evals] == [0, 1, 2, 3, 4] and all("eval_seconds" in h for h in evals)
    saved = json.loads((tmp_path / "checkpoint" / STATE_FILE).read_text())
    assert saved["best"] == {"step": 3, "dev_loss": 1.0} and saved["step"] == 4  # checkpointed after each eval


def test_options_are_checked() -> None:
    with pytest.raises(ValidationError, match="steps"):
        LoopConfig(steps=0)
    with pytest.raises(ValidationError, match="eval_every"):
        LoopConfig(steps=1, eval_every=-1)
    with pytest.raises(ValidationError, match="no training examples"):
        run_loop(ToyTask(), 0, LoopConfig(steps=1), Checkpoints.rolling("unused"), show_progress=False)

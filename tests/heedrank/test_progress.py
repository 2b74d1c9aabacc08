"""Progress off a terminal: no bar redraws, a log line about every 10% (pytest's stderr is not a TTY)."""

from __future__ import annotations

import logging

import pytest

from heedrank.progress import Progress, track


def test_off_a_terminal_logs_every_tenth(caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> None:
    with caplog.at_level(logging.INFO, logger="heedrank.progress"):
        with Progress(total=100, desc="index documents", unit="doc") as bar:
            assert bar.logs
            bar.set_postfix(skipped=2)
            for _ in range(100):
                bar.update(1)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 10
    assert lines[0].startswith("index documents: 10/100 doc (10%)") and lines[0].endswith("skipped=2")
    assert lines[-1].startswith("index documents: 100/100 doc (100%)")
    assert "\r" not in capsys.readouterr().err  # no bar frames


def test_big_steps_log_once_per_step(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="heedrank.progress"):
        with Progress(total=1000, desc="kv build", unit="block") as bar:
            bar.update(450)
            bar.update(550)
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == ["kv build: 450/1000 block", "kv build: 1000/1000 block"]


def test_unknown_total_logs_at_the_end_and_off_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="heedrank.progress"):
        assert list(track(iter(range(3)), total=None, desc="tokenise", unit="doc")) == [0, 1, 2]
        assert list(track(range(5), total=5, desc="quiet", unit="doc", show_progress=False)) == list(range(5))
    assert [r.getMessage().split(" in ")[0] for r in caplog.records] == ["tokenise: 3 doc done"]

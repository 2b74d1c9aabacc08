"""Progress off a terminal: no bar redraws, a log line about every 10% (pytest's stderr is not a TTY);
other libraries' bars off around a load unless the caller wants progress."""

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


@pytest.fixture
def bars_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bars of datasets, transformers and huggingface_hub on, no environment variable
    forcing them, as in a fresh process (a test that started the server turned them off for
    this one); the states are put back afterwards."""
    from importlib import import_module

    import datasets.config
    import huggingface_hub.constants as hub_constants
    from transformers.utils import logging as hf_logging

    ds_tqdm = import_module("datasets.utils.tqdm")  # the module (its package exports a class of that name)
    hub_tqdm = import_module("huggingface_hub.utils.tqdm")

    for module in (datasets.config, ds_tqdm):
        monkeypatch.setattr(module, "HF_DATASETS_DISABLE_PROGRESS_BARS", None)
    monkeypatch.setattr(ds_tqdm, "_hf_datasets_progress_bars_disabled", False)
    for module in (hub_constants, hub_tqdm):
        monkeypatch.setattr(module, "HF_HUB_DISABLE_PROGRESS_BARS", None)
    monkeypatch.setattr(hub_tqdm, "progress_bar_states", {})
    monkeypatch.setattr(hf_logging, "_tqdm_active", True)


@pytest.mark.usefixtures("bars_on")
def test_library_bars_off_around_a_load_then_as_they_were() -> None:
    import datasets
    from huggingface_hub import utils as hub
    from transformers.utils import logging as hf_logging

    from heedrank.progress import library_bars

    assert not datasets.are_progress_bars_disabled() and hf_logging.is_progress_bar_enabled()
    with library_bars("datasets", "transformers", show=False):
        assert datasets.are_progress_bars_disabled() and not hf_logging.is_progress_bar_enabled()
        with library_bars("transformers"):  # nested, as a load inside a quiet call: still off
            assert not hf_logging.is_progress_bar_enabled()
        assert not hf_logging.is_progress_bar_enabled()  # the outer one still holds them
    assert not datasets.are_progress_bars_disabled() and hf_logging.is_progress_bar_enabled()
    assert not hub.are_progress_bars_disabled()
    with library_bars("datasets"):  # no caller asked for progress: off
        assert datasets.are_progress_bars_disabled()
    assert not datasets.are_progress_bars_disabled()


@pytest.mark.usefixtures("bars_on")
def test_library_bars_stay_where_progress_is_wanted() -> None:
    import threading

    import datasets

    from heedrank.progress import library_bars

    seen: dict[str, bool] = {}

    def load_in_a_thread() -> None:
        with library_bars("datasets"):
            seen["thread"] = datasets.are_progress_bars_disabled()

    with library_bars(show=True):  # a CLI command, build_index(show_progress=True)
        with library_bars("datasets"):
            seen["nested"] = datasets.are_progress_bars_disabled()
        worker = threading.Thread(target=load_in_a_thread)
        worker.start()
        worker.join()
    assert seen == {"nested": False, "thread": True}  # a thread starts without the wish
    datasets.disable_progress_bars()
    try:
        with library_bars("datasets", show=False):
            pass
        assert datasets.are_progress_bars_disabled()  # off before: left off
    finally:
        datasets.enable_progress_bars()
    with pytest.raises(ValueError, match="unknown library"):
        with library_bars("tqdm", show=False):
            pass

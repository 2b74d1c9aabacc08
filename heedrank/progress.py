"""Progress of long loops: a tqdm bar on a terminal, plain log lines elsewhere.

A bar redrawn into a log file (``heedrank index build ... > build.log 2>&1``) fills it with
carriage-return frames. :class:`Progress` asks tqdm to disable its bar when its stream
(stderr) is not a TTY (``disable=None``) and then logs one line at about every 10% of
``total`` instead, through :mod:`logging` (so the CLI's handler formats it like any other
record). With ``show_progress=False`` there is neither a bar nor log lines.

Other libraries draw bars of their own while heedrank loads through them: ``datasets``
("Generating train split" when it makes a corpus's Arrow copy) and ``transformers`` ("Loading
weights" for the LM and the embedder). :func:`library_bars` turns them off around such a load
unless the caller wants progress: ``show_progress=True`` of the call, or a ``heedrank`` CLI
command (it declares the wish for the command's thread). A library call that asked for no
progress (``build_index(..., show_progress=False)``, a :class:`heedrank.pipeline.Pipeline`'s
searches) prints no bar.

``tqdm`` is imported when a :class:`Progress` is created.

Example:
    >>> with Progress(total=4, desc="index documents", unit="doc") as bar:  # doctest: +SKIP
    ...     for _ in range(4):
    ...         bar.update(1)
    # not a TTY: INFO heedrank.progress: index documents: 1/4 doc (25%), 0:00:00 elapsed, ...
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import timedelta
from types import TracebackType
from typing import Any, TypeVar

logger = logging.getLogger(__name__)

LOG_STEP = 0.1
"""Fraction of ``total`` between two log lines when the bar is off (about every 10%)."""

T = TypeVar("T")


class Progress:
    """A tqdm bar that turns into log lines when stderr is not a terminal.

    Args:
        total: Units the loop will count (``None`` or 0: unknown; then no intermediate
            log lines, only one at :meth:`close`).
        desc: What the loop does (the bar's label, the log line's start).
        unit: What one unit is (``"doc"``, ``"block"``).
        show_progress: ``False``: no bar and no log lines.
        log: Logger of the lines (default: this module's).
        **tqdm_kwargs: More ``tqdm`` arguments (``leave``, ``dynamic_ncols``...).

    Attributes:
        bar: The ``tqdm`` object (disabled off a terminal).
        logs: Whether progress goes to log lines (the bar is off and progress is wanted).
    """

    def __init__(self, *, total: int | None, desc: str, unit: str, show_progress: bool = True,
                 log: logging.Logger | None = None, **tqdm_kwargs: Any) -> None:
        from tqdm.auto import tqdm

        self.bar: Any = tqdm(total=total, desc=desc, unit=unit, disable=None if show_progress else True,
                             **tqdm_kwargs)
        self.logs = bool(show_progress and self.bar.disable)
        self.total = int(total) if total else 0
        self.desc = desc
        self.unit = unit
        self.n = 0
        self._log = log or logger
        self._step = max(1, int(self.total * LOG_STEP)) if self.total else 0
        self._next = self._step
        self._postfix: dict[str, Any] = {}
        self._t0 = time.perf_counter()
        self._closed = False

    def update(self, n: int = 1) -> None:
        """Count ``n`` more units done; logs a line each time about 10% more of ``total`` is done."""
        self.bar.update(n)
        self.n += n
        if self.logs and self._step and self.n >= self._next:
            self._log_line()
            while self._next <= self.n:
                self._next += self._step

    def set_postfix(self, **values: Any) -> None:
        """Extra ``name=value`` pairs shown after the bar (or at the end of the log lines)."""
        self._postfix.update(values)
        self.bar.set_postfix(**values)

    def _log_line(self, *, done: bool = False) -> None:
        elapsed = time.perf_counter() - self._t0
        rate = self.n / elapsed if elapsed > 0 else 0.0
        extra = "".join(f", {k}={v}" for k, v in self._postfix.items())
        if self.total and not done:
            eta = (self.total - self.n) / rate if rate > 0 else 0.0
            self._log.info("%s: %d/%d %s (%.0f%%), %s elapsed, %.1f %s/s, ETA %s%s", self.desc, self.n, self.total,
                           self.unit, 100.0 * self.n / self.total, _clock(elapsed), rate, self.unit, _clock(eta), extra)
        else:
            self._log.info("%s: %d %s done in %s, %.1f %s/s%s", self.desc, self.n, self.unit, _clock(elapsed), rate,
                           self.unit, extra)

    def close(self) -> None:
        """Close the bar; off a terminal, log a last line when the loop ended before a
        logged 100% (unknown total, or stopped early)."""
        if self._closed:
            return
        self._closed = True
        self.bar.close()
        if self.logs and self.n and (not self.total or self.n < self.total):
            self._log_line(done=True)

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def track(items: Iterable[T], *, total: int | None, desc: str, unit: str, show_progress: bool = True,
          log: logging.Logger | None = None, **tqdm_kwargs: Any) -> Iterator[T]:
    """Yield ``items`` while counting them on a :class:`Progress` (see it for the arguments);
    the bar is closed when the iteration ends or the generator is closed."""
    with Progress(total=total, desc=desc, unit=unit, show_progress=show_progress, log=log, **tqdm_kwargs) as bar:
        for item in items:
            yield item
            bar.update(1)


def _clock(seconds: float) -> str:
    """``H:MM:SS`` of a duration in seconds."""
    return str(timedelta(seconds=int(round(seconds))))


def quiet_progress_bars() -> None:
    """Turn off tqdm progress bars in this process, other libraries' too (a log gets lines, not
    bars): ``TQDM_DISABLE``, ``HF_HUB_DISABLE_PROGRESS_BARS`` and
    ``HF_DATASETS_DISABLE_PROGRESS_BARS`` for what is imported later (transformers prints a
    weights bar per model load, datasets one per corpus it prepares), and the switches of
    transformers, huggingface_hub and datasets when they are imported already. Environment
    variables already set are kept (``TQDM_DISABLE=0`` brings the bars back). :class:`Progress`
    then logs its lines."""
    import os
    import sys

    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    if os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] != "1":
        return
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    if "datasets" in sys.modules:
        import datasets

        datasets.disable_progress_bars()


_WANTED: ContextVar[bool] = ContextVar("heedrank_progress_wanted", default=False)
"""Whether the code running in this context wants other libraries' bars; set by
:func:`library_bars` with ``show`` given (a thread starts with ``False``)."""

_OFF_LOCK = threading.Lock()
_off_depth = 0
_restore: list[Callable[[], None]] = []


@contextmanager
def library_bars(*libraries: str, show: bool | None = None) -> Iterator[None]:
    """Around a load by another library: that library's progress bars off unless progress is
    wanted, put back as they were on exit.

    Args:
        *libraries: ``"datasets"`` and/or ``"transformers"`` (with ``huggingface_hub``); each
            is imported here when it is installed (the load imports it anyway; a missing one is
            left for the load to report).
        show: ``True``: leave the bars as they are (a process that turned them off, such as
            the server or a CLI writing to a log file, keeps them off); ``False``: off;
            ``None``: what the enclosing ``library_bars(show=...)`` of this thread said, else
            off. The value holds for nested calls too (an embedder loaded inside
            ``build_index(show_progress=True)`` shows its bar).

    Bars are switched process-wide (the libraries have no other switch): while one thread
    holds them off, a load in another thread shows none either. An environment variable
    that forces bars on (``HF_DATASETS_DISABLE_PROGRESS_BARS=0``,
    ``HF_HUB_DISABLE_PROGRESS_BARS=0``) is obeyed.

    Example:
        >>> with library_bars("datasets", show=False):  # doctest: +SKIP
        ...     corpus = load_beir_corpus(path)  # no "Generating train split" bar
    """
    wanted = _WANTED.get() if show is None else show
    token = _WANTED.set(wanted)
    try:
        if wanted:
            yield
        else:
            with _bars_off(libraries):
                yield
    finally:
        _WANTED.reset(token)


@contextmanager
def _bars_off(libraries: tuple[str, ...]) -> Iterator[None]:
    """The bars of ``libraries`` off while any thread is inside; the states they had before
    the first entry restored when the last one leaves."""
    global _off_depth
    with _OFF_LOCK:
        _restore.extend(undo for name in libraries if (undo := _turn_off(name)) is not None)
        _off_depth += 1
    try:
        yield
    finally:
        with _OFF_LOCK:
            _off_depth -= 1
            if _off_depth == 0:
                for undo in reversed(_restore):
                    undo()
                _restore.clear()


def _turn_off(library: str) -> Callable[[], None] | None:
    """Turn ``library``'s bars off; returns what puts them back (``None``: nothing to undo,
    they were off, forced on by the environment, or the library is not installed)."""
    if library == "datasets":
        try:
            import datasets
        except ImportError:
            return None
        if datasets.config.HF_DATASETS_DISABLE_PROGRESS_BARS is False or datasets.are_progress_bars_disabled():
            return None
        datasets.disable_progress_bars()
        return datasets.enable_progress_bars
    if library == "transformers":
        try:
            from huggingface_hub import constants as hub_constants
            from huggingface_hub import utils as hub
            from transformers.utils import logging as hf_logging
        except ImportError:
            return None
        hub_on = not hub.are_progress_bars_disabled()
        if hub_constants.HF_HUB_DISABLE_PROGRESS_BARS is False or not hf_logging.is_progress_bar_enabled():
            return None
        hf_logging.disable_progress_bar()  # the "Loading weights" bar; also huggingface_hub's

        def undo() -> None:
            hf_logging.enable_progress_bar()  # turns huggingface_hub's back on too
            if not hub_on:
                hub.disable_progress_bars()

        return undo
    raise ValueError(f"unknown library {library!r}: use 'datasets' or 'transformers'")

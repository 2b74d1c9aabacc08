"""Command line: ``heedrank`` (also ``python -m heedrank``).

This module only wires the command groups together, sets up logging, and holds the one
error boundary: a typed error (:class:`heedrank.errors.HeedrankError`) ends as one red line
and exit code 2, with the traceback too when ``HEEDRANK_DEBUG=1``.

The product commands, what a user of the service runs, are ``index build|info|compact|stats``,
``index kv build`` (:mod:`~heedrank.cli.index`, :mod:`~heedrank.cli.kv`), ``serve``
(:mod:`~heedrank.cli.serve`), ``rerank-batch`` (:mod:`~heedrank.cli.batch`) and ``eval
beir|trec-dl|compare`` (:mod:`~heedrank.cli.eval`); the options they share are in
:mod:`~heedrank.cli.options`. Research and model building is one group, ``heedrank lab``
(:mod:`heedrank.lab.cli`), registered lazily as ``vllm bench`` is: its modules are imported
only when ``lab`` is invoked.

Commands import their implementation lazily, so ``heedrank --help`` is instant.
"""

from __future__ import annotations

import functools
import logging
import os
import traceback
from collections.abc import Callable
from typing import Annotated, Any, NoReturn

import typer

from typer.core import TyperGroup

from heedrank.cli import batch, index, kv, serve
from heedrank.cli import eval as evaluation

DEBUG_ENV = "HEEDRANK_DEBUG"
"""Set to ``1`` (any value but ``""``/``0``) to print a failing command's traceback."""

app = typer.Typer(help="heedrank: retrieval and attention-based in-context reranking.", no_args_is_help=True)
app.add_typer(index.app, name="index")
index.app.add_typer(kv.app, name="kv")
app.add_typer(evaluation.app, name="eval")
app.command("serve", epilog=serve.EXAMPLES)(serve.serve)
app.command("rerank-batch", epilog=batch.EXAMPLES)(batch.rerank_batch_cmd)

LAB_HELP = "Research and model building: feature study, cut-off calibration, heads, layer sweep, fine-tuning."
"""``heedrank lab``'s line in ``heedrank --help``, shown without importing the group."""


class _LazyLab(TyperGroup):
    """``heedrank lab``: its commands are :mod:`heedrank.lab.cli`'s, imported the first time
    this group lists or resolves one (``heedrank lab ...``, ``heedrank lab --help``), never
    when the root's help only names it."""

    # click's types are left as Any: recent typer releases vendor their own copy of click
    def _lab(self) -> TyperGroup:
        lab = _lab_group()
        self.help, self.epilog = lab.help, lab.epilog
        return lab

    def list_commands(self, ctx: Any) -> list[str]:
        return list(self._lab().list_commands(ctx))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        return self._lab().get_command(ctx, cmd_name)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self._lab()
        super().format_help(ctx, formatter)


@functools.cache
def _lab_group() -> TyperGroup:
    """The lab's commands, wrapped by the error boundary once per process."""
    from heedrank.lab.cli import app as lab_app

    _wrap_all(lab_app)
    group = typer.main.get_command(lab_app)
    assert isinstance(group, TyperGroup)
    return group


app.add_typer(typer.Typer(cls=_LazyLab, no_args_is_help=True), name="lab", help=LAB_HELP)


@app.callback()
def _main(
    ctx: typer.Context,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
) -> None:
    import sys

    from tqdm.contrib.logging import _TqdmLoggingHandler  # keeps bars intact under logging

    from heedrank.progress import library_bars, quiet_progress_bars

    if not sys.stderr.isatty():  # a log file: other libraries' bars off too (heedrank.progress logs lines)
        quiet_progress_bars()
    # a command shows progress: the bars of the models and corpora it loads stay as they are
    # (on a terminal; off in a log file, above), where a library call has them off
    ctx.with_resource(library_bars(show=True))

    handler = _TqdmLoggingHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    from heedrank.config import NOISY_LOGGERS, is_library_noise

    handler.addFilter(lambda record: not is_library_noise(record))
    for noisy in NOISY_LOGGERS:
        logging.getLogger(noisy).setLevel(logging.WARNING)


# ---------------------------------------------------------------------------- errors
def _debug() -> bool:
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


def _fail(exc: Exception) -> NoReturn:
    """Print ``exc`` as one red ``error (<error_type>): <message>`` line (after its traceback
    when ``HEEDRANK_DEBUG`` is set) and exit 2."""
    if _debug():
        typer.echo("".join(traceback.format_exception(exc)), err=True, nl=False)
    typer.secho(f"error ({getattr(exc, 'error_type', type(exc).__name__)}): {exc}", fg="red", err=True)
    raise typer.Exit(2)


def _typed_errors(command: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a command so that every typed error (:class:`heedrank.errors.HeedrankError`) ends
    as one red ``error (<error_type>): <message>`` line and exit code 2, never a traceback
    (unless ``HEEDRANK_DEBUG`` is set); Ctrl-C exits 130."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from heedrank.errors import HeedrankError

        try:
            return command(*args, **kwargs)
        except HeedrankError as exc:
            _fail(exc)
        except KeyboardInterrupt:
            typer.secho("interrupted", fg="yellow", err=True)
            raise typer.Exit(130) from None

    return wrapper


def _wrap_all(group: typer.Typer) -> None:
    """Wrap every command of ``group`` and of its subgroups, however deep."""
    for info in group.registered_commands:
        info.callback = _typed_errors(info.callback) if info.callback is not None else None
    for sub in group.registered_groups:
        if sub.typer_instance is not None:
            _wrap_all(sub.typer_instance)


_wrap_all(app)


def main() -> None:
    """Console entry point (``heedrank``)."""
    app()


if __name__ == "__main__":  # pragma: no cover
    main()

"""Command line: ``heedrank`` (also ``python -m heedrank``).

This module only wires the command groups together (one module each:
:mod:`~heedrank.cli.index`, :mod:`~heedrank.cli.kv`, :mod:`~heedrank.cli.serve`,
:mod:`~heedrank.cli.batch`, :mod:`~heedrank.cli.eval` with :mod:`~heedrank.cli.study`,
:mod:`~heedrank.cli.heads`, :mod:`~heedrank.cli.train`; the options they share are in
:mod:`~heedrank.cli.options`), sets up logging, and holds the one error boundary: a typed
error (:class:`heedrank.errors.HeedrankError`) ends as one red line and exit code 2, with
the traceback too when ``HEEDRANK_DEBUG=1``.

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

from heedrank.cli import batch, heads, index, kv, serve, train
from heedrank.cli import eval as evaluation

DEBUG_ENV = "HEEDRANK_DEBUG"
"""Set to ``1`` (any value but ``""``/``0``) to print a failing command's traceback."""

app = typer.Typer(help="heedrank: retrieval and attention-based in-context reranking.", no_args_is_help=True)
app.add_typer(index.app, name="index")
index.app.add_typer(kv.app, name="kv")
app.add_typer(evaluation.app, name="eval")
app.add_typer(heads.app, name="heads")
app.add_typer(train.app, name="train")
app.command("serve", epilog=serve.EXAMPLES)(serve.serve)
app.command("rerank-batch", epilog=batch.EXAMPLES)(batch.rerank_batch_cmd)


@app.callback()
def _main(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
) -> None:
    from tqdm.contrib.logging import _TqdmLoggingHandler  # keeps bars intact under logging

    handler = _TqdmLoggingHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    for noisy in ("httpx", "urllib3", "filelock", "datasets", "sentence_transformers", "transformers"):
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

"""The CLI's root module and shared options: the error boundary (``HEEDRANK_DEBUG=1``
prints the traceback) and the engine flags, declared once and handed to a command as one
engine."""

from __future__ import annotations

from typing import Annotated

import typer
from typer.testing import CliRunner

from heedrank.cli import app
from heedrank.cli.options import QUERIES_ENGINE_HELP, engine_flags
from heedrank.engine import Engine, LocalEngine


def test_typed_error_is_one_line_and_debug_adds_the_traceback(tmp_path):
    runner = CliRunner()
    args = ["index", "stats", str(tmp_path / "missing")]
    plain = runner.invoke(app, args)
    assert plain.exit_code == 2 and "error (" in plain.output and "Traceback" not in plain.output
    debug = runner.invoke(app, args, env={"HEEDRANK_DEBUG": "1"})
    assert debug.exit_code == 2 and "Traceback (most recent call last)" in debug.output
    assert debug.output.rstrip().splitlines()[-1] == plain.output.rstrip().splitlines()[-1]
    off = runner.invoke(app, args, env={"HEEDRANK_DEBUG": "0"})
    assert "Traceback" not in off.output


def test_engine_flags_take_the_engine_parameter_s_place():
    seen: list[Engine] = []
    demo = typer.Typer()

    @demo.command()
    @engine_flags(QUERIES_ENGINE_HELP)
    def run(first: Annotated[int, typer.Option("--first")] = 1, engine: Engine = LocalEngine(),
            last: Annotated[int, typer.Option("--last")] = 2) -> None:
        seen.append(engine)

    runner = CliRunner()
    assert runner.invoke(demo, ["--first", "3"]).exit_code == 0
    assert isinstance(seen[-1], LocalEngine)
    text = runner.invoke(demo, ["--help"], terminal_width=200).output
    order = [text.index(flag) for flag in ("--first", "--engine", "--ray-address", "--actors", "--actor-cpus",
                                           "--actor-gpus", "--last")]
    assert order == sorted(order)
    bad = runner.invoke(demo, ["--actor-gpus", "1"])
    assert bad.exit_code != 0 and "only apply with --engine ray" in str(bad.exception)


def test_library_debug_lines_are_noise_even_when_the_library_sets_its_level() -> None:
    """bm25s sets its own logger to DEBUG on import; the CLI's handler filter drops its lines
    below WARNING and keeps its warnings and every heedrank line."""
    import logging

    from heedrank.config import is_library_noise

    def rec(name: str, level: int) -> logging.LogRecord:
        return logging.LogRecord(name, level, __file__, 1, "m", None, None)

    assert is_library_noise(rec("bm25s", logging.DEBUG)) and is_library_noise(rec("faiss.loader", logging.INFO))
    assert not is_library_noise(rec("bm25s", logging.WARNING))
    assert not is_library_noise(rec("heedrank.index.builder", logging.INFO))

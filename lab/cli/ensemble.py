"""``heedrank lab ensemble``: two models' defaults fused with the first stage, from their recipes'
dumps (:mod:`heedrank.lab.ensemble`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer


def lab_ensemble(
    a: Annotated[tuple[Path, Path], typer.Option("--a", help="Model A's weights card and dump folder.")],
    b: Annotated[tuple[Path, Path], typer.Option("--b", help="Model B's weights card and dump folder.")],
    dev: Annotated[str, typer.Option(help="Dump name the weights are chosen on.")] = "qa-nf-dev-hybrid50",
    test: Annotated[list[str] | None, typer.Option("--test", help="Dump names to report (repeat).")] = None,
) -> None:
    """Weights for z(first stage), z(A) and z(B) chosen on dev; nDCG@10 and paired deltas per set (JSON)."""
    from heedrank.lab.ensemble import ensemble_study

    typer.echo(json.dumps(ensemble_study(a, b, dev, test or []), indent=1))

"""``heedrank lab fit-independent``: the list-independent scorer's weights
(:mod:`heedrank.lab.train.independent_fit`), written as the ``independent`` entry of a new
weights card."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer


def lab_fit_independent(
    train: Annotated[list[str], typer.Option("--train", help="DUMP[@MIN_GRADE]: training feature dumps with "
                                             "'independent' features (heedrank lab dump; repeatable; MIN_GRADE the "
                                             "lowest relevant grade, default 1, 2 for TREC DL).")],
    dev: Annotated[Path, typer.Option("--dev", help="Dev dump: C and the fusion weight are chosen on it.")],
    test: Annotated[Optional[list[str]], typer.Option(
        "--test", help="NAME=DUMP[@MIN_GRADE] test sets (repeatable; MIN_GRADE 2 for TREC DL).")] = None,
    card: Annotated[Optional[Path], typer.Option("--card", help="Weights card to add the entry to (read only).")] = None,
    write_card: Annotated[Optional[Path], typer.Option(
        "--write-card", help="Write --card with the 'independent' entry to this NEW path.")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="Write the entry and report (JSON) here.")] = None,
) -> None:
    """Fit the list-independent scorer (logistic regression on the standardised features of every
    (layer, head, row group); C and the fusion weight chosen on dev) and report nDCG@10, ROC AUC and
    calibration error on dev and each test set."""
    from heedrank.lab.cli.study import write_new_card
    from heedrank.lab.dumps import command_line, graded_sets
    from heedrank.lab.train.independent_fit import fit_independent, format_fit
    from heedrank.reranker.cards import read_card

    if write_card is not None and card is None:
        raise typer.BadParameter("--write-card adds the entry to a card: give --card", param_hint="--write-card")
    sources, tests = graded_sets(train, test or [])
    fit = fit_independent(sources, dev, tests)
    entry = {**fit.entry, "command": command_line("heedrank lab fit-independent", [
        ("--train", train), ("--dev", dev), ("--test", test), ("--card", card), ("--write-card", write_card)])}
    if out is not None:
        out.write_text(json.dumps(entry, indent=1))
    if write_card is not None and card is not None:
        write_new_card(write_card, {**read_card(card).data, "independent": entry}, source=card)
    typer.echo(format_fit(fit))

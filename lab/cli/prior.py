"""``heedrank lab order-prior``: how /rerank should use the order documents come in
(:mod:`heedrank.lab.order_prior`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def lab_order_prior(
    first: Annotated[list[Path], typer.Option("--first", help="First-stage TREC run (repeat: one per set).")],
    reranker: Annotated[list[Path], typer.Option("--reranker", help="The reranker's run over the same candidates, "
                                                  "`eval ... --fusion none` (repeat, same order).")],
    qrels: Annotated[list[Path], typer.Option("--qrels", help="Qrels of each set (repeat, same order): a TREC "
                                              "qrels file, or a BEIR folder's qrels/SPLIT.tsv.")],
    candidates: Annotated[list[int], typer.Option("--candidates", help="Candidates per query of each set.")],
    name: Annotated[list[str], typer.Option("--name", help="A label per set.")],
    shuffles: Annotated[int, typer.Option(help="Seeded shuffles averaged per set.")] = 5,
) -> None:
    """nDCG@10 of every candidate form of /rerank's use of the given order, on given and shuffled lists."""
    from heedrank.data import load_beir_qrels, load_trec_qrels, load_trec_run
    from heedrank.lab.order_prior import from_runs, table

    def judged(path: Path):
        return load_beir_qrels(path.parent.parent, path.stem) if path.suffix == ".tsv" else load_trec_qrels(path)

    sets = {label: from_runs(load_trec_run(f), load_trec_run(r), judged(q), n)
            for label, f, r, q, n in zip(name, first, reranker, qrels, candidates, strict=True)}
    rows = table(sets, shuffles)
    cols = list(rows[0])
    typer.echo("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for row in rows:
        typer.echo("| " + " | ".join(str(row[c]) for c in cols) + " |")

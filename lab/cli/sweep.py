"""``heedrank lab layer-sweep``: BlockRank's nDCG@10 read at every layer, to choose the
scoring layer l* (:mod:`heedrank.lab.layer_sweep`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from heedrank.cli.options import DeviceOpt, MaxDocTokensOpt, ModelOpt, SeedOpt, reranker_config


def lab_layer_sweep(
    data: Annotated[Path, typer.Option("--data", help="BEIR-layout dataset folder.")],
    split: Annotated[str, typer.Option("--split", help="qrels split; use dev (never test) to choose l*.")] = "dev",
    retriever: Annotated[str, typer.Option("--retriever")] = "bm25",
    candidates: Annotated[int, typer.Option("--candidates")] = 20,
    max_queries: Annotated[Optional[int], typer.Option("--max-queries")] = 100,
    seed: SeedOpt = 0,
    index: Annotated[Optional[Path], typer.Option("--index", help="Index directory; default: built once and cached.")] = None,
    out: Annotated[Path, typer.Option("--out")] = Path("runs"),
    model: ModelOpt = None,
    max_doc_tokens: MaxDocTokensOpt = None,
    device: DeviceOpt = "cpu",
) -> None:
    """BlockRank nDCG@10 read at every layer from one pass per query, to choose the scoring layer l*."""
    from heedrank.lab.layer_sweep import format_sweep, layer_sweep_beir

    result = layer_sweep_beir(
        data, split=split, retriever=retriever, candidates=candidates, max_queries=max_queries, seed=seed,
        index_dir=index, out_dir=out, reranker_config=reranker_config("blockrank", model, max_doc_tokens, device),
    )
    typer.echo(format_sweep(result))

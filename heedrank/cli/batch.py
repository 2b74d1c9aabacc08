"""``heedrank rerank-batch``: rerank a first-stage TREC run, streaming and resumable, on the
local engine or a Ray actor pool (:mod:`heedrank.eval.batch`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from heedrank.cli.options import (
    QUERIES_ENGINE_HELP,
    BatchFusionOpt,
    DeviceOpt,
    MaxDocTokensOpt,
    ModelOpt,
    OptsOpt,
    engine_flags,
    fusion_value,
    reranker_config,
)
from heedrank.engine import Engine, LocalEngine

EXAMPLES = """\
Examples:

  heedrank rerank-batch --topics topics.tsv --run bm25.trec --docs indexes/msmarco --out reranked.trec
  heedrank rerank-batch --topics topics.tsv --run bm25.trec --docs run.json.gz --out r.trec --method icr
  heedrank rerank-batch ... --out r.trec --fusion 0.6     (rerun the same command to resume)
  heedrank rerank-batch ... --out r.trec --engine ray --actors 4 --actor-cpus 2
"""


@engine_flags(QUERIES_ENGINE_HELP)
def rerank_batch_cmd(
    topics: Annotated[Path, typer.Option("--topics", help="TREC topics file (qid<TAB>text).")],
    run: Annotated[Path, typer.Option("--run", help="First-stage TREC run (qid Q0 docid rank score tag), .gz ok.")],
    docs: Annotated[Path, typer.Option("--docs", help="Index directory, or a rank_llm run JSON with the passages.")],
    out: Annotated[Path, typer.Option("--out", help="Output TREC run (appended per query; OUT.progress beside it).")],
    method: Annotated[str, typer.Option("--method", help="Reranker: default (blockrank-cached, the best measured), "
                                        "icr, blockrank.")] = "default",
    candidates: Annotated[int, typer.Option("--candidates", help="Top first-stage hits reranked per query.")] = 20,
    depth: Annotated[Optional[int], typer.Option("--depth", help="Hits written per query; default: all of the run's.")] = None,
    tag: Annotated[Optional[str], typer.Option("--tag", help="Run tag; default heedrank-METHOD-cN.")] = None,
    max_queries: Annotated[Optional[int], typer.Option("--max-queries", help="Only the first N queries (topics order).")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Start afresh instead of resuming.")] = False,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Progress bar.")] = True,
    model: ModelOpt = None,
    max_doc_tokens: MaxDocTokensOpt = None,
    device: DeviceOpt = "cpu",
    engine: Engine = LocalEngine(),
    opt: OptsOpt = None,
    fusion: BatchFusionOpt = "default",
) -> None:
    """Rerank a TREC run query by query, appending each query's ranking as it finishes.

    Rerun the same command after an interruption to resume: completed queries are
    skipped and a partly written one is rewritten, so the output equals an uninterrupted
    run's. A document that cannot be reranked is logged and ranked below the others.
    With --engine ray the queries are reranked by a Ray actor pool and written here in the
    same order: the output is byte-identical, and a run may be resumed with either engine.
    """
    from heedrank.eval.batch import rerank_batch

    try:
        summary = rerank_batch(
            topics, run, docs, out, method=method, candidates=candidates, depth=depth, tag=tag,
            max_queries=max_queries, overwrite=overwrite, show_progress=progress,
            reranker_config=reranker_config(method, model, max_doc_tokens, device, opt),
            engine=engine, fusion=fusion_value(fusion, reranker_config(method, model, max_doc_tokens, device, opt)),
        )
    except KeyboardInterrupt:
        typer.secho(f"interrupted; rerun the same command to resume {out}", fg="yellow", err=True)
        raise typer.Exit(130) from None
    typer.echo(json.dumps(summary.to_dict(), indent=2))

"""``heedrank index kv``: the document KV store of an index, every candidate block encoded
once so that cached BlockRank runs only the query block per query."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from heedrank.cli.options import BLOCKS_ENGINE_HELP, DeviceOpt, MaxDocTokensOpt, ModelOpt, OptsOpt, engine_flags, reranker_config
from heedrank.engine import Engine, LocalEngine

EXAMPLES = """\
Examples:

  heedrank index kv build --index indexes/nfcorpus
  heedrank index kv build --index indexes/nfcorpus --layer 15 --dtype float16 --verify --prune
  heedrank index kv build --index /shared/ix --engine ray --actors 4 --actor-cpus 4
"""

app = typer.Typer(help="The document KV store: candidate blocks encoded once (cached BlockRank).",
                  epilog=EXAMPLES, no_args_is_help=True)


@app.command("build")
@engine_flags(BLOCKS_ENGINE_HELP)
def index_kv_build(
    index: Annotated[Path, typer.Option("--index", help="Index directory (the store goes to INDEX/kv).")],
    model: ModelOpt = None,
    layer: Annotated[Optional[int], typer.Option("--layer", help="Scoring layer l*: layers 0..l* are stored; "
                                                 "default: the default method's (its weights card's `layer` for the "
                                                 "packaged SmolLM2; else round(0.6 L)).")] = None,
    max_doc_tokens: MaxDocTokensOpt = None,
    dtype: Annotated[Optional[str], typer.Option("--dtype", help="int8 (0.85 MB per 128-token block) or "
                                                          "float16 (exact, 1.62 MB); default: the reranker's "
                                                          "kv_dtype.")] = None,
    device: DeviceOpt = "cpu",
    opts: OptsOpt = None,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Blocks per LM batch and per shard.")] = 32,
    verify: Annotated[bool, typer.Option("--verify", help="crc32-check stored blocks first, recompute bad ones.")] = False,
    prune: Annotated[bool, typer.Option("--prune", help="Then delete blocks of deleted or replaced documents and "
                                        "compact the store.")] = False,
    engine: Engine = LocalEngine(),
) -> None:
    """Encode every document's cached-BlockRank block once (method blockrank-cached, the
    default) into the index's document KV store, so that reranking runs only the query block per query.
    Resumable: a rerun (also after kill -9) skips finished shards. With --engine ray the
    blocks are encoded by Ray actors, each writing its own part of the store, committed into
    it by this process; an interrupted build resumes with either engine."""
    from dataclasses import replace

    from heedrank.index.kv import build_index_blocks
    from heedrank.index.store import Index
    from heedrank.registry import build_reranker

    # blocks never use a query adapter: the store serves the reranker with or without one
    extra = {"query_adapter": None, **({"kv_dtype": dtype} if dtype is not None else {}),
             **({"layer": layer} if layer is not None else {})}
    config = reranker_config("blockrank-cached", model, max_doc_tokens, device, opts)
    config = config.with_options(**extra)
    # with Ray this process only tokenises and reads the header: its LM stays on the CPU
    reranker = build_reranker(config if engine.in_process else replace(config, device="cpu"))
    ix = Index.open(index)
    try:
        store, report = build_index_blocks(ix, reranker, engine=engine, config=config, batch_size=batch_size,
                                           show_progress=True, verify_existing=verify, prune=prune)
        stats = store.stats()
    except KeyboardInterrupt:
        typer.secho(f"interrupted; rerun the same command to resume {index / Index.KV_DIR}", fg="yellow", err=True)
        raise typer.Exit(130) from None
    finally:
        ix.close()
    typer.echo(json.dumps({
        "blocks": stats.blocks, "computed": report.computed, "skipped": report.skipped, "seconds": round(report.seconds, 1),
        "blocks_per_second": round(report.computed / report.seconds, 2) if report.seconds and report.computed else None,
        "bytes_on_disk": stats.bytes_on_disk, "bytes_per_block": stats.live_bytes // max(1, stats.blocks),
        "header": reranker.block_store_header().to_dict(),
    }, indent=2))

"""``heedrank lab train``: fine-tune rerankers: BlockRank (the LM) and the query-side adapter of
cached BlockRank (stored blocks stay valid). The work is :mod:`heedrank.lab.train.blockrank` and
:mod:`heedrank.lab.train.query_adapter` (one resumable loop, :mod:`heedrank.lab.train.loop`)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer

from heedrank.cli.options import OptsOpt, DeviceOpt, MaxDocTokensOpt, ModelOpt, SeedOpt, reranker_config
from heedrank.reranker.options import CachedBlockRankOptions

EXAMPLES = """\
Examples:

  heedrank lab train blockrank --data data/beir-nfcorpus --out runs/br-ft --steps 100 --device auto
  heedrank lab train query-adapter --train data/beir-nfcorpus:train --dev data/beir-nfcorpus:dev --out runs/qa
  heedrank lab train query-adapter --train data/msmarco-trec-dl-2019-passage@BM25 --out runs/qa-dl
"""

app = typer.Typer(help="Fine-tune rerankers.", epilog=EXAMPLES, no_args_is_help=True)


@app.command("blockrank")
def train_blockrank_cmd(
    data: Annotated[Path, typer.Option("--data", help="BEIR-layout dataset folder.")],
    out: Annotated[Path, typer.Option("--out", help="Output directory (checkpoints, final model, losses.png); resumes.")],
    model: ModelOpt = None,
    split: Annotated[str, typer.Option("--split")] = "train",
    dev_split: Annotated[Optional[str], typer.Option("--dev-split", help="Split whose auxiliary loss is tracked.")] = "dev",
    dev_queries: Annotated[int, typer.Option("--dev-queries")] = 16,
    max_queries: Annotated[Optional[int], typer.Option("--max-queries", help="Training queries (seeded subset).")] = None,
    candidates: Annotated[int, typer.Option("--candidates", help="Candidates per example (1 positive + hard negatives).")] = 16,
    block_length: Annotated[int, typer.Option("--block-length", help="Per-document LM tokens (max_doc_tokens).")
                            ] = CachedBlockRankOptions.default_max_doc_tokens,
    steps: Annotated[int, typer.Option("--steps", help="Optimizer steps.")] = 100,
    grad_accum: Annotated[int, typer.Option("--grad-accum", help="Examples per optimizer step.")] = 4,
    lr: Annotated[float, typer.Option("--lr")] = 2e-5,
    lora: Annotated[bool, typer.Option("--lora/--full", help="LoRA adapters (large models) or full fine-tuning.")] = False,
    aux_only: Annotated[bool, typer.Option("--aux-only", help="Only the auxiliary loss: layers up to l*, no LM head.")] = False,
    layer: Annotated[Optional[int], typer.Option("--layer", help="Scoring layer l* (default round(0.6 L)).")] = None,
    freeze_below: Annotated[int, typer.Option("--freeze-below", help="Freeze embeddings and layers below this one (cheaper backward).")] = 0,
    aux_lambda: Annotated[float, typer.Option("--lambda")] = 0.1,
    tau: Annotated[float, typer.Option("--tau")] = 0.05,
    checkpoint_every: Annotated[int, typer.Option("--checkpoint-every")] = 25,
    index: Annotated[Optional[Path], typer.Option("--index")] = None,
    seed: SeedOpt = 0,
    device: DeviceOpt = "cpu",
) -> None:
    """BlockRank fine-tuning: L = L_NTP + lambda * L_aux through the linear block path (resumable)."""
    from heedrank.lab.train.blockrank import TrainConfig, train_blockrank
    from heedrank.lab.train.data import blockrank_examples

    device = _auto_device(device)
    examples = blockrank_examples(data, split, candidates=candidates, max_queries=max_queries, seed=seed, index_dir=index)
    dev = []
    if dev_split:
        dev = blockrank_examples(data, dev_split, candidates=candidates, max_queries=dev_queries, seed=seed, index_dir=index)
    cfg = TrainConfig(
        out_dir=str(out), model=model, max_doc_tokens=block_length, layer=layer, aux_lambda=aux_lambda, tau=tau,
        aux_only=aux_only, lora=lora, freeze_below=freeze_below, lr=lr, steps=steps, grad_accum=grad_accum, checkpoint_every=checkpoint_every,
        eval_every=checkpoint_every, seed=seed, device=device,
    )
    summary = train_blockrank(examples, cfg, dev_examples=dev)
    summary.pop("history", None)
    typer.echo(json.dumps(summary, indent=1))


@app.command("query-adapter")
def train_query_adapter_cmd(
    train: Annotated[list[str], typer.Option("--train", help="Training source, repeatable: DIR:SPLIT (BEIR) or "
                                             "DIR@RUN[:SPLIT] (a candidate-list run with passage text; dev-600's train fold: "
                                             "DIR@BM25:train).")],
    out: Annotated[Path, typer.Option("--out", help="Output directory (checkpoint, best/, final/); resumes.")],
    dev: Annotated[str, typer.Option("--dev", help="Dev source (every choice is made on it).")] = "",
    dev_queries: Annotated[Optional[int], typer.Option("--dev-queries", help="Seeded dev subset.")] = 100,
    train_queries: Annotated[Optional[int], typer.Option("--train-queries", help="Seeded subset per source.")] = None,
    candidates: Annotated[int, typer.Option("--candidates", help="First-stage depth of each list.")] = 50,
    retriever: Annotated[str, typer.Option("--retriever", help="BEIR first stage.")] = "hybrid",
    objective: Annotated[str, typer.Option("--objective", help="learned (head-weight score), signal (L_aux) or "
                                                 "independent (the served list-independent log-odds).")] = "learned",
    steps: Annotated[int, typer.Option("--steps")] = 300,
    batch_queries: Annotated[int, typer.Option("--batch-queries", help="Queries per optimizer step.")] = 4,
    max_candidates: Annotated[int, typer.Option("--max-candidates", help="Candidates per training list.")] = 20,
    lr: Annotated[float, typer.Option("--lr")] = 3e-4,
    lora_r: Annotated[int, typer.Option("--lora-r")] = 8,
    train_weights: Annotated[bool, typer.Option("--train-weights/--fixed-weights",
                                                help="Also train the head weights (learned objective).")] = False,
    eval_every: Annotated[int, typer.Option("--eval-every")] = 100,
    scratch_kv: Annotated[Optional[Path], typer.Option("--scratch-kv", help="Folder of writable KV stores for "
                                                       "sources without an index store (blocks computed once).")] = None,
    index: Annotated[Optional[Path], typer.Option("--index", help="Index of the BEIR sources (`heedrank index "
                                                  "build`): its first stage and document KV store; default: the "
                                                  "cached index of each source.")] = None,
    layer: Annotated[int, typer.Option("--layer", help="l*.")] = 15,
    max_doc_tokens: MaxDocTokensOpt = CachedBlockRankOptions.default_max_doc_tokens,
    model: ModelOpt = None,
    seed: SeedOpt = 0,
    device: DeviceOpt = "cpu",
    opts: OptsOpt = None,
    loss: Annotated[str, typer.Option("--loss", help="listwise (softmax, every positive) or pairwise (RankNet).")
                    ] = "listwise",
    init: Annotated[Optional[Path], typer.Option("--init", help="Start from this trained adapter folder (e.g. the "
                                                 "packaged one) instead of the base model.")] = None,
    exclude_queries: Annotated[Optional[list[Path]], typer.Option(
        "--exclude-queries", help="Query ids never trained on (repeatable): a text file (one id per line) or a "
        "study dump (.npz: its queries), e.g. queries held out for the cut-off's calibration.")] = None,
    dev_query_ids: Annotated[Optional[Path], typer.Option(
        "--dev-query-ids", help="The dev queries by id (a text file, one per line, or a study dump) instead of "
        "--dev-queries' seeded subset; e.g. a fold of dev-600's train fold that --exclude-queries keeps out of "
        "training.")] = None,
) -> None:
    """Query-side LoRA adapter for cached BlockRank (stored blocks stay valid): listwise or
    pairwise loss through the query passes only; dev nDCG@10 every --eval-every steps, best
    kept (resumable)."""
    from heedrank.lab.dumps import read_query_ids
    from heedrank.registry import build_reranker
    from heedrank.lab.train.data import dev_evaluator, examples_from, load_source, source_store
    from heedrank.lab.train.query_adapter import QueryAdapterConfig, train_query_adapter

    cfg = QueryAdapterConfig(out_dir=str(out), objective=objective, lora_r=lora_r, lora_alpha=2 * lora_r,
                             train_weights=train_weights, lr=lr, steps=steps, batch_queries=batch_queries,
                             max_candidates=max_candidates, eval_every=eval_every, seed=seed, loss=loss,
                             init=None if init is None else str(init))
    excluded = read_query_ids(exclude_queries or [])
    config = reranker_config("blockrank-cached", model, max_doc_tokens, _auto_device(device), opts).with_options(
        layer=layer, scoring=objective, query_adapter=None)
    reranker = build_reranker(config)
    examples, stores = [], {}
    for spec in train:
        queries, cands, _, qrels, source_index = load_source(spec, candidates=candidates, max_queries=train_queries,
                                                             seed=seed, retriever=retriever,
                                                             index=None if "@" in spec else index)
        examples += [replace(ex, source=spec) for ex in examples_from(queries, cands, qrels)
                     if ex.query_id not in excluded]
        stores[spec] = source_store(reranker, source_index, scratch_kv, spec)
    evaluate, n_dev = None, dev_queries
    if dev:
        dq, dc, ds, dqrels, dindex = load_source(dev, candidates=candidates,
                                                 max_queries=None if dev_query_ids else dev_queries, seed=seed,
                                                 retriever=retriever, index=None if "@" in dev else index)
        if dev_query_ids is not None:
            wanted = read_query_ids([dev_query_ids])
            dq = [q for q in dq if q.query_id in wanted]
            if not dq:
                raise typer.BadParameter(f"none of the {len(wanted)} ids in {dev_query_ids} is a query of {dev}",
                                         param_hint="--dev-query-ids")
            if excluded.isdisjoint(wanted):
                typer.echo(f"warning: the dev queries of {dev_query_ids} are not in --exclude-queries: if a "
                           "training source holds them, the dev figure is read on queries trained on", err=True)
        n_dev = len(dq)
        evaluate = dev_evaluator(dq, dc, ds, dqrels, objective=objective,
                                 block_store=stores[dev] if dev in stores else  # one writer per store
                                 source_store(reranker, dindex, scratch_kv, dev))
    summary = train_query_adapter(reranker, examples, cfg, block_stores=stores, evaluate=evaluate,
                                  card={"train": list(train), "dev": dev,
                                        "dev_queries": n_dev,
                                        "candidates": candidates, "retriever": retriever})
    summary.pop("history", None)
    typer.echo(json.dumps(summary, indent=1, default=str))


def _auto_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"

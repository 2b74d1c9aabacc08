"""``heedrank lab dump``, ``lab fit`` and ``lab calibrate``: per-candidate attention
features of cached BlockRank from one pass per query, the fit and comparison of scorers on
them (learned head weights, fusion with the first stage, the weights card), and the
relevance cut-off's calibration. The work is :mod:`heedrank.lab.dumps` (the dump),
:mod:`heedrank.lab.train.head_fit` (the fit) and :mod:`heedrank.lab.train.cutoff_fit` (the cut-off);
these commands parse options and print or write their records."""

from __future__ import annotations

import json
from pathlib import Path
from collections.abc import Mapping
from typing import Annotated, Any, Optional

import typer

from heedrank.cli.options import DeviceOpt, MaxDocTokensOpt, ModelOpt, SeedOpt, reranker_config
from heedrank.reranker.options import CachedBlockRankOptions

EXAMPLES = """\
Examples:

  heedrank lab dump --out runs/study/nf-dev.npz --data data/beir-nfcorpus --split dev --index indexes/nfcorpus
  heedrank lab fit --train nf-train.npz --dev nf-dev.npz --test nf-test=nf-test.npz --loss pairwise --export card.json
  heedrank lab calibrate --card card.json --calibrate unseen.npz --dev nf-dev.npz --test dl19=dl19.npz@2 --write-card out/card.json
"""


def lab_dump(
    out: Annotated[Path, typer.Option("--out", help="Feature dump to write (.npz); a rerun resumes it.")],
    data: Annotated[Path, typer.Option("--data", help="BEIR folder, or a candidate-list folder (TREC DL, "
                                       "msmarco-passage-dev-600, NovelEval; recognised by its file names).")],
    split: Annotated[str, typer.Option("--split", help="BEIR split; of a candidate-list folder, the fold: train, "
                                       "test or all (dev-600's seeded folds; the other sets: test = all).")] = "test",
    retriever: Annotated[str, typer.Option("--retriever", help="BEIR first stage: bm25, dense or hybrid.")] = "hybrid",
    trec_run: Annotated[Optional[str], typer.Option("--trec-run", help="Run of a candidate-list folder (e.g. BM25; "
                                                    "NovelEval: BM25 or web): candidates from its top-K lists; "
                                                    "default BM25.")] = None,
    candidates: Annotated[int, typer.Option("--candidates")] = 50,
    max_queries: Annotated[Optional[int], typer.Option("--max-queries", help="Seeded subset of queries.")] = None,
    query_ids: Annotated[Optional[Path], typer.Option("--query-ids", help="Only these queries (a text file, one id "
                                                      "per line), e.g. the held-out calibration queries.")] = None,
    seed: SeedOpt = 0,
    index: Annotated[Optional[Path], typer.Option("--index", help="Index directory (BEIR); its document KV store "
                                                  "serves the blocks.")] = None,
    layer: Annotated[int, typer.Option("--layer", help="l*: layers 0..l* are read.")] = 15,
    max_doc_tokens: MaxDocTokensOpt = CachedBlockRankOptions.default_max_doc_tokens,
    kv_dtype: Annotated[Optional[str], typer.Option("--kv-dtype", help="dtype of the index's document KV store; "
                                                    "default: the reranker's kv_dtype.")] = None,
    model: ModelOpt = None,
    device: DeviceOpt = "cpu",
    adapter: Annotated[Optional[Path], typer.Option("--adapter", help="Query adapter (heedrank lab train "
                                                    "query-adapter output, e.g. OUT/best) applied to the query "
                                                    "passes.")] = None,
    block_store: Annotated[Optional[Path], typer.Option(
        "--store", help="Writable document KV store for candidates without an index store (TREC DL): blocks are "
        "computed once and kept there for later dumps.")] = None,
) -> None:
    """Per-candidate attention features of cached BlockRank (calibrated per layer and head,
    signal per head, the served calibrated score), first-stage scores and qrels, from ONE
    pass per query: the input of `heedrank lab fit` (docs/results/training.md, "The training and fusion study")."""
    from heedrank.lab.dumps import dump_study

    config = reranker_config("blockrank-cached", model, max_doc_tokens, device, None).with_options(
        layer=layer, scoring="calibrated", query_adapter=None, **({"kv_dtype": kv_dtype} if kv_dtype else {}))
    if adapter is not None:  # the reranker loads it on a private copy of the LM (option query_adapter)
        config = config.with_options(query_adapter=str(adapter))
    typer.echo(json.dumps(dump_study(
        out, config, data, split=split, retriever=retriever, trec_run=trec_run, candidates=candidates,
        max_queries=max_queries, query_ids=query_ids, seed=seed, index=index, block_store=block_store)))


def lab_fit(
    dev: Annotated[Path, typer.Option("--dev", help="Dev dump: every choice is made on it.")],
    test: Annotated[list[str], typer.Option("--test", help="NAME=DUMP test sets (repeatable).")],
    train: Annotated[Optional[list[Path]], typer.Option("--train", help="Training feature dumps (repeatable); "
                                                        "none: only zero-shot and --fixed-weights variants.")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="Write the report (JSON) here.")] = None,
    epochs: Annotated[int, typer.Option("--epochs")] = 150,
    export: Annotated[Optional[Path], typer.Option("--export", help="Write the learned head weights (pure reranker) "
                                                   "as a weights card for --opt scoring=learned.")] = None,
    loss: Annotated[str, typer.Option("--loss", help="listwise (softmax, every positive), pairwise (RankNet) or "
                                      "lambdarank (pairs weighted by |delta nDCG@10|).")] = "listwise",
    temperature: Annotated[float, typer.Option("--temperature", help="Scores are divided by it in the loss.")] = 1.0,
    max_layer: Annotated[Optional[int], typer.Option("--max-layer", help="Use layers 0..N only: the model a store "
                                                     "with l* = N serves (exact: the query pass is causal in depth).")] = None,
    fixed_weights: Annotated[Optional[list[str]], typer.Option(
        "--fixed-weights", help="NAME=PATH head weights scored as given (repeatable): a weights card (.json) or a "
        "query adapter folder (its trained weights, else the model's shipped card).")] = None,
) -> None:
    """Fit and compare the study's variants (zero-shot scorers, learned head weights, fusion
    with the first stage): choices on dev only, then nDCG@10 with paired randomization tests
    against the first stage on each test set."""
    from heedrank.lab.dumps import command_line, parse_named
    from heedrank.lab.train.head_fit import fit_study, format_study, weights_card

    if export is not None and not train:
        raise typer.BadParameter("--export writes the learned head weights: give --train dumps", param_hint="--export")
    tests = {name: Path(p) for name, p in parse_named(test, "--test", "NAME=DUMP").items()}
    fixed = {name: Path(p) for name, p in parse_named(fixed_weights or [], "--fixed-weights").items()}
    fit = fit_study(train or [], dev, tests, epochs=epochs, loss=loss, temperature=temperature, max_layer=max_layer,
                    fixed=fixed)
    if out is not None:
        out.write_text(json.dumps(fit.report, indent=1))
    if export is not None:
        command = command_line("heedrank lab fit", [
            ("--train", train), ("--dev", dev), ("--test", test), ("--loss", loss), ("--temperature", temperature),
            ("--max-layer", max_layer), ("--export", export)])
        export.write_text(json.dumps(weights_card(fit.report, fit.dev_meta, command=command), indent=1))
    typer.echo(format_study(fit.report))


def lab_calibrate(
    card: Annotated[Path, typer.Option("--card", help="Weights card whose learned scorer and fusion weight are "
                                       "calibrated (read only).")],
    calibrate: Annotated[list[Path], typer.Option("--calibrate", help="Dumps of queries the reranker was NOT trained "
                                                  "on: the maps are fitted on them (repeatable).")],
    dev: Annotated[Path, typer.Option("--dev", help="Dev dump: the thresholds and the fixed top-k are chosen on it.")],
    test: Annotated[Optional[list[str]], typer.Option(
        "--test", help="NAME=DUMP[@MIN_GRADE] test sets (repeatable; MIN_GRADE: the lowest relevant grade, default "
        "1; 2 for TREC DL's binary measures).")] = None,
    exclude: Annotated[Optional[list[Path]], typer.Option(
        "--exclude", help="Dumps whose queries are dropped from --calibrate (the reranker's training queries).")] = None,
    counts: Annotated[str, typer.Option("--counts", help="Candidate counts the maps are fitted and chosen at: the "
                                        "first stage's top N of each dump.")] = "10,20,30,50",
    test_counts: Annotated[str, typer.Option("--test-counts", help="Counts measured on test sets ('all': every "
                                             "candidate of the dump).")] = "20,all",
    write_card: Annotated[Optional[Path], typer.Option(
        "--write-card", help="Write --card with this calibration to this NEW path (never over --card or a packaged "
        "card: a recipe writes there, a commit replaces the packaged one).")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="Write the report (JSON) here.")] = None,
) -> None:
    """The relevance cut-off: served scores mapped to P(relevant) (Platt scaling, one map per
    serving mode), thresholds ("auto") chosen on dev for mean F1, then precision, recall and F1
    at the cut-off against the best fixed top-k (also chosen on dev) on each test set."""
    from heedrank.lab.dumps import command_line, parse_named
    from heedrank.lab.train.cutoff_fit import calibrate_cutoff, format_cutoff
    from heedrank.reranker.cards import read_card

    tests = parse_named(test or [], "--test", "NAME=DUMP[@MIN_GRADE]")
    weights_card = read_card(card)
    command = command_line("heedrank lab calibrate", [
        ("--card", card), ("--calibrate", calibrate), ("--exclude", exclude), ("--dev", dev), ("--test", test),
        ("--counts", counts), ("--test-counts", test_counts), ("--write-card", write_card)])
    run = calibrate_cutoff(weights_card, calibrate, dev, tests, exclude=exclude or [],
                           counts=[int(x) for x in counts.split(",")], test_counts=test_counts.split(","),
                           command=command)
    if out is not None:
        out.write_text(json.dumps({"calibration": run.entry, "results": run.results}, indent=1))
    if write_card is not None:
        write_new_card(write_card, {**weights_card.data, "calibration": run.entry}, source=card)
    typer.echo(format_cutoff(run))


def write_new_card(path: Path, card: Mapping[str, Any], *, source: Path) -> None:
    """Write a weights card to a new ``path`` (atomic, fsynced): a recipe's output, which a
    commit then copies over the packaged card; never the card it was read from nor a file in
    the package's ``reranker/data``.

    Raises:
        typer.BadParameter: ``path`` is ``source`` or lies in the packaged data folder.
    """
    from heedrank.files import write_atomic
    from heedrank.reranker.heads import DATA_DIR

    target = path.resolve()
    if target == source.resolve() or DATA_DIR.resolve() in target.parents:
        raise typer.BadParameter(f"{path} would be rewritten in place: write to a new path (a recipe's out/ folder) "
                                 "and replace the packaged card by a commit", param_hint="--write-card")
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(target, (json.dumps(card, indent=1) + "\n").encode())


def lab_long_queries(
    out: Annotated[Path, typer.Option("--out", help="BEIR folder to write (queries.jsonl, qrels/train.tsv).")],
    data: Annotated[Path, typer.Option("--data", help="The NFCorpus BEIR folder.")] = Path("../shared/data/beir-nfcorpus"),
    queries: Annotated[int, typer.Option("--queries", help="How many queries to draw (documents).")] = 200,
    seed: SeedOpt = 0,
    kind: Annotated[str, typer.Option("--kind", help="documents: NFCorpus train documents (--data the NFCorpus "
                                      "folder); passages: TREC DL passages judged 3 (--data a TREC DL year's folder, "
                                      "--per-topic of each topic).")] = "documents",
    per_topic: Annotated[int, typer.Option("--per-topic", help="Passages drawn per topic (passages).")] = 3,
) -> None:
    """A source of long queries (heedrank.lab.long_queries). documents: one relevant document of a narrow
    NFCorpus train topic is the query, the topic's other relevant documents its relevant ones; dump it with
    `heedrank lab dump --data OUT --split train --index INDEX`. passages: a TREC DL passage judged 3 is the
    query, its topic's other passages judged 2-3 its relevant ones, over the pool of the year's runs; dump
    it with `heedrank lab dump --data OUT --split train --retriever bm25 --store STORE`. The query's own
    document is never a candidate."""
    from heedrank.lab.long_queries import document_queries, passage_queries

    if kind not in ("documents", "passages"):
        raise typer.BadParameter(f"--kind documents or passages, not {kind!r}", param_hint="--kind")
    record = (document_queries(data, out, queries=queries, seed=seed) if kind == "documents"
              else passage_queries(data, out, per_topic=per_topic, seed=seed))
    typer.echo(json.dumps(record))

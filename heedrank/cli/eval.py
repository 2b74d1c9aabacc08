"""``heedrank eval``: evaluate the pipeline (BEIR, TREC DL) and compare reports. ``eval beir``
and ``eval trec-dl`` build one :class:`~heedrank.eval.spec.EvalSpec` each. The research
evaluations (layer sweep, head ablation, feature study) are ``heedrank lab``'s
(:mod:`heedrank.lab.cli`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from heedrank.cli.options import (
    QUERIES_ENGINE_HELP,
    CandidatesOpt,
    DeviceOpt,
    DumpOpt,
    FusionOpt,
    MaxDocTokensOpt,
    MaxQueriesOpt,
    ModelOpt,
    OptsOpt,
    ReportDirOpt,
    RerankOpt,
    SeedOpt,
    engine_flags,
    eval_reranker_config,
    fusion_value,
)
from heedrank.engine import Engine, LocalEngine

EXAMPLES = """\
Examples:

  heedrank eval beir --data data/beir-nfcorpus --rerank icr --candidates 20 --max-queries 100
  heedrank eval beir --data data/beir-nfcorpus --retriever hybrid --rerank blockrank --fusion 0.6
  heedrank eval trec-dl --data data/msmarco-trec-dl-2019-passage --rerank icr --engine ray --actors 4
  heedrank eval trec-dl --data data/msmarco-passage-dev-600 --split test --rerank default
  heedrank eval trec-dl --data data/noveleval --run web --rerank default
  heedrank eval trec-dl --topics t.tsv --qrels q.txt --run-file run.json.gz --rerank blockrank
  heedrank eval compare runs/A.json runs/B.json
"""

app = typer.Typer(help="Evaluate the pipeline on BEIR and TREC DL.", epilog=EXAMPLES, no_args_is_help=True)


@app.command("beir")
@engine_flags(QUERIES_ENGINE_HELP)
def eval_beir(
    data: Annotated[Path, typer.Option("--data", help="BEIR-layout dataset folder.")],
    split: Annotated[str, typer.Option("--split", help="qrels split: test, dev or train.")] = "test",
    retriever: Annotated[str, typer.Option("--retriever", help="bm25, dense or hybrid.")] = "bm25",
    rerank: RerankOpt = "none",
    candidates: CandidatesOpt = 20,
    max_queries: MaxQueriesOpt = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the query subset.")] = 0,
    index: Annotated[Optional[Path], typer.Option("--index", help="Index directory; default: built once and cached.")] = None,
    out: ReportDirOpt = Path("runs"),
    model: ModelOpt = None,
    max_doc_tokens: MaxDocTokensOpt = None,
    device: DeviceOpt = "cpu",
    opt: OptsOpt = None,
    dump: DumpOpt = None,
    keep_identical_ids: Annotated[bool, typer.Option(
        "--keep-identical-ids", help="Keep a retrieved document whose id equals the query id; by default it is "
        "dropped before reranking, as BEIR's evaluator does (ignore_identical_ids=True).")] = False,
    engine: Engine = LocalEngine(),
    fusion: FusionOpt = "default",
) -> None:
    """nDCG@10, Recall@100, MRR@10 of the pipeline on a BEIR dataset; writes a TREC run and a JSON report."""
    from heedrank.eval.beir import evaluate_beir
    from heedrank.eval.report import format_table
    from heedrank.eval.spec import EvalSpec

    config = eval_reranker_config(rerank, model, max_doc_tokens, device, opt, dump)
    spec = EvalSpec(
        data, split=split, retriever=retriever, rerank=rerank, candidates=candidates, max_queries=max_queries,
        seed=seed, index_dir=index, out_dir=out, dump_dir=dump, keep_identical_ids=keep_identical_ids,
        engine=engine, fusion=fusion_value(fusion, config), reranker_config=config,
    )
    typer.echo(format_table([evaluate_beir(spec)]))


@app.command("trec-dl")
@engine_flags(QUERIES_ENGINE_HELP)
def eval_trec_dl(
    data: Annotated[Optional[Path], typer.Option(
        "--data", help="TREC DL folder of one year (topics, NIST qrels, run JSON with passage text) under Anserini / "
        "rank_llm names: topics.dl19-passage.txt or topics.dl21.txt, qrels.dl20-passage.txt, "
        "retrieve_results_<RUN>_dl20_top100.json[.gz]; or the same layout with a dev<N> tag (msmarco-passage-dev-600: "
        "topics.dev600.tsv, qrels.dev600.txt, retrieve_results_BM25_dev600_top20.json.gz); or a NovelEval folder "
        "(queries.tsv, corpus.tsv, qrels.txt).")] = None,
    run: Annotated[Optional[str], typer.Option(
        "--run", help="First-stage run name, e.g. BM25, SPLADE_P_P_ENSEMBLE_DISTIL; default BM25 (with --run-file: "
        "read from its name). NovelEval: BM25 (over each question's 20 passages) or web (the source's order).")] = None,
    year: Annotated[Optional[str], typer.Option(
        "--year", help="Track year (dl19, dl20, 2021, ...) or set tag (dev600); default: detected from the folder's "
        "file names.")] = None,
    split: Annotated[str, typer.Option(
        "--split", help="Queries: test, train or all. msmarco-passage-dev-600 has fixed seeded folds (test: 150 judged "
        "queries, train: the other 450); the other sets are test queries only (test = all).")] = "test",
    topics: Annotated[Optional[Path], typer.Option("--topics", help="Topics file (qid<TAB>text), any name.")] = None,
    qrels: Annotated[Optional[Path], typer.Option("--qrels", help="Qrels file (qid 0 docid rel), any name.")] = None,
    run_file: Annotated[Optional[Path], typer.Option(
        "--run-file", help="rank_llm run JSON with passage texts, any name.")] = None,
    rerank: RerankOpt = "none",
    candidates: CandidatesOpt = 20,
    max_queries: MaxQueriesOpt = None,
    seed: SeedOpt = 0,
    out: ReportDirOpt = Path("runs"),
    model: ModelOpt = None,
    max_doc_tokens: MaxDocTokensOpt = None,
    device: DeviceOpt = "cpu",
    opt: OptsOpt = None,
    dump: DumpOpt = None,
    engine: Engine = LocalEngine(),
    fusion: FusionOpt = "default",
) -> None:
    """nDCG@10, Recall@100, MRR@10, Judged@10 of reranking a TREC DL first-stage run (any year), and the
    metrics of the other candidate-list sets (MS MARCO dev-600, NovelEval).

    Give --data (the year is read from the file names, or --year), or all of --topics,
    --qrels and --run-file; explicit paths replace the files found in --data. Binary
    measures count grade >= 2 on TREC DL, >= 1 on dev-600 (MRR@10) and NovelEval."""
    from heedrank.eval.report import format_table
    from heedrank.eval.spec import EvalSpec
    from heedrank.eval.trecdl import evaluate_trec_dl

    config = eval_reranker_config(rerank, model, max_doc_tokens, device, opt, dump)
    spec = EvalSpec(
        data, run_name=run, rerank=rerank, candidates=candidates, max_queries=max_queries, seed=seed, out_dir=out,
        dump_dir=dump, year=year, split=split, topics=topics, qrels=qrels, run_file=run_file, engine=engine,
        fusion=fusion_value(fusion, config), reranker_config=config,
    )
    typer.echo(format_table([evaluate_trec_dl(spec)]))


@app.command("compare")
def eval_compare(
    a: Annotated[Path, typer.Argument(help="Baseline JSON report.")],
    b: Annotated[Path, typer.Argument(help="Treatment JSON report.")],
    trials: Annotated[int, typer.Option("--trials", help="Randomization test permutations.")] = 10_000,
) -> None:
    """Per-metric deltas (B - A) over the queries both reports share, with a paired randomization test."""
    from heedrank.eval.compare import compare_reports, format_comparison

    typer.echo(format_comparison(compare_reports(a, b, trials=trials)))

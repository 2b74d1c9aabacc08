"""Command line: ``attnrank`` (also ``python -m attnrank``).

Subcommands import their implementation lazily, so ``attnrank --help`` is instant.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated, Optional

import typer

from attnrank.config import DEFAULT_MAX_DOC_TOKENS, RerankerConfig

app = typer.Typer(help="attnrank: retrieval and attention-based in-context reranking.", no_args_is_help=True)
index_app = typer.Typer(help="Build and inspect index directories.", no_args_is_help=True)
eval_app = typer.Typer(help="Evaluate the pipeline on BEIR and TREC DL.", no_args_is_help=True)
app.add_typer(index_app, name="index")
app.add_typer(eval_app, name="eval")

ModelOpt = Annotated[
    Optional[str],
    typer.Option("--model", help="Reranker LM: a local HF causal-LM directory; default: packaged SmolLM2-135M-Instruct."),
]
MaxDocTokensOpt = Annotated[
    int, typer.Option("--max-doc-tokens", help="Per-document budget in LM tokens (truncation is reported).")
]
DeviceOpt = Annotated[str, typer.Option("--device", help="torch device: cpu, cuda, cuda:N.")]


@app.callback()
def _main(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
) -> None:
    from tqdm.contrib.logging import _TqdmLoggingHandler  # keeps bars intact under logging

    handler = _TqdmLoggingHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.DEBUG if verbose else logging.INFO)
    for noisy in ("httpx", "urllib3", "filelock", "datasets", "sentence_transformers", "transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _reranker_config(method: str, model: str | None, max_doc_tokens: int, device: str) -> RerankerConfig:
    return RerankerConfig(method=method, model=model, max_doc_tokens=max_doc_tokens, device=device)


def _fail(exc: Exception) -> None:
    typer.secho(f"error ({getattr(exc, 'error_type', type(exc).__name__)}): {exc}", fg="red", err=True)
    raise typer.Exit(2)


# ---------------------------------------------------------------------------- index
@index_app.command("build")
def index_build(
    corpus: Annotated[Path, typer.Option("--corpus", help="BEIR-layout folder (corpus.jsonl[.gz]) or a corpus file.")],
    out: Annotated[Path, typer.Option("--out", help="Index directory to write.")],
    embedder: Annotated[
        Optional[str], typer.Option("--embedder", help="sentence-transformers model directory; default: packaged all-MiniLM-L6-v2.")
    ] = None,
    metadata: Annotated[
        Optional[Path], typer.Option("--metadata", help="JSONL of {doc_id, ...fields} merged into document metadata.")
    ] = None,
    no_dense: Annotated[bool, typer.Option("--no-dense", help="Skip dense vectors (BM25 only).")] = False,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Encoding batch size.")] = 64,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing index directory.")] = False,
) -> None:
    """Write an index directory: SQLite document store, BM25 (bm25s), faiss vectors, params.json."""
    from attnrank.errors import AttnrankError
    from index.builder import build_index

    try:
        params = build_index(
            corpus, out, embedder=embedder, metadata=metadata, dense=not no_dense,
            batch_size=batch_size, overwrite=overwrite, show_progress=True,
        )
    except AttnrankError as exc:
        _fail(exc)
    typer.echo(json.dumps(params, indent=2))


@index_app.command("info")
def index_info(path: Annotated[Path, typer.Argument(help="Index directory.")]) -> None:
    """Print an index's params.json."""
    typer.echo((path / "params.json").read_text())


# ---------------------------------------------------------------------------- serve
@app.command("serve")
def serve(
    index: Annotated[Path, typer.Option("--index", help="Index directory.")],
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port")] = 8000,
    model: ModelOpt = None,
    max_doc_tokens: MaxDocTokensOpt = DEFAULT_MAX_DOC_TOKENS,
    device: DeviceOpt = "cpu",
    rerank_method: Annotated[str, typer.Option("--rerank-method", help="Reranker loaded at start-up.")] = "icr",
) -> None:
    """Serve the REST API (uvicorn) over one index."""
    import uvicorn

    from api.app import create_app
    from attnrank.settings import Settings

    settings = Settings(
        index=str(index), model=model, max_doc_tokens=max_doc_tokens, device=device, rerank_method=rerank_method
    )
    uvicorn.run(create_app(settings), host=host, port=port, log_level="info")


# ---------------------------------------------------------------------------- eval
@eval_app.command("beir")
def eval_beir(
    data: Annotated[Path, typer.Option("--data", help="BEIR-layout dataset folder.")],
    split: Annotated[str, typer.Option("--split", help="qrels split: test, dev or train.")] = "test",
    retriever: Annotated[str, typer.Option("--retriever", help="bm25, dense or hybrid.")] = "bm25",
    rerank: Annotated[str, typer.Option("--rerank", help="Reranker name or 'none'.")] = "none",
    candidates: Annotated[int, typer.Option("--candidates", help="First-stage hits reranked.")] = 20,
    max_queries: Annotated[Optional[int], typer.Option("--max-queries", help="Seeded subset of this many queries.")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the query subset.")] = 0,
    index: Annotated[Optional[Path], typer.Option("--index", help="Index directory; default: built once and cached.")] = None,
    out: Annotated[Path, typer.Option("--out", help="Folder for the run file and JSON report.")] = Path("runs"),
    model: ModelOpt = None,
    max_doc_tokens: MaxDocTokensOpt = DEFAULT_MAX_DOC_TOKENS,
    device: DeviceOpt = "cpu",
) -> None:
    """nDCG@10, Recall@100, MRR@10 of the pipeline on a BEIR dataset; writes a TREC run and a JSON report."""
    from attnrank.errors import AttnrankError
    from eval.beir import evaluate_beir
    from eval.report import format_table

    try:
        report = evaluate_beir(
            data, split=split, retriever=retriever, rerank=rerank, candidates=candidates,
            max_queries=max_queries, seed=seed, index_dir=index, out_dir=out,
            reranker_config=_reranker_config(rerank, model, max_doc_tokens, device),
        )
    except AttnrankError as exc:
        _fail(exc)
    typer.echo(format_table([report]))


@eval_app.command("trec-dl")
def eval_trec_dl(
    data: Annotated[Path, typer.Option("--data", help="TREC DL folder (topics, NIST qrels, run JSON with passage text).")],
    run: Annotated[str, typer.Option("--run", help="First-stage run name, e.g. BM25, SPLADE_P_P_ENSEMBLE_DISTIL.")] = "BM25",
    rerank: Annotated[str, typer.Option("--rerank", help="Reranker name or 'none'.")] = "none",
    candidates: Annotated[int, typer.Option("--candidates", help="First-stage hits reranked.")] = 20,
    max_queries: Annotated[Optional[int], typer.Option("--max-queries", help="Seeded subset of this many queries.")] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    out: Annotated[Path, typer.Option("--out", help="Folder for the run file and JSON report.")] = Path("runs"),
    model: ModelOpt = None,
    max_doc_tokens: MaxDocTokensOpt = DEFAULT_MAX_DOC_TOKENS,
    device: DeviceOpt = "cpu",
) -> None:
    """nDCG@10, Recall@100, MRR@10, Judged@10 of reranking a TREC DL 2019 first-stage run."""
    from attnrank.errors import AttnrankError
    from eval.report import format_table
    from eval.trecdl import evaluate_trec_dl

    try:
        report = evaluate_trec_dl(
            data, run_name=run, rerank=rerank, candidates=candidates, max_queries=max_queries, seed=seed,
            out_dir=out, reranker_config=_reranker_config(rerank, model, max_doc_tokens, device),
        )
    except AttnrankError as exc:
        _fail(exc)
    typer.echo(format_table([report]))


@eval_app.command("layer-sweep")
def eval_layer_sweep(
    data: Annotated[Path, typer.Option("--data", help="BEIR-layout dataset folder.")],
    split: Annotated[str, typer.Option("--split", help="qrels split; use dev (never test) to choose l*.")] = "dev",
    retriever: Annotated[str, typer.Option("--retriever")] = "bm25",
    candidates: Annotated[int, typer.Option("--candidates")] = 20,
    max_queries: Annotated[Optional[int], typer.Option("--max-queries")] = 100,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    index: Annotated[Optional[Path], typer.Option("--index", help="Index directory; default: built once and cached.")] = None,
    out: Annotated[Path, typer.Option("--out")] = Path("runs"),
    model: ModelOpt = None,
    max_doc_tokens: MaxDocTokensOpt = DEFAULT_MAX_DOC_TOKENS,
    device: DeviceOpt = "cpu",
) -> None:
    """BlockRank nDCG@10 read at every layer from one pass per query, to choose the scoring layer l*."""
    from eval.sweep import format_sweep, layer_sweep_beir

    result = layer_sweep_beir(
        data, split=split, retriever=retriever, candidates=candidates, max_queries=max_queries, seed=seed,
        index_dir=index, out_dir=out, reranker_config=_reranker_config("blockrank", model, max_doc_tokens, device),
    )
    typer.echo(format_sweep(result))


@eval_app.command("compare")
def eval_compare(
    a: Annotated[Path, typer.Argument(help="Baseline JSON report.")],
    b: Annotated[Path, typer.Argument(help="Treatment JSON report.")],
    trials: Annotated[int, typer.Option("--trials", help="Randomization test permutations.")] = 10_000,
) -> None:
    """Per-metric deltas (B - A) over the queries both reports share, with a paired randomization test."""
    from eval.compare import compare_reports, format_comparison

    typer.echo(format_comparison(compare_reports(a, b, trials=trials)))


if __name__ == "__main__":  # pragma: no cover
    app()

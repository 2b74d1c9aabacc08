"""Command line: ``attnrank`` (also ``python -m attnrank``).

Subcommands import their implementation lazily, so ``attnrank --help`` is instant.
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from attnrank.config import RerankerConfig

app = typer.Typer(help="attnrank: retrieval and attention-based in-context reranking.", no_args_is_help=True)
index_app = typer.Typer(help="Build and inspect index directories.", no_args_is_help=True)
eval_app = typer.Typer(help="Evaluate the pipeline on BEIR and TREC DL.", no_args_is_help=True)
app.add_typer(index_app, name="index")
kv_app = typer.Typer(help="The document KV store: candidate blocks encoded once (cached BlockRank).",
                     no_args_is_help=True)
index_app.add_typer(kv_app, name="kv")
heads_app = typer.Typer(help="Query-focused retrieval heads: detect, fit weights.", no_args_is_help=True)
app.add_typer(eval_app, name="eval")
app.add_typer(heads_app, name="heads")
train_app = typer.Typer(help="Fine-tune rerankers.", no_args_is_help=True)
app.add_typer(train_app, name="train")

ModelOpt = Annotated[
    Optional[str],
    typer.Option("--model", help="Reranker LM: a local HF causal-LM directory; default: packaged SmolLM2-135M-Instruct."),
]
MaxDocTokensOpt = Annotated[
    Optional[int], typer.Option("--max-doc-tokens", help="Per-document budget in LM tokens (truncation is reported); "
                                "default: the method's (128 for the default method, blockrank-cached; else 160).")
]
DeviceOpt = Annotated[str, typer.Option("--device", help="torch device: cpu, cuda, cuda:N.")]
OptsOpt = Annotated[
    Optional[list[str]],
    typer.Option("--opt", help="Reranker option KEY=VALUE (VALUE parsed as JSON when it can be), repeatable: "
                 "--opt layer=22 --opt heads=qr --opt 'reattn={\"idf\": true}'."),
]
EngineOpt = Annotated[
    str, typer.Option("--engine", help="Where the queries run: local (this process) or ray (a Ray actor pool; "
                      "needs pip install 'attnrank\\[ray]'). Same output either way.")
]
RayAddressOpt = Annotated[
    Optional[str], typer.Option("--ray-address", help="With --engine ray: the cluster to join (auto, HEAD:6379, "
                                "ray://HEAD:10001); default $RAY_ADDRESS, else a local Ray started for the run.")
]
ActorsOpt = Annotated[
    Optional[int], typer.Option("--actors", help="With --engine ray: reranker actors (each loads the LM once); default 1.")
]
ActorCpusOpt = Annotated[
    Optional[float], typer.Option("--actor-cpus", help="With --engine ray: CPUs per actor (its torch threads); default 1.")
]
ActorGpusOpt = Annotated[
    Optional[float], typer.Option("--actor-gpus", help="With --engine ray: GPUs per actor (with --device cuda); default 0.")
]


def _engine(engine: str, ray_address: str | None, actors: int | None, actor_cpus: float | None,
            actor_gpus: float | None):
    """The :class:`attnrank.engine.Engine` of the engine flags.

    Raises:
        ValidationError: an unknown engine, or Ray options without ``--engine ray``.
        MissingDependencyError: ``--engine ray`` without Ray installed.
    """
    from attnrank.engine import EngineOptions, check_engine_name, make_engine
    from attnrank.errors import ValidationError

    name = check_engine_name(engine)
    given = [flag for flag, value in (("--ray-address", ray_address), ("--actors", actors),
                                      ("--actor-cpus", actor_cpus), ("--actor-gpus", actor_gpus)) if value is not None]
    if name == "local" and given:
        raise ValidationError(f"{', '.join(given)} only apply with --engine ray")
    options = EngineOptions(engine=name, address=ray_address, actors=1 if actors is None else actors,
                            num_cpus=1.0 if actor_cpus is None else actor_cpus,
                            num_gpus=0.0 if actor_gpus is None else actor_gpus)
    return make_engine(options)


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


def _parse_opts(opts: list[str] | None) -> dict:
    out = {}
    for item in opts or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise typer.BadParameter(f"--opt takes KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def _reranker_config(
    method: str, model: str | None, max_doc_tokens: int | None, device: str, opts: list[str] | None = None
) -> RerankerConfig:
    """The reranker config of a command, its ``--opt`` options checked before any model loads.

    Raises:
        ValidationError: an unknown option of ``method`` (the message names the valid
            ones), a bad value, or options with ``--rerank none``.
    """
    from attnrank.reranker.options import parse_options

    options = _parse_opts(opts)
    parse_options(method, options)  # typed check only; the config keeps what was given
    return RerankerConfig(method=method, model=model, max_doc_tokens=max_doc_tokens, device=device, options=options)


def _eval_reranker_config(
    rerank: str, model: str | None, max_doc_tokens: int | None, device: str, opts: list[str] | None, dump: Path | None
) -> RerankerConfig:
    """Reranker config of an eval command; ``--dump`` makes ICR keep its attention.

    Raises:
        ValidationError: bad ``--opt`` (see :func:`_reranker_config`), or ``--dump`` with a
            reranker other than ICR.
    """
    if dump and rerank != "icr":
        from attnrank.errors import ValidationError

        raise ValidationError(f"--dump saves ICR attention; it needs --rerank icr, not {rerank!r}")
    return _reranker_config(rerank, model, max_doc_tokens, device, (opts or []) + (["keep_attention=true"] if dump else []))


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
    index_type: Annotated[str, typer.Option("--index-type", help="Vector index: flat (exact), hnsw or ivf.")] = "flat",
    hnsw_m: Annotated[int, typer.Option("--hnsw-m", help="HNSW links per node (M).")] = 32,
    ef_construction: Annotated[int, typer.Option("--ef-construction", help="HNSW efConstruction.")] = 100,
    ef_search: Annotated[int, typer.Option("--ef-search", help="HNSW default efSearch.")] = 64,
    nlist: Annotated[Optional[int], typer.Option("--nlist", help="IVF cells; default round(sqrt(n)).")] = None,
    nprobe: Annotated[int, typer.Option("--nprobe", help="IVF default cells probed.")] = 16,
    passages: Annotated[
        bool, typer.Option("--passages/--no-passages", help="Encode long documents as passages, scored by their best (MaxP).")
    ] = False,
    passage_words: Annotated[int, typer.Option("--passage-words", help="Words per passage.")] = 128,
    passage_stride: Annotated[int, typer.Option("--passage-stride", help="Words between passage starts.")] = 96,
    max_passages: Annotated[int, typer.Option("--max-passages", help="Most passages per document.")] = 32,
    query_prefix: Annotated[
        Optional[str], typer.Option("--query-prefix", help="Query instruction; default: the model's known one (none for MiniLM).")
    ] = None,
    document_prefix: Annotated[
        Optional[str], typer.Option("--document-prefix", help="Document instruction; default: the model's known one.")
    ] = None,
) -> None:
    """Write an index directory: SQLite document store, BM25 (bm25s), faiss vectors, params.json."""
    from attnrank.index.builder import build_index

    from attnrank.index.dense import DenseParams
    from attnrank.index.passages import PassageParams

    dense_params = DenseParams(index_type=index_type, hnsw_m=hnsw_m, ef_construction=ef_construction,
                               ef_search=ef_search, nlist=nlist, nprobe=nprobe)
    chunking = PassageParams(passage_words, passage_stride, max_passages) if passages else None
    params = build_index(
        corpus, out, embedder=embedder, metadata=metadata, dense=not no_dense,
        batch_size=batch_size, overwrite=overwrite, show_progress=True, dense_params=dense_params,
        passages=chunking, query_prefix=query_prefix, document_prefix=document_prefix,
    )
    typer.echo(json.dumps(params, indent=2))


@index_app.command("compact")
def index_compact(path: Annotated[Path, typer.Argument(help="Index directory.")]) -> None:
    """Rebuild BM25 and the vector index from the live documents (fold in added documents,
    drop deleted ones and HNSW tombstones) and write them. BM25 is rebuilt with the current
    analyzer: this upgrades an index built with an older one without re-encoding vectors."""
    typer.echo(json.dumps(_on_index(path, lambda index: index.compact()), indent=2))


def _on_index(path: Path, action):
    """Open the index at ``path``, run ``action(index)``, close it."""
    from attnrank.index.store import Index

    index = Index.open(path)
    try:
        return action(index)
    finally:
        index.close()


@index_app.command("stats")
def index_stats(path: Annotated[Path, typer.Argument(help="Index directory.")]) -> None:
    """Live documents, BM25 delta and deleted rows, vectors and tombstones of an index."""
    typer.echo(json.dumps(_on_index(path, lambda index: index.stats()), indent=2))


@index_app.command("info")
def index_info(path: Annotated[Path, typer.Argument(help="Index directory.")]) -> None:
    """Print an index's params.json, and its document KV store's header, coverage and bytes."""
    params = json.loads((path / "params.json").read_text())
    kv_dir = path / "kv"
    if (kv_dir / "header.json").exists():
        from attnrank.index.kvstore import KVHeader, KVStore

        header = KVHeader.from_dict(json.loads((kv_dir / "header.json").read_text()))
        with KVStore.open(kv_dir, header, readonly=True) as store:
            stats = store.stats()
        n_docs = _on_index(path, lambda index: len(index.docstore))
        params["kv_store"] = {
            "path": str(kv_dir), "header": header.to_dict(), "blocks": stats.documents,
            "documents": n_docs, "blocks_per_document": round(stats.documents / max(1, n_docs), 4),
            "note": "documents with identical text share one block, so a complete store can hold fewer blocks "
                    "than documents; `attnrank index kv build` computes only the missing ones",
            "bytes_on_disk": stats.bytes_on_disk, "live_bytes": stats.live_bytes, "shards": stats.shards,
        }
    typer.echo(json.dumps(params, indent=2))


@kv_app.command("build")
def index_kv_build(
    index: Annotated[Path, typer.Option("--index", help="Index directory (the store goes to INDEX/kv).")],
    model: ModelOpt = None,
    layer: Annotated[Optional[int], typer.Option("--layer", help="Scoring layer l*: layers 0..l* are stored; "
                                                 "default: the default method's (15, its weights card's, for the "
                                                 "packaged SmolLM2; else round(0.6 L)).")] = None,
    max_doc_tokens: MaxDocTokensOpt = None,
    dtype: Annotated[str, typer.Option("--dtype", help="float16 or int8 (about half the bytes).")] = "float16",
    device: DeviceOpt = "cpu",
    opts: OptsOpt = None,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Blocks per LM batch and per shard.")] = 32,
    verify: Annotated[bool, typer.Option("--verify", help="crc32-check stored blocks first, recompute bad ones.")] = False,
    prune: Annotated[bool, typer.Option("--prune", help="Then delete blocks of deleted or replaced documents and "
                                        "compact the store.")] = False,
    engine: Annotated[str, typer.Option("--engine", help="Where the blocks are encoded: local (this process) or ray "
                                        "(a Ray actor pool; the index must be on a filesystem every node sees at "
                                        "the same path). Same store either way.")] = "local",
    ray_address: RayAddressOpt = None,
    actors: ActorsOpt = None,
    actor_cpus: ActorCpusOpt = None,
    actor_gpus: ActorGpusOpt = None,
) -> None:
    """Encode every document's cached-BlockRank block once (method blockrank-cached, the
    default) into the index's document KV store, so that reranking runs only the query block per query.
    Resumable: a rerun (also after kill -9) skips finished shards. With --engine ray the
    blocks are encoded by Ray actors, each writing its own part of the store, committed into
    it by this process; an interrupted build resumes with either engine."""
    from dataclasses import replace

    from attnrank.index.store import Index
    from attnrank.registry import build_reranker

    from attnrank.index.kvstore import build_index_blocks

    block_engine = _engine(engine, ray_address, actors, actor_cpus, actor_gpus)
    # blocks never use a query adapter: the store serves the reranker with or without one
    extra = {"kv_dtype": dtype, "query_adapter": None, **({"layer": layer} if layer is not None else {})}
    config = _reranker_config("blockrank-cached", model, max_doc_tokens, device, opts)
    config = config.with_options(**extra)
    # with Ray this process only tokenises and reads the header: its LM stays on the CPU
    reranker = build_reranker(config if block_engine.in_process else replace(config, device="cpu"))
    ix = Index.open(index)
    try:
        store, report = build_index_blocks(ix, reranker, engine=block_engine, config=config, batch_size=batch_size,
                                           show_progress=True, verify_existing=verify, prune=prune)
        stats = store.stats()
    except KeyboardInterrupt:
        typer.secho(f"interrupted; rerun the same command to resume {index / 'kv'}", fg="yellow", err=True)
        raise typer.Exit(130) from None
    finally:
        ix.close()
    typer.echo(json.dumps({
        "blocks": stats.documents, "computed": report.computed, "skipped": report.skipped, "seconds": round(report.seconds, 1),
        "blocks_per_second": round(report.computed / report.seconds, 2) if report.seconds and report.computed else None,
        "bytes_on_disk": stats.bytes_on_disk, "bytes_per_block": stats.live_bytes // max(1, stats.documents),
        "header": reranker.block_store_header(),
    }, indent=2))


# ---------------------------------------------------------------------------- serve
@app.command("serve")
def serve(
    index: Annotated[Path, typer.Option("--index", help="Index directory.")],
    host: Annotated[str, typer.Option("--host")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port")] = 8000,
    model: ModelOpt = None,
    max_doc_tokens: MaxDocTokensOpt = None,
    device: DeviceOpt = "cpu",
    rerank_method: Annotated[str, typer.Option("--rerank-method", help="Reranker loaded at start-up: default "
                                               "(blockrank-cached, the best measured), icr, blockrank.")] = "default",
    collection: Annotated[
        Optional[list[str]], typer.Option("--collection", help="More collections as NAME=INDEX_DIR (repeatable).")
    ] = None,
    opts: OptsOpt = None,
) -> None:
    """Serve the REST API (uvicorn) over one index (the default collection) and optional
    named collections. Other settings (API key, workers, queue size, limits) come from
    ATTNRANK_* environment variables (see attnrank.settings.Settings)."""
    import uvicorn

    from attnrank.api.app import create_app
    from attnrank.settings import Settings

    collections: dict[str, str] = {}
    for item in collection or []:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise typer.BadParameter(f"expected NAME=INDEX_DIR, got {item!r}", param_hint="--collection")
        collections[name] = path
    extra: dict[str, Any] = {"collections": collections} if collections else {}
    settings = Settings(
        index=str(index), model=model, max_doc_tokens=max_doc_tokens, device=device, rerank_method=rerank_method,
        rerank_options=dict(_reranker_config(rerank_method, model, max_doc_tokens, device, opts).options), **extra,
    )
    uvicorn.run(create_app(settings), host=host, port=port, log_level="info")


# ---------------------------------------------------------------------------- rerank-batch
@app.command("rerank-batch")
def rerank_batch_cmd(
    topics: Annotated[Path, typer.Option("--topics", help="TREC topics file (qid<TAB>text).")],
    run: Annotated[Path, typer.Option("--run", help="First-stage TREC run (qid Q0 docid rank score tag), .gz ok.")],
    docs: Annotated[Path, typer.Option("--docs", help="Index directory, or a rank_llm run JSON with the passages.")],
    out: Annotated[Path, typer.Option("--out", help="Output TREC run (appended per query; OUT.progress beside it).")],
    method: Annotated[str, typer.Option("--method", help="Reranker: default (blockrank-cached, the best measured), "
                                        "icr, blockrank.")] = "default",
    candidates: Annotated[int, typer.Option("--candidates", help="Top first-stage hits reranked per query.")] = 20,
    depth: Annotated[Optional[int], typer.Option("--depth", help="Hits written per query; default: all of the run's.")] = None,
    tag: Annotated[Optional[str], typer.Option("--tag", help="Run tag; default attnrank-METHOD-cN.")] = None,
    max_queries: Annotated[Optional[int], typer.Option("--max-queries", help="Only the first N queries (topics order).")] = None,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Start afresh instead of resuming.")] = False,
    progress: Annotated[bool, typer.Option("--progress/--no-progress", help="Progress bar.")] = True,
    model: ModelOpt = None,
    max_doc_tokens: MaxDocTokensOpt = None,
    device: DeviceOpt = "cpu",
    engine: EngineOpt = "local",
    ray_address: RayAddressOpt = None,
    actors: ActorsOpt = None,
    actor_cpus: ActorCpusOpt = None,
    actor_gpus: ActorGpusOpt = None,
    opt: OptsOpt = None,
    fusion: Annotated[str, typer.Option(
        "--fusion", help="Rank by ALPHA z(first stage) + (1 - ALPHA) z(reranker) (z of the run's scores): a number, "
        "'default' (the method's recorded weight: 0.6 for the default method, none for icr/blockrank) or 'none'.")
    ] = "default",
) -> None:
    """Rerank a TREC run query by query, appending each query's ranking as it finishes.

    Rerun the same command after an interruption to resume: completed queries are
    skipped and a partly written one is rewritten, so the output equals an uninterrupted
    run's. A document that cannot be reranked is logged and ranked below the others.
    With --engine ray the queries are reranked by a Ray actor pool and written here in the
    same order: the output is byte-identical, and a run may be resumed with either engine.
    """
    from attnrank.eval.batch import rerank_batch

    try:
        batch_engine = _engine(engine, ray_address, actors, actor_cpus, actor_gpus)
        summary = rerank_batch(
            topics, run, docs, out, method=method, candidates=candidates, depth=depth, tag=tag,
            max_queries=max_queries, overwrite=overwrite, show_progress=progress,
            reranker_config=_reranker_config(method, model, max_doc_tokens, device, opt),
            engine=batch_engine,
            fusion=_fusion(fusion, _reranker_config(method, model, max_doc_tokens, device, opt)),
        )
    except KeyboardInterrupt:
        typer.secho(f"interrupted; rerun the same command to resume {out}", fg="yellow", err=True)
        raise typer.Exit(130) from None
    typer.echo(json.dumps(summary.to_dict(), indent=2))


# ---------------------------------------------------------------------------- eval
FusionOpt = Annotated[str, typer.Option(
    "--fusion", help="Rank by ALPHA z(first stage) + (1 - ALPHA) z(reranker) (the served fused path, "
    "/search rerank.fusion): a number in [0, 1], 'default' (the method's recorded weight: 0.6 for the default "
    "method, none for icr/blockrank) or 'none' (the reranker's order).")]


def _fusion(value: str, config: RerankerConfig | None) -> float | None:
    """``--fusion``'s value: a number, ``None`` for ``none``, or for ``default`` the weight the
    method records (:func:`attnrank.registry.recorded_fusion`; read without loading a model).

    Raises:
        ValidationError: anything else, or a number outside [0, 1].
    """
    from attnrank.errors import ValidationError
    from attnrank.registry import recorded_fusion

    text = value.strip().lower()
    if text == "none":
        return None
    if text == "default":
        return recorded_fusion(config) if config is not None else None
    try:
        alpha = float(text)
    except ValueError:
        alpha = -1.0
    if not 0.0 <= alpha <= 1.0:
        raise ValidationError(f"--fusion must be a number in [0, 1], 'default' or 'none', got {value!r}")
    return alpha


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
    max_doc_tokens: MaxDocTokensOpt = None,
    device: DeviceOpt = "cpu",
    opt: OptsOpt = None,
    dump: Annotated[Optional[Path], typer.Option("--dump", help="Also save an ICR attention dump (for heads/ablation).")] = None,
    keep_identical_ids: Annotated[bool, typer.Option(
        "--keep-identical-ids", help="Keep a retrieved document whose id equals the query id; by default it is "
        "dropped before reranking, as BEIR's evaluator does (ignore_identical_ids=True).")] = False,
    engine: EngineOpt = "local",
    ray_address: RayAddressOpt = None,
    actors: ActorsOpt = None,
    actor_cpus: ActorCpusOpt = None,
    actor_gpus: ActorGpusOpt = None,
    fusion: FusionOpt = "default",
) -> None:
    """nDCG@10, Recall@100, MRR@10 of the pipeline on a BEIR dataset; writes a TREC run and a JSON report."""
    from attnrank.eval.beir import evaluate_beir
    from attnrank.eval.report import format_table

    search_engine = _engine(engine, ray_address, actors, actor_cpus, actor_gpus)
    report = evaluate_beir(
        data, split=split, retriever=retriever, rerank=rerank, candidates=candidates,
        max_queries=max_queries, seed=seed, index_dir=index, out_dir=out,
        reranker_config=_eval_reranker_config(rerank, model, max_doc_tokens, device, opt, dump),
        dump_dir=dump, keep_identical_ids=keep_identical_ids, engine=search_engine, fusion=fusion,
    )
    typer.echo(format_table([report]))


@eval_app.command("trec-dl")
def eval_trec_dl(
    data: Annotated[Optional[Path], typer.Option(
        "--data", help="TREC DL folder of one year (topics, NIST qrels, run JSON with passage text) under Anserini / "
        "rank_llm names: topics.dl19-passage.txt or topics.dl21.txt, qrels.dl20-passage.txt, "
        "retrieve_results_<RUN>_dl20_top100.json[.gz].")] = None,
    run: Annotated[Optional[str], typer.Option(
        "--run", help="First-stage run name, e.g. BM25, SPLADE_P_P_ENSEMBLE_DISTIL; default BM25 (with --run-file: "
        "read from its name).")] = None,
    year: Annotated[Optional[str], typer.Option(
        "--year", help="Track year (dl19, dl20, 2021, ...); default: detected from the folder's file names.")] = None,
    topics: Annotated[Optional[Path], typer.Option("--topics", help="Topics file (qid<TAB>text), any name.")] = None,
    qrels: Annotated[Optional[Path], typer.Option("--qrels", help="Qrels file (qid 0 docid rel), any name.")] = None,
    run_file: Annotated[Optional[Path], typer.Option(
        "--run-file", help="rank_llm run JSON with passage texts, any name.")] = None,
    rerank: Annotated[str, typer.Option("--rerank", help="Reranker name or 'none'.")] = "none",
    candidates: Annotated[int, typer.Option("--candidates", help="First-stage hits reranked.")] = 20,
    max_queries: Annotated[Optional[int], typer.Option("--max-queries", help="Seeded subset of this many queries.")] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    out: Annotated[Path, typer.Option("--out", help="Folder for the run file and JSON report.")] = Path("runs"),
    model: ModelOpt = None,
    max_doc_tokens: MaxDocTokensOpt = None,
    device: DeviceOpt = "cpu",
    opt: OptsOpt = None,
    dump: Annotated[Optional[Path], typer.Option("--dump", help="Also save an ICR attention dump (for heads/ablation).")] = None,
    engine: EngineOpt = "local",
    ray_address: RayAddressOpt = None,
    actors: ActorsOpt = None,
    actor_cpus: ActorCpusOpt = None,
    actor_gpus: ActorGpusOpt = None,
    fusion: FusionOpt = "default",
) -> None:
    """nDCG@10, Recall@100, MRR@10, Judged@10 of reranking a TREC DL first-stage run (any year).

    Give --data (the year is read from the file names, or --year), or all of --topics,
    --qrels and --run-file; explicit paths replace the files found in --data."""
    from attnrank.eval.report import format_table
    from attnrank.eval.trecdl import evaluate_trec_dl

    search_engine = _engine(engine, ray_address, actors, actor_cpus, actor_gpus)
    report = evaluate_trec_dl(
        data, run_name=run, rerank=rerank, candidates=candidates, max_queries=max_queries, seed=seed,
        out_dir=out, dump_dir=dump, year=year, topics=topics, qrels=qrels, run_file=run_file, engine=search_engine,
        fusion=fusion,
        reranker_config=_eval_reranker_config(rerank, model, max_doc_tokens, device, opt, dump),
    )
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
    max_doc_tokens: MaxDocTokensOpt = None,
    device: DeviceOpt = "cpu",
) -> None:
    """BlockRank nDCG@10 read at every layer from one pass per query, to choose the scoring layer l*."""
    from attnrank.eval.sweep import format_sweep, layer_sweep_beir

    result = layer_sweep_beir(
        data, split=split, retriever=retriever, candidates=candidates, max_queries=max_queries, seed=seed,
        index_dir=index, out_dir=out, reranker_config=_reranker_config("blockrank", model, max_doc_tokens, device),
    )
    typer.echo(format_sweep(result))


def _dump(data: Path, source: str, split: str, queries: Optional[int], candidates: int, seed: int,
          index: Optional[Path], run: str, shuffle: bool, ensure_gold: bool, out: Path, cfg: RerankerConfig) -> Path:
    from attnrank.eval.heads import beir_candidates, dump_attention, trec_dl_candidates

    if source == "beir":
        qs, cands, scores, qrels = beir_candidates(
            data, split, queries=queries, candidates=candidates, seed=seed, index_dir=index, ensure_gold=ensure_gold
        )
        info: dict[str, Any] = {"dataset": data.resolve().name, "split": split, "first_stage": "bm25"}
    else:
        qs, cands, scores, qrels = trec_dl_candidates(data, run_name=run, candidates=candidates, queries=queries, seed=seed)
        info = {"dataset": data.resolve().name, "split": "test", "first_stage": run}
    info.update(candidates=candidates, queries=len(qs))
    return dump_attention(out, qs, cands, scores, qrels, reranker_config=cfg, shuffle=shuffle, seed=seed, info=info)


@heads_app.command("dump")
def heads_dump(
    data: Annotated[Path, typer.Option("--data", help="BEIR dataset folder, or the TREC DL folder with --source trec-dl.")],
    out: Annotated[Path, typer.Option("--out", help="Dump directory (resumable).")],
    source: Annotated[str, typer.Option("--source", help="beir or trec-dl.")] = "beir",
    split: Annotated[str, typer.Option("--split")] = "test",
    queries: Annotated[Optional[int], typer.Option("--queries", help="Seeded subset size.")] = None,
    candidates: Annotated[int, typer.Option("--candidates")] = 20,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    index: Annotated[Optional[Path], typer.Option("--index")] = None,
    run: Annotated[str, typer.Option("--run", help="TREC DL first-stage run.")] = "BM25",
    shuffle: Annotated[bool, typer.Option("--shuffle/--first-stage-order")] = False,
    model: ModelOpt = None,
    max_doc_tokens: MaxDocTokensOpt = None,
    device: DeviceOpt = "cpu",
) -> None:
    """Save one ICR pass per query (per-head calibrated token attention) for detection and ablations."""
    cfg = _reranker_config("icr", model, max_doc_tokens, device)
    path = _dump(data, source, split, queries, candidates, seed, index, run, shuffle, False, out, cfg)
    typer.echo(f"dump written to {path}")


@heads_app.command("detect")
def heads_detect(
    data: Annotated[Path, typer.Option("--data", help="BEIR-layout dataset folder.")],
    out: Annotated[Path, typer.Option("--out", help="Head-set JSON to write.")],
    split: Annotated[str, typer.Option("--split", help="Detection split (train; never test).")] = "train",
    queries: Annotated[int, typer.Option("--queries")] = 128,
    candidates: Annotated[int, typer.Option("--candidates")] = 20,
    top_k: Annotated[int, typer.Option("--top-k", help="Heads kept.")] = 16,
    method: Annotated[str, typer.Option("--method", help="qrscore or ndcg.")] = "qrscore",
    seed: Annotated[int, typer.Option("--seed")] = 0,
    index: Annotated[Optional[Path], typer.Option("--index")] = None,
    dump: Annotated[Optional[Path], typer.Option("--dump", help="Dump directory (default: next to --out).")] = None,
    model: ModelOpt = None,
    max_doc_tokens: MaxDocTokensOpt = None,
    device: DeviceOpt = "cpu",
) -> None:
    """Detect query-focused heads: BM25 candidates shuffled with the gold always included, per-head scores, top-k."""
    from attnrank.eval.heads import detect_heads

    cfg = _reranker_config("icr", model, max_doc_tokens, device)
    dump = dump or out.with_suffix(".dump")
    _dump(data, "beir", split, queries, candidates, seed, index, "BM25", True, True, dump, cfg)
    hs = detect_heads(dump, method=method, top_k=top_k)
    hs.save(out)
    typer.echo(json.dumps({"heads": [list(h) for h in hs.heads], "detection": dict(hs.detection)}, indent=1))


@heads_app.command("fit")
def heads_fit(
    dump: Annotated[Path, typer.Option("--dump", help="Dump of a train split (e.g. the detection dump).")],
    heads: Annotated[Path, typer.Option("--heads", help="Head-set JSON; weights are added to it.")],
    max_layer: Annotated[Optional[int], typer.Option("--max-layer", help="Deepest layer weighted (default: deepest QR head).")] = None,
    epochs: Annotated[int, typer.Option("--epochs")] = 200,
    lr: Annotated[float, typer.Option("--lr")] = 0.05,
    l2: Annotated[float, typer.Option("--l2")] = 1e-3,
    support: Annotated[str, typer.Option("--support", help="qr: re-weight the selected heads; all: every head up to --max-layer.")] = "qr",
    nonneg: Annotated[bool, typer.Option("--nonneg/--signed", help="Keep weights >= 0.")] = True,
) -> None:
    """Learn per-head weights with the group contrastive loss (used with heads=learned)."""
    from attnrank.eval.heads import fit_head_weights

    hs = fit_head_weights(dump, heads, max_layer=max_layer, epochs=epochs, lr=lr, l2=l2, support=support,
                          nonneg=nonneg)
    typer.echo(json.dumps(dict(hs.weights_info), indent=1))


@eval_app.command("ablation")
def eval_ablation(
    dump: Annotated[Path, typer.Option("--dump", help="Attention dump of the evaluated queries (first-stage order).")],
    heads: Annotated[Path, typer.Option("--heads", help="Head-set JSON (with learned weights, if fitted).")],
    out: Annotated[Optional[Path], typer.Option("--out", help="JSON report.")] = None,
    data: Annotated[Optional[Path], typer.Option(
        "--data", help="Dataset folder whose qrels score the runs (BEIR folder or TREC DL folder); "
        "without it only the candidates' own labels are known (within-candidates nDCG).")] = None,
    split: Annotated[str, typer.Option("--split", help="BEIR qrels split.")] = "test",
) -> None:
    """ICR variants (all/QR/learned heads x ReAttn x RRF fusion) from one pass per query, with paired tests."""
    from attnrank.eval.heads import ablation, format_ablation

    qrels = None
    if data is not None:
        from attnrank.data import load_beir_qrels, load_trec_qrels, trec_dl_paths

        qrels = load_beir_qrels(data, split) if (data / "qrels").is_dir() else load_trec_qrels(trec_dl_paths(data).qrels)
    result = ablation(dump, heads, qrels=qrels)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1, default=str))
    typer.echo(format_ablation(result))


@train_app.command("blockrank")
def train_blockrank_cmd(
    data: Annotated[Path, typer.Option("--data", help="BEIR-layout dataset folder.")],
    out: Annotated[Path, typer.Option("--out", help="Output directory (checkpoints, final model, losses.png); resumes.")],
    model: ModelOpt = None,
    split: Annotated[str, typer.Option("--split")] = "train",
    dev_split: Annotated[Optional[str], typer.Option("--dev-split", help="Split whose auxiliary loss is tracked.")] = "dev",
    dev_queries: Annotated[int, typer.Option("--dev-queries")] = 16,
    max_queries: Annotated[Optional[int], typer.Option("--max-queries", help="Training queries (seeded subset).")] = None,
    candidates: Annotated[int, typer.Option("--candidates", help="Candidates per example (1 positive + hard negatives).")] = 16,
    block_length: Annotated[int, typer.Option("--block-length", help="Per-document LM tokens (max_doc_tokens).")] = 128,
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
    seed: Annotated[int, typer.Option("--seed")] = 0,
    device: DeviceOpt = "cpu",
) -> None:
    """BlockRank fine-tuning: L = L_NTP + lambda * L_aux through the linear block path (resumable)."""
    from attnrank.eval.training_data import blockrank_examples
    from attnrank.reranker.train import TrainConfig, train_blockrank

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


@train_app.command("query-adapter")
def train_query_adapter_cmd(
    train: Annotated[list[str], typer.Option("--train", help="Training source, repeatable: DIR:SPLIT (BEIR) or "
                                             "DIR@RUN (TREC DL run with passage text).")],
    out: Annotated[Path, typer.Option("--out", help="Output directory (checkpoint, best/, final/); resumes.")],
    dev: Annotated[str, typer.Option("--dev", help="Dev source (every choice is made on it).")] = "",
    dev_queries: Annotated[Optional[int], typer.Option("--dev-queries", help="Seeded dev subset.")] = 100,
    train_queries: Annotated[Optional[int], typer.Option("--train-queries", help="Seeded subset per source.")] = None,
    candidates: Annotated[int, typer.Option("--candidates", help="First-stage depth of each list.")] = 50,
    retriever: Annotated[str, typer.Option("--retriever", help="BEIR first stage.")] = "hybrid",
    objective: Annotated[str, typer.Option("--objective", help="learned (head-weight score) or signal (L_aux).")] = "learned",
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
    layer: Annotated[int, typer.Option("--layer", help="l*.")] = 15,
    max_doc_tokens: MaxDocTokensOpt = 128,
    model: ModelOpt = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    device: DeviceOpt = "cpu",
) -> None:
    """Query-side LoRA adapter for cached BlockRank (stored blocks stay valid): listwise loss
    through the query passes only; dev nDCG@10 every --eval-every steps, best kept (resumable)."""
    from attnrank.eval.adapter_study import dev_evaluator, examples_from, load_source, source_store
    from attnrank.registry import build_reranker
    from attnrank.reranker.query_adapter import QueryAdapterConfig, train_query_adapter

    cfg = QueryAdapterConfig(out_dir=str(out), objective=objective, lora_r=lora_r, lora_alpha=2 * lora_r,
                             train_weights=train_weights, lr=lr, steps=steps, batch_queries=batch_queries,
                             max_candidates=max_candidates, eval_every=eval_every, seed=seed)
    config = _reranker_config("blockrank-cached", model, max_doc_tokens, _auto_device(device), None).with_options(
        layer=layer, scoring="learned" if objective == "learned" else "signal", query_adapter=None)
    reranker = build_reranker(config)
    examples, stores = [], {}
    for spec in train:
        queries, cands, _, qrels, index = load_source(spec, candidates=candidates, max_queries=train_queries,
                                                      seed=seed, retriever=retriever)
        examples += [replace(ex, source=spec) for ex in examples_from(queries, cands, qrels)]
        stores[spec] = source_store(reranker, index, scratch_kv, spec)
    evaluate = None
    if dev:
        dq, dc, ds, dqrels, dindex = load_source(dev, candidates=candidates, max_queries=dev_queries, seed=seed,
                                                 retriever=retriever)
        evaluate = dev_evaluator(dq, dc, ds, dqrels, objective=objective,
                                 block_store=source_store(reranker, dindex, scratch_kv, dev))
    summary = train_query_adapter(reranker, examples, cfg, block_stores=stores, evaluate=evaluate,
                                  card={"train": list(train), "dev": dev, "dev_queries": dev_queries,
                                        "candidates": candidates, "retriever": retriever})
    summary.pop("history", None)
    typer.echo(json.dumps(summary, indent=1, default=str))


def _auto_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


@eval_app.command("study-dump")
def eval_study_dump(
    out: Annotated[Path, typer.Option("--out", help="Feature dump to write (.npz); a rerun resumes it.")],
    data: Annotated[Path, typer.Option("--data", help="BEIR folder, or a TREC DL folder with --trec-run.")],
    split: Annotated[str, typer.Option("--split", help="BEIR split.")] = "test",
    retriever: Annotated[str, typer.Option("--retriever", help="BEIR first stage: bm25, dense or hybrid.")] = "hybrid",
    trec_run: Annotated[Optional[str], typer.Option("--trec-run", help="TREC DL run name (e.g. BM25): "
                                                    "candidates from its top-100 JSON.")] = None,
    candidates: Annotated[int, typer.Option("--candidates")] = 50,
    max_queries: Annotated[Optional[int], typer.Option("--max-queries", help="Seeded subset of queries.")] = None,
    seed: Annotated[int, typer.Option("--seed")] = 0,
    index: Annotated[Optional[Path], typer.Option("--index", help="Index directory (BEIR); its document KV store "
                                                  "serves the blocks.")] = None,
    layer: Annotated[int, typer.Option("--layer", help="l*: layers 0..l* are read.")] = 15,
    max_doc_tokens: MaxDocTokensOpt = 128,
    kv_dtype: Annotated[str, typer.Option("--kv-dtype", help="dtype of the index's document KV store.")] = "float16",
    model: ModelOpt = None,
    device: DeviceOpt = "cpu",
    adapter: Annotated[Optional[Path], typer.Option("--adapter", help="Query adapter (attnrank train query-adapter "
                                                    "output, e.g. OUT/best) applied to the query passes.")] = None,
) -> None:
    """Per-candidate attention features of cached BlockRank (calibrated per layer and head,
    signal per head, the served calibrated score), first-stage scores and qrels, from ONE
    pass per query: the input of `attnrank eval study-fit` (issue #14's study)."""
    from attnrank.eval.heads import beir_candidates, trec_dl_candidates
    from attnrank.eval.study import dump_features
    from attnrank.registry import build_reranker

    config = _reranker_config("blockrank-cached", model, max_doc_tokens, device, None).with_options(
        layer=layer, scoring="calibrated", kv_dtype=kv_dtype, query_adapter=None)
    if adapter is not None:  # the reranker loads it on a private copy of the LM (option query_adapter)
        config = config.with_options(query_adapter=str(adapter))
    reranker = build_reranker(config)
    store = None
    if trec_run:
        queries, cands, scores, qrels = trec_dl_candidates(data, run_name=trec_run, candidates=candidates,
                                                           queries=max_queries, seed=seed)
        source = {"data": str(data), "run": trec_run}
    else:
        queries, cands, scores, qrels = beir_candidates(data, split, queries=max_queries, candidates=candidates,
                                                        seed=seed, index_dir=index, retriever=retriever)
        source = {"data": str(data), "split": split, "retriever": retriever}
        if index is not None and (index / "kv" / "header.json").exists():
            from attnrank.index.kvstore import KVHeader, KVStore

            # read-only: several dumps may read one store at once (blocks it lacks are computed, not stored)
            store = KVStore.open(index / "kv", KVHeader.from_dict(reranker.block_store_header()), readonly=True)
    meta = {**source, "candidates": candidates, "layer": layer, "max_doc_tokens": max_doc_tokens,
            "reranker": reranker.describe(),
            "adapter": reranker.describe().get("query_adapter"), "qrels": {q.query_id: dict(qrels.get(q.query_id, {})) for q in queries}}
    try:
        items = dump_features(out, queries, cands, scores, qrels, reranker, block_store=store, meta=meta)
    finally:
        if store is not None:
            store.close()
    typer.echo(json.dumps({"out": str(out), "queries": len(items)}))


@eval_app.command("study-fit")
def eval_study_fit(
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
    from attnrank.eval.study import format_study, load_items, run_study

    train = train or []
    train_items = [it for path in train for it in load_items(path)[1]]
    fixed = {}
    for item in fixed_weights or []:
        name, sep, path = item.partition("=")
        if not sep:
            raise typer.BadParameter(f"expected NAME=PATH, got {item!r}", param_hint="--fixed-weights")
        fixed[name] = _fixed_weights(Path(path))
    dev_meta, dev_items = load_items(dev)
    tests = {}
    for item in test:
        name, sep, path = item.partition("=")
        if not sep:
            raise typer.BadParameter(f"expected NAME=DUMP, got {item!r}", param_hint="--test")
        meta, items = load_items(path)
        tests[name] = (items, meta["qrels"])
    if loss not in ("listwise", "pairwise", "lambdarank"):
        raise typer.BadParameter(f"expected listwise, pairwise or lambdarank, got {loss!r}", param_hint="--loss")
    layers = list(range(max_layer + 1)) if max_layer is not None else None
    report = run_study(train_items, dev_items, dev_meta["qrels"], tests, epochs=epochs, loss=loss,
                       temperature=temperature, layers=layers, fixed=fixed)
    report["fit"] = {"loss": loss, "temperature": temperature, "layers": layers}
    report["train"] = {"dumps": [str(p) for p in train], "queries": len(train_items)}
    if out is not None:
        out.write_text(json.dumps(report, indent=1))
    if export is not None:
        from attnrank.eval.study import weights_card

        if not train:
            raise typer.BadParameter("--export writes the learned head weights: give --train dumps", param_hint="--export")
        card = weights_card(report, dev_meta, command="attnrank eval study-fit " + " ".join(
            [f"--train {p}" for p in train] + [f"--dev {dev}"] + [f"--test {t}" for t in test]
            + [f"--loss {loss}", f"--temperature {temperature:g}"]
            + ([f"--max-layer {max_layer}"] if max_layer is not None else []) + [f"--export {export}"]))
        card["fit"] = report["fit"]
        export.write_text(json.dumps(card, indent=1))
    typer.echo(format_study(report))


def _fixed_weights(path: Path) -> list[float]:
    """Head weights of a weights card (``.json``) or of a query adapter folder (its trained
    ``scorer.weights``, else the shipped card of its model)."""
    from attnrank.errors import NotFoundError

    if path.is_dir():
        from safetensors.numpy import load_file

        tensors = load_file(str(path / "adapter.safetensors"))
        if "scorer.weights" in tensors:
            return tensors["scorer.weights"].astype(float).tolist()
        from attnrank.reranker.heads import packaged_data_dir

        card = json.loads((path / "adapter.json").read_text())
        path = packaged_data_dir() / f"{card['model']['name']}.blockrank-cached.json"
    if not path.is_file():
        raise NotFoundError(f"no weights at {path}: pass a weights card (.json) or a query adapter folder")
    return [float(x) for x in json.loads(path.read_text())["weights"]]


@eval_app.command("compare")
def eval_compare(
    a: Annotated[Path, typer.Argument(help="Baseline JSON report.")],
    b: Annotated[Path, typer.Argument(help="Treatment JSON report.")],
    trials: Annotated[int, typer.Option("--trials", help="Randomization test permutations.")] = 10_000,
) -> None:
    """Per-metric deltas (B - A) over the queries both reports share, with a paired randomization test."""
    from attnrank.eval.compare import compare_reports, format_comparison

    typer.echo(format_comparison(compare_reports(a, b, trials=trials)))


def _typed_errors(command):
    """Wrap a command so that every typed error (:class:`attnrank.errors.AttnrankError`) ends
    as one red ``error (<error_type>): <message>`` line and exit code 2, never a traceback;
    Ctrl-C exits 130."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        from attnrank.errors import AttnrankError

        try:
            return command(*args, **kwargs)
        except AttnrankError as exc:
            _fail(exc)
        except KeyboardInterrupt:
            typer.secho("interrupted", fg="yellow", err=True)
            raise typer.Exit(130) from None

    return wrapper


def _wrap_all(group: typer.Typer) -> None:
    """Wrap every command of ``group`` and of its subgroups, however deep."""
    for info in group.registered_commands:
        info.callback = _typed_errors(info.callback)
    for sub in group.registered_groups:
        if sub.typer_instance is not None:
            _wrap_all(sub.typer_instance)


_wrap_all(app)


def main() -> None:
    """Console entry point (``attnrank``)."""
    app()


if __name__ == "__main__":  # pragma: no cover
    main()

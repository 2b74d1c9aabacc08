"""``heedrank index``: build, compact and inspect index directories (the document KV store
has its own group, :mod:`heedrank.cli.kv`, as ``heedrank index kv``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Callable, Optional

import typer

from heedrank.cli.options import VECTORS_ENGINE_HELP, engine_flags
from heedrank.engine import Engine, LocalEngine

EXAMPLES = """\
Examples:

  heedrank index build --corpus data/beir-nfcorpus --out indexes/nfcorpus
  heedrank index build --corpus corpus.jsonl --out ix --no-dense --metadata meta.jsonl
  heedrank index build --corpus data/beir-scifact --out ix --index-type hnsw --passages
  heedrank index build --corpus big/corpus.jsonl --out /shared/ix --engine ray --actors 4 --actor-cpus 4
  heedrank index stats indexes/nfcorpus
  heedrank index compact indexes/nfcorpus
  heedrank index info indexes/nfcorpus
"""

app = typer.Typer(help="Build and inspect index directories.", epilog=EXAMPLES, no_args_is_help=True)


@app.command("build")
@engine_flags(VECTORS_ENGINE_HELP)
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
    embedder_runtime: Annotated[str, typer.Option(
        "--embedder-runtime", help="auto (ONNX Runtime for a BERT-family embedder when onnxruntime is "
        "installed, else torch), torch or onnx: the same vectors; bf16 (PyTorch under bfloat16 autocast, "
        "about 3x faster on a CPU with AMX; vectors at cosine 1.0000; elsewhere as auto). Queries are encoded "
        "with the same.")] = "auto",
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing index directory.")] = False,
    index_type: Annotated[str, typer.Option("--index-type", help="Vector index: auto (flat, exact, up to 100,000 vectors; "
                                            "else ivf with nlist ~ sqrt(n)), flat, hnsw or ivf.")] = "auto",
    hnsw_m: Annotated[int, typer.Option("--hnsw-m", help="HNSW links per node (M).")] = 32,
    ef_construction: Annotated[int, typer.Option("--ef-construction", help="HNSW efConstruction.")] = 100,
    ef_search: Annotated[int, typer.Option("--ef-search", help="HNSW default efSearch.")] = 64,
    nlist: Annotated[Optional[int], typer.Option("--nlist", help="IVF cells; default round(sqrt(n)).")] = None,
    nprobe: Annotated[int, typer.Option("--nprobe", help="IVF default cells probed.")] = 16,
    ivf_storage: Annotated[str, typer.Option(
        "--ivf-storage", help="How IVF stores the vectors: auto (sq8 above 1,000,000 vectors, else float32), "
        "float32, or sq8 (8-bit scalar quantiser: a quarter of the disk and RAM, scores from the decoded "
        "vectors; measured in docs/results/scale.md).")] = "auto",
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
    engine: Engine = LocalEngine(),
) -> None:
    """Write an index directory: SQLite document store, BM25 (bm25s), faiss vectors, params.json (with
    the seconds per stage). A build killed during its dense encoding resumes when run again with the
    same arguments: the chunks already encoded are read back, only the rest is encoded."""
    from heedrank.index.builder import build_index

    from heedrank.index.dense import DenseParams
    from heedrank.index.passages import PassageParams

    dense_params = DenseParams(index_type=index_type, hnsw_m=hnsw_m, ef_construction=ef_construction,
                               ef_search=ef_search, nlist=nlist, nprobe=nprobe, ivf_storage=ivf_storage)
    chunking = PassageParams(passage_words, passage_stride, max_passages) if passages else None
    params = build_index(
        corpus, out, embedder=embedder, metadata=metadata, dense=not no_dense,
        batch_size=batch_size, overwrite=overwrite, show_progress=True, dense_params=dense_params,
        passages=chunking, query_prefix=query_prefix, document_prefix=document_prefix,
        embedder_runtime=embedder_runtime, engine=engine,
    )
    typer.echo(json.dumps(params, indent=2))


@app.command("compact")
def index_compact(path: Annotated[Path, typer.Argument(help="Index directory.")]) -> None:
    """Rebuild BM25 and the vector index from the live documents (fold in added documents,
    drop deleted ones and HNSW tombstones) and write them. BM25 is rebuilt with the current
    analyzer: this upgrades an index built with an older one without re-encoding vectors."""
    typer.echo(json.dumps(_on_index(path, lambda index: index.compact()), indent=2))


def _on_index(path: Path, action: Callable[[Any], Any]) -> Any:
    """Open the index at ``path``, run ``action(index)``, close it."""
    from heedrank.index.store import Index

    index = Index.open(path)
    try:
        return action(index)
    finally:
        index.close()


@app.command("stats")
def index_stats(path: Annotated[Path, typer.Argument(help="Index directory.")]) -> None:
    """Live documents, BM25 delta and deleted rows, vectors and tombstones of an index."""
    typer.echo(json.dumps(_on_index(path, lambda index: index.stats()), indent=2))


@app.command("info")
def index_info(path: Annotated[Path, typer.Argument(help="Index directory.")]) -> None:
    """Print an index's params.json, and its document KV store's header, coverage and bytes."""
    params = json.loads((path / "params.json").read_text())
    kv_dir = path / "kv"
    if (kv_dir / "header.json").exists():
        from heedrank.index.kv import KVHeader, KVStore

        header = KVHeader.from_dict(json.loads((kv_dir / "header.json").read_text()))
        with KVStore.open(kv_dir, header, readonly=True) as store:
            stats = store.stats()
        n_docs = _on_index(path, lambda index: len(index.docstore))
        params["kv_store"] = {
            "path": str(kv_dir), "header": header.to_dict(), "blocks": stats.blocks,
            "documents": n_docs, "blocks_per_document": round(stats.blocks / max(1, n_docs), 4),
            "note": "documents with identical text share one block, so a complete store can hold fewer blocks "
                    "than documents; `heedrank index kv build` computes only the missing ones",
            "bytes_on_disk": stats.bytes_on_disk, "live_bytes": stats.live_bytes, "shards": stats.shards,
            "bytes_per_block": round(stats.live_bytes / max(1, stats.blocks), 1),
            "bytes_per_document": round(stats.bytes_on_disk / max(1, n_docs), 1),
        }
    typer.echo(json.dumps(params, indent=2))

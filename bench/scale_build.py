"""The index at N documents: build time per stage, peak RSS, disk per part, the time to open it,
and first-stage latency and NFCorpus test nDCG@10, on a corpus made by ``bench/scale_corpus.py``.

Two phases, each in its own process so that each peak RSS is its own:

1. **build** (skipped when ``--out`` already holds a finished index): ``build_index`` over
   ``--corpus`` with the stage seconds it records (``params.json`` ``build_stages``) and the
   process's peak RSS. A killed build resumes when run again (the dense chunks already encoded are
   read back).
2. **probe**: ``Index.open`` timed, then the NFCorpus test queries one at a time (``k`` 100):
   BM25, dense and hybrid (RRF) first stage, p50 / p99 per query (the query's encoding included)
   and nDCG@10; the dense index's recall@10 against exact search over the same vectors; filtered
   dense search (the planner) at 1% and 0.01% selectivity (``metadata.jsonl``'s ``shard`` and
   ``bucket``, when the corpus has it): p50 / p99, recall@10 against exact and how many answers
   came back short; and the process's peak RSS.

``--encoder hashing`` builds the dense part with the model-free
:class:`heedrank.index.hashing.HashingEncoder` (384-d): the structure of a large index (BM25, the
SQLite store, faiss at 384 dimensions, their disk, RAM and latency) in minutes rather than the
hours the real embedder needs on 2 cores; its dense and hybrid nDCG@10 mean nothing (BM25's does).
``--encoder default`` uses the packaged all-MiniLM-L6-v2, on ``--embedder-runtime`` (``auto`` unless
given; ``bf16`` on a CPU with AMX or AVX-512 BF16).

``--sort-group G`` sets how many of the embedder's batches it sorts by length at once
(``SentenceTransformerEncoder.SORT_GROUP``), to compare builds that differ only in it.

    python bench/scale_build.py --corpus runs/scale/1m --out runs/scale/1m-hashing --encoder hashing
        [--queries 323] [--phase build|probe|both] [--sort-group G]

Prints one markdown table of the figures and writes them as JSON to ``--out``/../<name>.scale.json.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

DATA = Path(os.environ.get("HEEDRANK_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


def peak_rss_gb() -> float:
    """This process's peak resident set, GB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def encoder_of(name: str) -> Any:
    """``None`` (the index's default embedder) or the hashing stand-in."""
    if name == "default":
        return None
    from heedrank.index.hashing import HashingEncoder

    return HashingEncoder(384)


def disk(out: Path) -> dict[str, float]:
    """MB on disk per part of the index directory (top-level entries; folders summed)."""
    parts: dict[str, float] = {}
    for entry in sorted(out.iterdir()):
        files = [entry] if entry.is_file() else [p for p in entry.rglob("*") if p.is_file()]
        parts[entry.name] = round(sum(p.stat().st_size for p in files) / 1e6, 1)
    return parts


def build(args: argparse.Namespace) -> dict[str, Any]:
    from heedrank.index.builder import build_index
    from heedrank.index.encoder import SentenceTransformerEncoder

    if args.sort_group is not None:
        SentenceTransformerEncoder.SORT_GROUP = args.sort_group

    t0 = time.perf_counter()
    metadata = args.corpus / "metadata.jsonl"
    params = build_index(args.corpus, args.out, encoder=encoder_of(args.encoder), show_progress=True,
                         overwrite=False, metadata=metadata if metadata.is_file() else None,
                         embedder_runtime=args.embedder_runtime)
    return {"build_s": round(time.perf_counter() - t0, 1), "build_stages": params.get("build_stages"),
            "num_docs": params["num_docs"], "dense_index": (params.get("dense") or {}).get("index_type"),
            "build_peak_rss_gb": round(peak_rss_gb(), 2), "disk_mb": disk(args.out)}


def probe(args: argparse.Namespace) -> dict[str, Any]:
    from heedrank.data import load_beir_qrels, load_beir_queries
    from heedrank.eval.metrics import evaluate_run
    from heedrank.index.store import Index
    from heedrank.retriever.bm25 import BM25Retriever
    from heedrank.retriever.dense import DenseRetriever
    from heedrank.retriever.hybrid import HybridRetriever
    from heedrank.types import rankings_to_run

    t0 = time.perf_counter()
    index = Index.open(args.out, encoder=encoder_of(args.encoder))
    opened = time.perf_counter() - t0
    qrels = load_beir_qrels(args.corpus, "test")
    queries = load_beir_queries(args.corpus)
    qs = [queries[q] for q in sorted(qrels)][: args.queries]
    row: dict[str, Any] = {"open_s": round(opened, 2)}
    for name, retriever in (("bm25", BM25Retriever.from_index(index)), ("dense", DenseRetriever.from_index(index)),
                            ("hybrid", HybridRetriever.from_index(index))):
        retriever.retrieve(qs[:2], 100)  # warm-up (loads the query encoder)
        times, rankings = [], []
        for q in qs:
            t1 = time.perf_counter()
            rankings += retriever.retrieve([q], 100)
            times.append(time.perf_counter() - t1)
        run = rankings_to_run(rankings)
        ndcg = evaluate_run(run, qrels, ["nDCG@10"], query_ids=[q.query_id for q in qs]).aggregate["nDCG@10"]
        row[name] = {"p50_ms": round(1000 * float(np.median(times)), 1),
                     "p99_ms": round(1000 * float(np.percentile(times, 99)), 1), "ndcg10": round(100 * float(ndcg), 2)}
    vectors = index.encoder.encode_queries([q.text for q in qs])
    t1 = time.perf_counter()
    exact, _ = index.search_dense(vectors, 10, strategy="exact")
    exact_ms = 1000 * (time.perf_counter() - t1) / len(qs)
    approx, _ = index.search_dense(vectors, 10, strategy="ann")
    recall = [len(set(a[0]) & set(e[0])) / max(len(e[0]), 1) for a, e in zip(approx, exact)]
    row["dense_recall10_vs_exact"] = {"recall": round(float(np.mean(recall)), 4), "exact_ms_per_query": round(exact_ms, 1),
                                      "index": index.dense.describe() if hasattr(index.dense, "describe") else None}
    for name, field, share in (("filtered 1%", "shard", 100), ("filtered 0.01%", "bucket", 10_000)):
        if len(index.docstore) < share or field not in (index.docstore.get("MED-10").metadata or {}):
            continue  # an index built without bench/scale_corpus.py's metadata.jsonl
        flt = {"must": [{"key": field, "match": {"value": 7}}]}
        times, recall, short = [], [], 0
        for v in vectors:
            t1 = time.perf_counter()
            got = index.search_dense(v[None], 10, filter=flt)[0][0][0]
            times.append(time.perf_counter() - t1)
            want = index.search_dense(v[None], 10, filter=flt, strategy="exact")[0][0][0]
            recall.append(len(set(got) & set(want)) / max(len(want), 1))
            short += len(got) < len(want)
        row[name] = {"p50_ms": round(1000 * float(np.median(times)), 1), "p99_ms": round(1000 * float(np.percentile(times, 99)), 1),
                     "recall10_vs_exact": round(float(np.mean(recall)), 4), "short": short}
    row["probe_peak_rss_gb"] = round(peak_rss_gb(), 2)
    index.close()
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, required=True, help="A bench/scale_corpus.py folder (BEIR layout).")
    ap.add_argument("--out", type=Path, required=True, help="Index directory (built when not finished).")
    ap.add_argument("--encoder", choices=("hashing", "default"), default="hashing")
    ap.add_argument("--embedder-runtime", default="auto", choices=("auto", "torch", "onnx", "bf16"),
                    help="The real embedder's runtime for the build (--encoder default); see index build --help.")
    ap.add_argument("--queries", type=int, default=323, help="NFCorpus test queries probed.")
    ap.add_argument("--sort-group", type=int, help="Batches the embedder sorts by length at once "
                    "(SentenceTransformerEncoder.SORT_GROUP; default: the encoder's), to compare builds.")
    ap.add_argument("--phase", choices=("build", "probe", "both"), default="both")
    args = ap.parse_args(argv)
    if args.phase != "both":
        result = build(args) if args.phase == "build" else probe(args)
        print("RESULT " + json.dumps(result))
        return 0
    figures: dict[str, Any] = {"corpus": str(args.corpus), "encoder": args.encoder,
                               "embedder_runtime": args.embedder_runtime, "sort_group": args.sort_group}
    for phase in ("build", "probe"):
        if phase == "build" and (args.out / "params.json").is_file():
            figures["build"] = "already built"
            continue
        cmd = [sys.executable, __file__, "--corpus", str(args.corpus), "--out", str(args.out),
               "--encoder", args.encoder, "--embedder-runtime", args.embedder_runtime,
               "--queries", str(args.queries), "--phase", phase]
        cmd += ["--sort-group", str(args.sort_group)] if args.sort_group is not None else []
        done = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True)
        line = next(x for x in done.stdout.splitlines() if x.startswith("RESULT "))
        figures.update(json.loads(line[len("RESULT "):]))
    (args.out.parent / f"{args.out.name}.scale.json").write_text(json.dumps(figures, indent=2))
    print("| figure | value |")
    print("|---|---|")
    for key, value in figures.items():
        print(f"| {key} | {json.dumps(value)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

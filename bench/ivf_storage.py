"""IVF vector storage: float32 (``IndexIVFFlat``) against 8-bit scalar quantisation
(``IndexIVFScalarQuantizer``, ``--ivf-storage sq8``) over the same vectors and cells.

Reads the vectors of an existing index (``--index``, built with dense vectors), builds the sq8 IVF
over them with the index's own ``nlist`` and ``nprobe`` (trained on them, as a build would), and
compares, on the NFCorpus test queries (``--corpus``: its ``queries.jsonl`` and test qrels; a
``bench/scale_corpus.py`` folder keeps NFCorpus's):

- bytes of ``vectors.faiss`` as written, and the seconds to train and fill the sq8 index;
- recall@10 of the ANN search (the index's ``nprobe``) against exact float32 search over the same
  vectors (faiss ``IndexFlatIP``, brute force);
- per-query p50 / p99 of the ANN search (ms, one query at a time, query encoding excluded);
- dense and hybrid (RRF) nDCG@10 through the product's retrievers, the index's vectors swapped.

    python bench/ivf_storage.py --index runs/scale/1m-real --corpus runs/scale/1000000 [--queries 323]

Prints one markdown table; writes it as JSON beside the index (``<index>.ivf_storage.json``).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np


def timed_search(dense: Any, vectors: np.ndarray, k: int) -> tuple[list[list[int]], list[float]]:
    """ANN top-``k`` labels per query, one query at a time, and the seconds each took."""
    rows, times = [], []
    for v in vectors:
        t0 = time.perf_counter()
        got = dense.search_ann(v[None], k)[0][0]
        times.append(time.perf_counter() - t0)
        rows.append(got.tolist())
    return rows, times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--index", type=Path, required=True, help="An index directory with dense vectors.")
    ap.add_argument("--corpus", type=Path, required=True, help="BEIR folder with NFCorpus's queries and test qrels.")
    ap.add_argument("--queries", type=int, default=323)
    ap.add_argument("--encoder", choices=("default", "hashing"), default="default",
                    help="hashing: an index built by bench/scale_build.py --encoder hashing")
    args = ap.parse_args(argv)

    import faiss

    from heedrank.data import load_beir_qrels, load_beir_queries
    from heedrank.eval.metrics import evaluate_run
    from heedrank.index.dense import DenseIndex, DenseParams
    from heedrank.index.store import Index
    from heedrank.retriever.dense import DenseRetriever
    from heedrank.retriever.hybrid import HybridRetriever
    from heedrank.types import rankings_to_run

    encoder = None
    if args.encoder == "hashing":
        from heedrank.index.hashing import HashingEncoder

        encoder = HashingEncoder(384)
    index = Index.open(args.index, encoder=encoder)
    own = index.dense
    if own is None:
        raise SystemExit(f"{args.index} has no dense vectors")
    qrels = load_beir_qrels(args.corpus, "test")
    queries = load_beir_queries(args.corpus)
    qs = [queries[q] for q in sorted(qrels)][: args.queries]
    qvec = index.encoder.encode_queries([q.text for q in qs])
    labels = np.asarray(own.labels()).copy()
    t0 = time.perf_counter()
    x = own.vectors(labels)
    read_s = time.perf_counter() - t0
    flat = faiss.IndexFlatIP(x.shape[1])
    flat.add(x)
    _, pos = flat.search(qvec, 10)
    exact = [labels[row[row >= 0]].tolist() for row in pos]
    del flat

    variants: dict[str, Any] = {"float32 (the index's own)": (own, None)}
    if own.kind == "ivf":
        params = DenseParams("ivf", nlist=own.params.nlist, nprobe=own.params.nprobe, ivf_storage="sq8")
        t0 = time.perf_counter()
        sq8 = DenseIndex.build(x, labels, params)
        variants["sq8"] = (sq8, round(time.perf_counter() - t0, 1))
    del x
    table: dict[str, Any] = {"index": str(args.index), "vectors": len(labels), "read_vectors_s": round(read_s, 1),
                             "queries": len(qs), "variants": {}}
    for name, (dense, build_s) in variants.items():
        with tempfile.TemporaryDirectory() as tmp:
            dense.save(Path(tmp) / "v.faiss")
            size_mb = round((Path(tmp) / "v.faiss").stat().st_size / 1e6, 1)
        dense.search_ann(qvec[:2], 10)  # warm-up
        rows, times = timed_search(dense, qvec, 10)
        recall = float(np.mean([len(set(r) & set(e)) / max(len(e), 1) for r, e in zip(rows, exact)]))
        index.dense = dense  # the product's retrievers over these vectors
        ndcg = {}
        for label, retriever in (("dense", DenseRetriever.from_index(index)), ("hybrid", HybridRetriever.from_index(index))):
            run = rankings_to_run(retriever.retrieve(qs, 100))
            ndcg[label] = round(100 * float(evaluate_run(run, qrels, ["nDCG@10"], query_ids=[q.query_id for q in qs])
                                      .aggregate["nDCG@10"]), 2)
        table["variants"][name] = {
            "describe": dense.describe()["index_type"], "nlist": dense.params.nlist, "nprobe": dense.params.nprobe,
            "vectors_faiss_mb": size_mb, "build_s": build_s, "recall10_vs_exact_float32": round(recall, 4),
            "p50_ms": round(1000 * float(np.median(times)), 2), "p99_ms": round(1000 * float(np.percentile(times, 99)), 2),
            "dense_ndcg10": ndcg["dense"], "hybrid_ndcg10": ndcg["hybrid"]}
    index.dense = own
    index.close()
    (args.index.parent / f"{args.index.name}.ivf_storage.json").write_text(json.dumps(table, indent=2))
    print(f"{table['vectors']:,} vectors, {table['queries']} NFCorpus test queries")
    print("| storage | faiss | vectors.faiss MB | build s | recall@10 vs exact | p50 ms | p99 ms | dense nDCG@10 | hybrid nDCG@10 |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, row in table["variants"].items():
        print(f"| {name} | {row['describe']} nlist {row['nlist']} nprobe {row['nprobe']} | {row['vectors_faiss_mb']} | "
              f"{row['build_s'] if row['build_s'] is not None else ''} | {row['recall10_vs_exact_float32']} | {row['p50_ms']} | "
              f"{row['p99_ms']} | {row['dense_ndcg10']} | {row['hybrid_ndcg10']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

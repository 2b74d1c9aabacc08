"""Documents per second of the packaged embedder (all-MiniLM-L6-v2) on CPU, side by side in one run:
float32 PyTorch (today's index build) against PyTorch's dynamic int8 quantisation of its linear
layers (``torch.ao.quantization.quantize_dynamic``, weights int8, activations quantised per batch:
no new dependency), with the vectors' agreement to float32.

For each variant: documents per second encoding the first ``--docs`` NFCorpus documents (their
``title + " " + text``, as the index encodes them) at ``--batch-size``, after one warm-up batch;
the cosine of each document's vector with its float32 vector (median, min); and, with
``--ndcg``, NFCorpus test dense nDCG@10 with the whole corpus encoded by the variant (exact inner
product; the quality bar: within 0.2 of float32).

    python bench/embed_speed.py --docs 512 [--batch-size 64] [--threads 2] [--ndcg]

Prints one markdown table.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

DATA = Path(os.environ.get("HEEDRANK_SHARED_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


def corpus(n: int | None) -> tuple[list[str], list[str]]:
    """The first ``n`` (``None``: all) NFCorpus documents' ids and contents."""
    ids, texts = [], []
    with gzip.open(DATA / "beir-nfcorpus" / "corpus.jsonl.gz", "rt", encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            ids.append(d["_id"])
            texts.append(f"{d.get('title') or ''} {d['text']}".strip())
            if n is not None and len(ids) == n:
                break
    return ids, texts


def variants() -> dict[str, Callable[[Any], Any]]:
    """``{name: convert the Hugging Face model in place}`` of the runtimes compared."""
    import torch

    def int8(model: Any) -> Any:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notice
            return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)

    return {"float32 (today)": lambda m: m, "int8 dynamic (torch)": int8}


def ndcg10(encode: Callable[[list[str]], np.ndarray]) -> float:
    """NFCorpus test dense nDCG@10 (exact inner product over the whole corpus)."""
    from heedrank.data import load_beir_qrels, load_beir_queries
    from heedrank.eval.metrics import evaluate_run

    ids, texts = corpus(None)
    docs = encode(texts)
    qrels = load_beir_qrels(DATA / "beir-nfcorpus", "test")
    queries = [q for q in load_beir_queries(DATA / "beir-nfcorpus").values() if q.query_id in qrels]
    qv = encode([q.text for q in queries])
    run = {}
    for q, v in zip(queries, qv):
        s = docs @ v
        top = np.argsort(-s)[:100]
        run[q.query_id] = {ids[i]: float(s[i]) for i in top}
    return 100 * float(evaluate_run(run, qrels, ["nDCG@10"], query_ids=list(qrels)).aggregate["nDCG@10"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=512)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ndcg", action="store_true", help="Also NFCorpus test dense nDCG@10 per variant (minutes each).")
    args = ap.parse_args(argv)
    import torch

    from heedrank.index.encoder import SentenceTransformerEncoder

    torch.set_num_threads(args.threads)
    _, texts = corpus(args.docs)
    rows, base = [], None
    for name, convert in variants().items():
        enc = SentenceTransformerEncoder(batch_size=args.batch_size)
        model = enc.model
        convert(model[0].model)  # the Hugging Face model inside sentence-transformers' Transformer module, in place

        def encode(xs: list[str], model: Any = model) -> np.ndarray:
            return np.asarray(model.encode(xs, batch_size=args.batch_size, normalize_embeddings=True,
                                           convert_to_numpy=True, show_progress_bar=False), dtype=np.float32)

        encode(texts[: args.batch_size])  # warm-up
        t0 = time.perf_counter()
        vecs = encode(texts)
        rate = len(texts) / (time.perf_counter() - t0)
        base = vecs if base is None else base
        cos = np.sum(vecs * base, axis=1)
        row = {"variant": name, "docs/s": round(rate, 1), "cos median": round(float(np.median(cos)), 4),
               "cos min": round(float(cos.min()), 4)}
        if args.ndcg:
            row["NFCorpus dense nDCG@10"] = round(ndcg10(encode), 2)
        rows.append(row)
    keys = list(rows[0])
    print(f"{args.docs} NFCorpus documents, batch {args.batch_size}, {args.threads} torch threads")
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(str(r.get(k, "")) for k in keys) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

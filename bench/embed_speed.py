"""Documents per second of the packaged embedder (all-MiniLM-L6-v2) on CPU, side by side in one run:
float32 PyTorch, PyTorch's dynamic int8 quantisation of its linear layers
(``torch.ao.quantization.quantize_dynamic``), the fused float32 ONNX Runtime graph the index build
uses by default (:mod:`heedrank.index.onnx_runtime`), and that graph with int8 weights
(``onnxruntime.quantization.quantize_dynamic``, per channel: measured, not kept), with the vectors'
agreement to float32.

For each variant: documents per second encoding the first ``--docs`` NFCorpus documents (their
``title + " " + text``, as the index encodes them) at ``--batch-size``, after one warm-up batch;
the median time to encode one 8-word query alone (as ``/search`` does);
the cosine of each document's vector with its float32 vector (median, min); and, with
``--ndcg``, NFCorpus test dense nDCG@10 with the whole corpus encoded by the variant (exact inner
product; the quality bar: within 0.2 of float32).

    python bench/embed_speed.py --docs 512 [--source nfcorpus|passages] [--batch-size 64] [--threads 2] [--ndcg]

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


def passages(n: int) -> list[str]:
    """``n`` TREC DL passages (the DL19/21/22 first-stage runs' texts, in id order)."""
    from scale_corpus import dl_passages  # bench/ is the script's folder

    texts = dl_passages(DATA)
    return [texts[k] for k in sorted(texts)[:n]]


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


def variants() -> dict[str, tuple[str, Callable[[Any], Any]]]:
    """``{name: (encoder runtime, convert the Hugging Face model in place)}`` of the runtimes compared
    (the ``bfloat16`` one runs float32 weights under ``torch.autocast``: AMX or AVX-512 BF16 where
    the CPU has them, else slow emulation)."""
    import torch

    def int8(model: Any) -> Any:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notice
            return torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)

    def same(model: Any) -> Any:
        return model

    return {"float32 (torch)": ("torch", same), "int8 dynamic (torch)": ("torch", int8),
            "float32 (ONNX Runtime, fused: the default)": ("onnx", same),
            "int8 (ONNX Runtime, fused)": ("onnx-int8", same),
            "bfloat16 autocast (torch)": ("torch-bf16", same)}


def onnx_int8(enc: Any) -> None:
    """Run ``enc`` (on the ``onnx`` runtime) on its fused graph with int8 weights, quantised here
    once into the cache beside the fused file."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from heedrank.index.onnx_runtime import onnx_model, run_on_onnx

    fused = onnx_model(enc.model_dir, enc.sha256)
    int8 = fused.with_name(fused.stem + "-int8.onnx")
    if not int8.is_file():
        quantize_dynamic(str(fused), str(int8), weight_type=QuantType.QInt8, per_channel=True,
                         extra_options={"DefaultTensorType": 1})  # 1 = float: the fused ops' outputs
    run_on_onnx(enc.model, int8)


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
    ap.add_argument("--source", choices=("nfcorpus", "passages"), default="nfcorpus",
                    help="NFCorpus documents (mostly cut at 256 word pieces) or TREC DL passages.")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ndcg", action="store_true", help="Also NFCorpus test dense nDCG@10 per variant (minutes each).")
    ap.add_argument("--variants", default="", help="Comma-separated substrings: only the variants whose name holds one "
                    "(the first listed variant is the cosines' reference); default: all.")
    args = ap.parse_args(argv)
    import torch

    from heedrank.index.encoder import SentenceTransformerEncoder

    torch.set_num_threads(args.threads)
    texts = corpus(args.docs)[1] if args.source == "nfcorpus" else passages(args.docs)
    rows, base = [], None
    wanted = [w.strip() for w in args.variants.split(",") if w.strip()]
    for name, (runtime, convert) in variants().items():
        if wanted and not any(w in name for w in wanted):
            continue
        enc = SentenceTransformerEncoder(batch_size=args.batch_size,
                                         runtime={"onnx-int8": "onnx", "torch-bf16": "torch"}.get(runtime, runtime))
        if runtime == "onnx-int8":
            onnx_int8(enc)
        model = enc.model
        convert(model[0].model)  # the Hugging Face model inside sentence-transformers' Transformer module, in place

        def encode(xs: list[str], model: Any = model, bf16: bool = runtime == "torch-bf16") -> np.ndarray:
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                got = model.encode(xs, batch_size=args.batch_size, normalize_embeddings=True,
                                   convert_to_tensor=True, show_progress_bar=False)
            got = got.float()
            return (got / got.norm(dim=1, keepdim=True)).numpy()

        encode(texts[: args.batch_size])  # warm-up
        t0 = time.perf_counter()
        vecs = encode(texts)
        rate = len(texts) / (time.perf_counter() - t0)
        one = []
        for text in texts[:50]:  # one short query at a time, as /search encodes it
            t1 = time.perf_counter()
            encode([" ".join(text.split()[:8])])
            one.append(time.perf_counter() - t1)
        base = vecs if base is None else base
        cos = np.sum(vecs * base, axis=1)
        row = {"variant": name, "docs/s": round(rate, 1), "query p50 (ms)": round(1000 * float(np.median(one)), 1), "cos median": round(float(np.median(cos)), 4),
               "cos min": round(float(cos.min()), 4)}
        if args.ndcg:
            row["NFCorpus dense nDCG@10"] = round(ndcg10(encode), 2)
        rows.append(row)
    keys = list(rows[0])
    what = "NFCorpus documents" if args.source == "nfcorpus" else "TREC DL passages"
    mean = sum(len(t.split()) for t in texts) / max(len(texts), 1)
    print(f"{len(texts)} {what} ({mean:.0f} words on average), batch {args.batch_size}, {args.threads} torch threads")
    print("| " + " | ".join(keys) + " |")
    print("|" + "---|" * len(keys))
    for r in rows:
        print("| " + " | ".join(str(r.get(k, "")) for k in keys) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark: blocks encoded per second at index time, and their bytes, per store dtype.

Loads the packaged LM once, takes the first ``--docs`` NFCorpus documents, and encodes their
blocks as ``heedrank index kv build`` does (:meth:`CachedBlockRankReranker.encode_block_arrays`,
batches of ``--batch-size``) under each setting, the settings alternating for ``--rounds``
rounds in one process (the ratio is measured side by side). Prints one table: layers run per
block, blocks per second (median over rounds), and the mean payload bytes per block of the
setting's store (its codec, ``KVHeader.entry_nbytes``).

    python bench/block_encode.py [--docs 64] [--rounds 3] [--torch-threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SETTINGS = {
    "default": {},  # the default store: keys and values of layers 0..15, float16
    "int8": {"kv_dtype": "int8"},  # the same in int8: about half the bytes
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--docs", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--torch-threads", type=int, default=1)
    ap.add_argument("--settings", default="default,int8")
    args = ap.parse_args()
    import torch

    from heedrank.config import RerankerConfig
    from heedrank.data import load_beir_corpus
    from heedrank.reranker.cached import CachedBlockRankReranker
    from heedrank.reranker.lm import load_lm
    from heedrank.types import Document

    torch.set_num_threads(args.torch_threads)
    corpus = load_beir_corpus(ROOT.parent / "shared" / "data" / "beir-nfcorpus")
    rows = corpus.select(range(args.docs))
    texts = [Document(r["_id"], r["text"], r.get("title") or "").content for r in rows]
    lm = None
    rerankers = {}
    for name in args.settings.split(","):
        options = SETTINGS[name]
        config = RerankerConfig(method="blockrank-cached", max_doc_tokens=128,
                                options={**options, "query_adapter": None, "doc_batch_size": args.batch_size})
        if lm is None:
            lm = load_lm(config.model, device="cpu")
        rerankers[name] = CachedBlockRankReranker(config, lm=lm)
    times: dict[str, list[float]] = {n: [] for n in rerankers}
    nbytes: dict[str, float] = {}
    for _ in range(args.rounds):
        for name, r in rerankers.items():
            t0 = time.perf_counter()
            out = []
            for b in range(0, len(texts), args.batch_size):
                out += r.encode_block_arrays(texts[b: b + args.batch_size])
            times[name].append(time.perf_counter() - t0)
            h = r.block_store_header()
            nbytes[name] = statistics.mean(h.entry_nbytes(k.shape[2]) for _, k, _ in out)
    print("\n| setting | layers run per block | blocks/s (median) | vs default | bytes per block (mean) |")
    print("|---|---|---|---|---|")
    base = statistics.median(times.get("default", next(iter(times.values()))))
    for name, r in rerankers.items():
        med = statistics.median(times[name])
        print(f"| {name} | {r.kv_depth + 1} | {len(texts) / med:.2f} | {base / med:.2f}x | "
              f"{nbytes[name]:,.0f} |")


if __name__ == "__main__":
    main()

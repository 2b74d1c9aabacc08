"""Benchmark: the document KV store in int8 against float16: bytes per block and the nDCG@10
cost of cached BlockRank read from each, on the same queries.

Copies an index (without its store) to ``--out``, converts its float16 store to int8
(dequantise, re-quantise: per-channel keys, per-token values; no LM pass), then dumps the
study features of the same queries from both stores and prints one table (served
calibrated scorer and signal scorer, nDCG@10, and their difference).

    python bench/kv_int8.py --index ~/.cache/heedrank/indexes/beir-nfcorpus-XXXX \\
        --data ../shared/data/beir-nfcorpus --split test --candidates 50 [--max-queries 100]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path


def convert(src_index: Path, dst_index: Path) -> dict:
    """Copy ``src_index`` without its store and write an int8 copy of the store into it."""
    from tqdm import tqdm

    from heedrank.index.kv import KVHeader, KVStore

    if not dst_index.exists():
        shutil.copytree(src_index, dst_index, ignore=shutil.ignore_patterns("kv"))
    header = KVHeader.from_dict(json.loads((src_index / "kv" / "header.json").read_text()))
    src = KVStore.open(src_index / "kv", header, readonly=True, cache_bytes=0)
    dst = KVStore.open_or_create(dst_index / "kv", replace(header, dtype="int8"), cache_bytes=0)
    ids = [d for d in src.keys() if not dst.contains(d)]
    for b in tqdm(range(0, len(ids), 64), desc="int8", unit="batch"):
        found, _ = src.get_many(ids[b : b + 64])
        dst.put_many(found)
    out = {"float16": src.stats().live_bytes / max(1, len(src)), "int8": dst.stats().live_bytes / max(1, len(dst)),
           "blocks": len(dst)}
    src.close()
    dst.close()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", type=Path, required=True)
    ap.add_argument("--out", type=Path, default=Path("runs/int8-index"))
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--split", default="test")
    ap.add_argument("--retriever", default="hybrid")
    ap.add_argument("--candidates", type=int, default=50)
    ap.add_argument("--max-queries", type=int, default=None)
    ap.add_argument("--fp16-dump", type=Path, default=None, help="reuse a dump of the float16 store")
    args = ap.parse_args()
    sizes = convert(args.index.expanduser(), args.out)
    dumps = {}
    for name, index, dtype in (("float16", args.index.expanduser(), "float16"), ("int8", args.out, "int8")):
        dump = args.out.parent / f"int8-bench-{name}.npz"
        if name == "float16" and args.fp16_dump is not None:
            dump = args.fp16_dump
        else:
            cmd = [sys.executable, "-m", "heedrank", "lab", "dump", "--out", str(dump), "--data", str(args.data),
                   "--split", args.split, "--retriever", args.retriever, "--candidates", str(args.candidates),
                   "--index", str(index), "--layer", "15", "--max-doc-tokens", "128", "--kv-dtype", dtype]
            if args.max_queries:
                cmd += ["--max-queries", str(args.max_queries)]
            subprocess.run(cmd, check=True)
        dumps[name] = dump
    from heedrank.lab.study import load_items, ndcg10, variant_run

    rows = []
    for scorer in ("masked", "signal"):
        vals = {}
        for name, dump in dumps.items():
            meta, items = load_items(dump)
            keep = None
            if args.max_queries and name == "float16" and args.fp16_dump is not None:
                _, other = load_items(dumps["int8"])
                keep = {it.query_id for it in other}
                items = [it for it in items if it.query_id in keep]
            per = ndcg10(items, variant_run(items, {"kind": "feature", "name": scorer}), meta["qrels"])
            vals[name] = sum(per.values()) / len(per)
        rows.append((scorer, vals["float16"], vals["int8"], vals["int8"] - vals["float16"], len(per)))
    print(f"bytes per block: float16 {sizes['float16']:,.0f}, int8 {sizes['int8']:,.0f} "
          f"({sizes['int8'] / sizes['float16']:.2f}x), {sizes['blocks']} blocks")
    print("| scorer | float16 nDCG@10 | int8 nDCG@10 | int8 - float16 | queries |")
    print("|---|---|---|---|---|")
    for scorer, a, b, d, n in rows:
        print(f"| {scorer} | {a:.2f} | {b:.2f} | {d:+.2f} | {n} |")


if __name__ == "__main__":
    main()

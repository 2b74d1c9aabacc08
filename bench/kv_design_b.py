"""Design B of issue #23 (``shared/design/ALGORITHMS.md`` section 6): the full store (the
query block attends to the candidates at every layer) cut at a shallower deepest layer and
coded with fewer bits, converted from an existing float16 store with no LM pass.

Copies an index (without its stores) to ``--out`` and writes there a full store of layers
``0..--max-layer`` in ``--dtype`` (dequantise, slice, re-quantise), then prints its bytes
per block against the source's. The quality of the converted store is measured with the
study's dumps from it (``heedrank eval study-dump --index OUT --layer MAX --kv-dtype DTYPE
--variant NAME=0:adapter``) against the float16 features of the same queries
(``bench/probe_decide.py``).

    python bench/kv_design_b.py --index indexes/nfcorpus --out runs/design-b/int4-l9 --dtype int4 --max-layer 9
    python bench/kv_design_b.py --index indexes/nfcorpus --out indexes/nfcorpus --dtype int4 --max-layer 15 --window
        (the default configuration's window store written beside the index's full store)
"""

from __future__ import annotations

import argparse
import json
import shutil
from dataclasses import replace
from pathlib import Path


def convert_store(src_dir: Path, dst_dir: Path, dtype: str, max_layer: int, *, window: bool = False,
                  batch: int = 64) -> dict:
    """Write the full store at ``src_dir``, cut to layers ``0..max_layer`` and coded in
    ``dtype``, as a store at ``dst_dir``: a full store of layers ``0..max_layer``, or with
    ``window`` the window layout the default configuration reads (keys of ``0..max_layer``,
    values of ``0..max_layer - 1``: the deepest layer's values are never read). Resumable
    (blocks already there are skipped). Returns bytes per block of both stores and the blocks."""
    from tqdm import tqdm

    from heedrank.index.kv import KVHeader, KVStore

    header = KVHeader.from_dict(json.loads((src_dir / "header.json").read_text()))
    if header.layout != "full" or max_layer > header.layer:
        raise SystemExit(f"{src_dir} is a {header.layout} store of layers 0..{header.layer}: "
                         f"cannot cut it to 0..{max_layer}")
    want = replace(header, dtype=dtype, layer=max_layer)
    if window:
        want = replace(want, layers=tuple(range(max_layer + 1)), value_layers=tuple(range(max_layer)))
    src = KVStore.open(src_dir, header, readonly=True, cache_bytes=0)
    dst = KVStore.open_or_create(dst_dir, want, cache_bytes=0)
    ids = [d for d in src.doc_ids() if not dst.contains(d)]
    nv = want.n_value_layers
    for b in tqdm(range(0, len(ids), batch), desc=f"{dtype} 0..{max_layer}", unit="batch"):
        found, _ = src.get_many(ids[b: b + batch])
        dst.put_many({k: (kk[: max_layer + 1], vv[:nv]) for k, (kk, vv) in found.items()})
    out = {"source": src.stats().live_bytes / max(1, len(src)), "converted": dst.stats().live_bytes / max(1, len(dst)),
           "blocks": len(dst)}
    src.close()
    dst.close()
    return out


def convert(src_index: Path, dst_index: Path, dtype: str, max_layer: int, *, window: bool = False) -> dict:
    """Copy ``src_index`` without its stores, then :func:`convert_store` its full store into
    ``dst_index/kv`` (``dst_index/window`` with ``window``)."""
    if not dst_index.exists():
        shutil.copytree(src_index, dst_index, ignore=shutil.ignore_patterns("kv", "probe", "window"))
    return convert_store(src_index / "kv", dst_index / ("window" if window else "kv"), dtype, max_layer, window=window)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dtype", default="int4", choices=["float16", "int8", "int4"])
    ap.add_argument("--max-layer", type=int, required=True)
    ap.add_argument("--window", action="store_true", help="write the window layout (no values at the deepest "
                    "layer), the default configuration's store")
    ap.add_argument("--store-only", action="store_true", help="--index and --out are bare stores, not indexes")
    args = ap.parse_args()
    if args.store_only:
        sizes = convert_store(args.index.expanduser(), args.out, args.dtype, args.max_layer, window=args.window)
    else:
        sizes = convert(args.index.expanduser(), args.out, args.dtype, args.max_layer, window=args.window)
    print(f"| store | bytes per block (mean) | ratio |\n|---|---|---|\n| source | {sizes['source']:,.0f} | 1.00x |\n"
          f"| {args.dtype}, layers 0..{args.max_layer} | {sizes['converted']:,.0f} | "
          f"{sizes['source'] / sizes['converted']:.1f}x smaller | ({sizes['blocks']} blocks)")


if __name__ == "__main__":
    main()

"""Study: how the default reranker ranks when a query reads only R of each block's positions.

A read-time simulation of index-time token selection: each candidate block's stored keys and
values are read from the document KV store as today, then only ``R`` of its positions are kept, the
same positions at every layer ``0..l*``. The block's first two positions are kept as attention
sinks, and the rest of the ``R`` are ranked by a query-independent rule:

- ``norm``: the key norm, averaged over layers and KV heads;
- ``first``: the earliest positions, as a shorter block would be.

The query and ``N/A`` blocks then attend to the kept positions only (the exact two-pass path),
and the packaged card scores them, without a refit. The score is fused with the first stage at
the card's weight, and nDCG@10 is computed on the queries of a feature dump, with the same
candidates.

    python -m heedrank.lab.token_keep --dump DEV.npz --index INDEX --split dev --keep 32,64 --rules norm,first
        [--queries 160] [--bits 4x4]
    python -m heedrank.lab.token_keep --dump DL19.npz --data ../shared/data/msmarco-trec-dl-2019-passage \
        --trec-run BM25 --store /tmp/kv-dl19 --keep 64 --rules first --bits 4x4

``--bits KxV`` adds, for every variant, one whose candidate blocks' keys are rounded to ``K`` bits
per channel over the block's positions and values to ``V`` bits per position over channels
(asymmetric, min / max: what the int4 codec of tag ``exp/int4-kept-positions`` does at 4x4),
read from the int8 store.
"""

from __future__ import annotations

import argparse
import json
import logging
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

logger = logging.getLogger(__name__)

SINKS = 2
"""Leading positions of every block always kept (attention sinks)."""


def kept(keys: Sequence[Any], start: int, length: int, R: int, rule: str) -> list[int]:
    """Indices (within the context) kept of the block at ``start`` of ``length`` positions.

    Args:
        keys: Per layer, keys ``(1, kv_heads, K, head_dim)``.
    """
    import torch

    if R >= length:
        return list(range(start, start + length))
    if rule == "first":
        return list(range(start, start + R))
    norms = torch.stack([k[0, :, start: start + length].float().norm(dim=-1).mean(0) for k in keys]).mean(0)
    norms[:SINKS] = float("inf")
    top = torch.topk(norms, R).indices.sort().values
    return [start + int(i) for i in top]


def fake_quant(x: Any, bits: int, dim: int) -> Any:
    """``x`` rounded to ``bits``-bit asymmetric codes (min/max over ``dim``), dequantised."""
    import torch

    lo = x.amin(dim=dim, keepdim=True)
    hi = x.amax(dim=dim, keepdim=True)
    levels = float(2**bits - 1)
    scale = torch.where(hi > lo, (hi - lo) / levels, torch.ones_like(hi))
    return torch.clamp(torch.round((x - lo) / scale), 0, levels) * scale + lo


def requantized(kv: Sequence[tuple[Any, Any]], prompt: Any, key_bits: int, value_bits: int) -> list[tuple[Any, Any]]:
    """The context with each candidate block's keys rounded per channel over its positions and
    its values per position over channels (as a store codec would), block 0 exact."""
    out = []
    for k, v in kv:
        k, v = k.clone(), v.clone()
        start = len(prompt.instruction_ids)
        for ids in prompt.doc_ids:
            n = len(ids)
            k[:, :, start: start + n] = fake_quant(k[:, :, start: start + n], key_bits, dim=2)
            v[:, :, start: start + n] = fake_quant(v[:, :, start: start + n], value_bits, dim=3)
            start += n
        out.append((k, v))
    return out


def reduced(kv: Sequence[tuple[Any, Any]], prompt: Any, R: int | None, rule: str) -> tuple[list[tuple[Any, Any]], Any]:
    """The context and prompt with ``R`` kept positions per block (``None``: all)."""
    import torch

    L0 = len(prompt.instruction_ids)
    lengths = prompt.doc_lengths
    K = L0 + sum(lengths)
    if R is None:
        return [(k[:, :, :K], v[:, :, :K]) for k, v in kv], prompt
    keys = [k for k, _ in kv]
    index, docs, start = list(range(L0)), [], L0
    for ids, n in zip(prompt.doc_ids, lengths):
        keep = kept(keys, start, n, R, rule)
        index += keep
        docs.append([ids[i - start] for i in keep])
        start += n
    idx = torch.tensor(index)
    return [(k.index_select(2, idx), v.index_select(2, idx)) for k, v in kv], replace(prompt, doc_ids=docs)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    import torch

    from heedrank.config import RerankerConfig
    from heedrank.eval.compare import randomization_test
    from heedrank.fusion import fuse
    from heedrank.index.kv import KVStore
    from heedrank.lab.candidates import beir_candidates, trec_dl_candidates
    from heedrank.lab.study import load_items, ndcg10
    from heedrank.registry import build_reranker
    from heedrank.reranker.blockforward import calibrated_forward
    from heedrank.reranker.scoring import linear_head_scores, per_head_document_mass

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dump", required=True, help="feature dump whose queries and candidates are used")
    ap.add_argument("--data", default="../shared/data/beir-nfcorpus")
    ap.add_argument("--index", help="BEIR: the index whose filled KV store is read")
    ap.add_argument("--trec-run", help="TREC DL: the first-stage run of --data (e.g. BM25) instead of an index")
    ap.add_argument("--store", help="TREC DL: a KV store folder, filled with the blocks it lacks")
    ap.add_argument("--split", default="dev")
    ap.add_argument("--keep", default="32,64")
    ap.add_argument("--rules", default="norm,first")
    ap.add_argument("--bits", default="", help="comma list of KEYBITSxVALUEBITS (e.g. 4x4) applied to every variant")
    ap.add_argument("--only", default="", help="comma list of the variant names to run (default: all)")
    ap.add_argument("--queries", type=int, default=None)
    ap.add_argument("--out")
    args = ap.parse_args(argv)
    meta, items = load_items(args.dump)
    items = items[: args.queries] if args.queries else items
    reranker = build_reranker(RerankerConfig(method="default")).load()
    card = reranker.card
    w = torch.as_tensor(card.weights, dtype=torch.float64)
    alpha = float(card.fusion_alpha)
    if args.trec_run:
        queries, cands, _, _ = trec_dl_candidates(args.data, run_name=args.trec_run, candidates=len(items[0].doc_ids))
        store = KVStore.open_or_create(args.store, reranker.block_store_header())
    else:
        queries, cands, _, _ = beir_candidates(args.data, args.split, queries=None, candidates=len(items[0].doc_ids),
                                               seed=0, index_dir=args.index, retriever="hybrid")
        store = KVStore.open(f"{args.index}/kv", reranker.block_store_header(), readonly=True)
    text = {q.query_id: q.text for q in queries}
    variants: list[tuple[str, int | None, str]] = [("full", None, "")]
    variants += [(f"{rule}@{R}", int(R), rule) for R in args.keep.split(",") for rule in args.rules.split(",")]
    bits = [tuple(int(b) for b in x.split("x")) for x in args.bits.split(",") if x]
    variants += [(f"{name}/{kb}x{vb}", R, rule) for name, R, rule in list(variants) for kb, vb in bits]
    if args.only:
        variants = [v for v in variants if v[0] in args.only.split(",")]
    runs: dict[str, dict[str, dict[str, float]]] = {name: {} for name, _, _ in variants}
    layers = list(range(reranker.layer + 1))
    for n, it in enumerate(items):
        docs = cands[it.query_id]
        assert [d.doc_id for d in docs] == it.doc_ids, it.query_id
        prompt = reranker.build_prompt(text[it.query_id], docs)
        with reranker.lm.lock, torch.inference_mode():
            ctx = reranker.cached_context(prompt, store)
            for name, R, rule in variants:
                kv, p = reduced(ctx.kv, prompt, R, rule)
                if "/" in name:
                    kb, vb = (int(b) for b in name.split("/")[1].split("x"))
                    kv = requantized(kv, p, kb, vb)
                qo, co, _ = calibrated_forward(reranker.loaded().lm, p, reranker.layer, read_layers=layers, kv=kv,
                                               fast=False)
                feats = per_head_document_mass(qo, len(p.instruction_ids), p.doc_lengths, layers, minus=co)
                s = linear_head_scores(feats.double(), w).numpy()
                fused = fuse(it.first_stage, s, alpha)
                runs[name][it.query_id] = {d: float(x) for d, x in zip(it.doc_ids, fused)}
        if (n + 1) % 20 == 0:
            logger.info("%d/%d queries", n + 1, len(items))
    qrels = {q: g for q, g in meta["qrels"].items() if q in {it.query_id for it in items}}
    per_query = {name: ndcg10(items, run, qrels) for name, run in runs.items()}
    report = {name: float(np.mean(list(pq.values()))) for name, pq in per_query.items()}
    base = per_query[variants[0][0]]
    p_values = {name: randomization_test([pq[q] - base[q] for q in sorted(base)])
                for name, pq in per_query.items() if name != variants[0][0]}
    print(json.dumps({"ndcg@10": report, f"p against {variants[0][0]}": p_values}, indent=1))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"report": report, "p": p_values, "per_query": per_query, "queries": len(items),
                       "args": vars(args)}, fh, indent=1)
    return report


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    main()

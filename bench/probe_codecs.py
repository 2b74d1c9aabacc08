"""Codec sweep of the probe store (issue #23.2): what each way of keeping the candidates'
keys costs in bytes and in ranking quality.

For each query the probe scorer (``attend='none'``, the weights card given) runs its query
pass once; the candidates' keys at the probe layers are read exactly (float32, from the
index's full document KV store, or encoded on the fly for TREC DL), then passed through
each codec point (encoded and decoded) and scored. Per point: bytes per document (mean
over the candidates' blocks, payload only), the relative RMS error of the probe logits per
head (``q . k`` of every row and candidate token, against float32), the mean Kendall tau of
the candidates' scores against float32, and nDCG@10 of the pure and fused (card's alpha)
reranker with a paired randomization test against the float32 keys.

Codec points (``--points``, comma-separated):

* ``float16``, ``int8``, ``int4``: the store's codecs (:mod:`heedrank.index.kv.codec`);
* ``full-{c}``: every key, ``c`` = ``s{b}`` (symmetric ``b``-bit codes per channel, as the
  store's ``int{b}``) or ``a{b}`` (asymmetric: ``2^b`` levels between each channel's min and
  max over the block, a scale and an offset per channel);
* ``rank{r}-{c}``: keys taken before RoPE (the block positions are fixed, so the rotation
  is undone here and applied again at probe time) and projected per KV head on an ``r``-dim
  basis fitted for logit fidelity (the top singular vectors of ``S_q^1/2 S_k^1/2`` over the
  fit queries' rows and documents' keys: the rank-``r`` map minimising
  ``E[(q . (k - A k))^2]``), codes quantised as ``c``;
* ``top{m}-{c}``: the ``m`` tokens of each block with the largest projection on the fit
  queries' mean direction per KV head (query-agnostic, Q-Filters style), plus one
  compensation key (the mean of the dropped keys, weighted by their count), codes as ``c``.

    python bench/probe_codecs.py --data ../shared/data/beir-nfcorpus --split dev --candidates 50 \\
        --index indexes/nfcorpus --card CARD.json --out runs/probe/codecs-nf-dev.jsonl

Per-query results go to ``--out`` (JSON lines) so that an interrupted run resumes.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from pathlib import Path

import numpy as np
from tqdm.auto import tqdm

from heedrank.config import RerankerConfig
from heedrank.eval.compare import randomization_test
from heedrank.eval.heads import beir_candidates, trec_dl_candidates
from heedrank.eval.metrics import evaluate_run
from heedrank.fusion import fuse
from heedrank.registry import build_reranker

logger = logging.getLogger("bench.probe_codecs")


def rope(lm, positions):
    """``(cos, sin)`` ``(T, head_dim)`` of the LM's rotary embedding at ``positions``."""
    import torch

    x = torch.zeros(1, len(positions), 1)
    cos, sin = lm.model.base_model.rotary_emb(x, torch.tensor([list(positions)]))
    return cos[0].float(), sin[0].float()


def rotate(k, cos, sin, inverse=False):
    """RoPE (rotate-half convention) of ``k`` ``(..., T, d)``; ``inverse`` undoes it."""
    import torch

    half = k.shape[-1] // 2
    rh = torch.cat([-k[..., half:], k[..., :half]], dim=-1)
    return k * cos - rh * sin if inverse else k * cos + rh * sin


def quant(x, bits, asym=False):
    """Per-channel quantisation over tokens (axis -2) of ``x`` ``(..., T, c)``: symmetric
    (``[-(2^(b-1) - 1), 2^(b-1) - 1]`` times a scale), or asymmetric (``2^b`` levels between
    the channel's min and max: a scale and an offset per channel)."""
    import torch

    if asym:
        lo = x.amin(dim=-2, keepdim=True)
        span = x.amax(dim=-2, keepdim=True) - lo
        scale = torch.where(span > 0, span / (2 ** bits - 1), torch.ones_like(span))
        return torch.round((x - lo) / scale) * scale + lo
    top = 2 ** (bits - 1) - 1
    scale = x.abs().amax(dim=-2, keepdim=True) / top
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return torch.clamp(torch.round(x / scale), -top, top) * scale


class Basis:
    """Per (layer, KV head): the logit-fidelity projection ``A = S_q^-1/2 U U^T S_q^1/2``,
    fitted on pre-RoPE keys and pre-RoPE (per position) query rows."""

    def __init__(self):
        self.kk, self.qq, self.qmean = {}, {}, {}

    def add(self, layer, keys_pre, q_pre):  # keys_pre (kvh, n, d), q_pre (kvh, m, d)
        import torch

        kk = torch.einsum("hnd,hne->hde", keys_pre.double(), keys_pre.double())
        qq = torch.einsum("hnd,hne->hde", q_pre.double(), q_pre.double())
        qm = q_pre.double().sum(1)
        for name, v in (("kk", kk), ("qq", qq), ("qmean", qm)):
            d = getattr(self, name)
            d[layer] = d.get(layer, 0) + v

    def projector(self, layer, r):
        import torch

        out = []
        for h in range(self.kk[layer].shape[0]):
            sq = _sqrtm(self.qq[layer][h])
            sk = _sqrtm(self.kk[layer][h])
            u, _, _ = torch.linalg.svd(sq @ sk)
            U = u[:, :r]
            out.append((torch.linalg.pinv(sq) @ U, U.T @ sq))  # reconstruct = R1 @ (R2 @ k)
        return out


def _sqrtm(m):
    import torch

    w, v = torch.linalg.eigh(m)
    return (v * w.clamp_min(0).sqrt()) @ v.T


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True)
    ap.add_argument("--split", default="test")
    ap.add_argument("--retriever", default="hybrid")
    ap.add_argument("--trec-run", default=None)
    ap.add_argument("--candidates", type=int, default=50)
    ap.add_argument("--index", default=None)
    ap.add_argument("--card", required=True, help="weights card of the probe scorer (study-fit --export)")
    ap.add_argument("--adapter", default="auto", help="query_adapter option")
    ap.add_argument("--store", default=None, help="full document KV store to read exact keys from (default: "
                    "INDEX/kv; TREC DL: e.g. the scratch store of `eval study-dump --store`)")
    ap.add_argument("--max-queries", type=int, default=None)
    ap.add_argument("--fit-queries", type=int, default=40, help="first queries used to fit bases and directions")
    ap.add_argument("--points", default="float16,int8,int4,full-a4,rank32-a8,rank32-a4,rank16-a4,top64-a4,top32-a4")
    ap.add_argument("--out", required=True)
    ap.add_argument("--torch-threads", type=int, default=1)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO)
    import torch

    from heedrank.index.kv import KVStore
    from heedrank.blocks import KVHeader
    from heedrank.index.kv.codec import codec_for
    from heedrank.reranker.doccache import block_key, encode_blocks
    from heedrank.reranker.probe import probe_mass, probe_query_pass

    torch.set_num_threads(args.torch_threads)
    card = json.loads(Path(args.card).read_text())
    r = build_reranker(RerankerConfig(method="blockrank-cached", max_doc_tokens=card["max_doc_tokens"], options={
        "scorer_weights": args.card, "scoring": "learned", "query_adapter": args.adapter}))
    assert r.probe, "the card must be a probe store's (attend='none')"
    layers = list(r.probe_layers)
    w = torch.as_tensor(r.learned_weights())
    alpha = float((card.get("fusion") or {}).get("alpha", 0.6))
    if args.trec_run:
        queries, cands, first, qrels = trec_dl_candidates(args.data, run_name=args.trec_run, candidates=args.candidates,
                                                          queries=args.max_queries)
    else:
        queries, cands, first, qrels = beir_candidates(args.data, args.split, queries=args.max_queries,
                                                       candidates=args.candidates, seed=0, index_dir=args.index,
                                                       retriever=args.retriever)
    path = args.store or (Path(args.index) / "kv" if args.index else None)
    store = KVStore.open(path, CachedBlockRankReranker_header(r), readonly=True) if path else None
    points = args.points.split(",")
    L0 = len(r.layout.instruction_ids)
    kv0 = r.instruction_kv()

    def raw_keys(prompt):
        """Per candidate block: float32 keys (len(layers), kvh, T, d), after RoPE."""
        out = {}
        keys = [block_key(b) for b in prompt.doc_ids]
        if store is not None:
            found, missing = store.get_many(keys)
            for k, (kk, _) in found.items():
                out[k] = torch.from_numpy(np.asarray(kk[layers], dtype=np.float32))
        todo = [i for i, k in enumerate(keys) if k not in out]
        if todo:
            with torch.inference_mode():
                enc = encode_blocks(r.base_lm, kv0, [prompt.doc_ids[i] for i in todo], r.kv_depth, batch_size=32)
            for i, (kk, _) in zip(todo, enc):
                out[keys[i]] = kk[layers].float()
        return [out[k] for k in keys]

    done = {}
    out_path = Path(args.out)
    if out_path.exists():
        for line in out_path.read_text().splitlines():
            rec = json.loads(line)
            done[rec["query_id"]] = rec
    basis = Basis()
    T_max = r.layout.max_block_tokens
    cos, sin = rope(r.base_lm, range(L0, L0 + T_max))
    projectors = {}
    directions = {}

    def fit_add(rows, blocks):
        for i, l in enumerate(layers):
            kpre = torch.cat([rotate(b[i], cos[: b.shape[2]], sin[: b.shape[2]], inverse=True) for b in blocks], dim=1)
            q = rows.q[l]  # (H, R, d) post-RoPE at the query block's positions: undo its own rotation
            H, R, d = q.shape
            kvh = kpre.shape[0]
            qpos = r.layout.query_offset + torch.arange(R)
            qc, qs = rope(r.base_lm, qpos.tolist())
            qpre = rotate(q, qc, qs, inverse=True).reshape(kvh, (H // kvh) * R, d)
            # the query a key at block position p meets: R(p)^T R(qpos) q_pre, i.e. q_pre rotated by qpos - p;
            # sampled over 8 positions of the block
            qs_all = []
            for p in np.linspace(0, T_max - 1, 8).astype(int):
                c2, s2 = rope(r.base_lm, (qpos - (L0 + int(p))).tolist())
                qs_all.append(rotate(qpre.reshape(H, R, d), c2, s2).reshape(kvh, -1, d))
            basis.add(l, kpre, torch.cat(qs_all, dim=1))

    def encode(point, blocks):
        """Decoded keys (concatenated per layer) and a per-key bias, for one codec point."""
        bias = None
        if point in ("float16", "int8", "int4"):
            header = KVHeader("m", "v", "i", max(layers), blocks[0].shape[1], blocks[0].shape[3], T_max, dtype=point,
                              layers=tuple(layers), keys_only=True)
            codec = codec_for(header)
            dec = []
            for b in blocks:
                T, parts = codec.encode("x", b.numpy(), None)
                buf = np.concatenate([p.reshape(-1).view(np.uint8) for p in parts])
                dec.append(torch.from_numpy(codec.decode(buf, T)[0]))
            nbytes = float(np.mean([codec.nbytes(b.shape[2]) for b in blocks]))
            return {l: torch.cat([d[i] for d in dec], dim=1) for i, l in enumerate(layers)}, None, nbytes
        kind, _, code = point.partition("-")
        asym = code.startswith("a")
        bits = int(code.lstrip("aint"))
        extra = 2 if asym else 1  # scale (and offset) per channel
        keys, biases, nbytes = {l: [] for l in layers}, [], []
        for b in blocks:
            T = b.shape[2]
            total = 0
            bb = None
            for i, l in enumerate(layers):
                k = b[i]  # (kvh, T, d)
                if kind == "full":
                    keys[l].append(quant(k, bits, asym))
                    total += math.ceil(k.shape[0] * T * k.shape[2] * bits / 8) + 4 * extra * k.shape[0] * k.shape[2]
                elif kind.startswith("rank"):
                    rr = int(kind[4:])
                    kpre = rotate(k, cos[:T], sin[:T], inverse=True)
                    rec = []
                    for h, (R1, R2) in enumerate(projectors[(l, rr)]):
                        c = quant((kpre[h].double() @ R2.T), bits, asym)  # (T, r)
                        rec.append((c @ R1.T).float())
                    keys[l].append(rotate(torch.stack(rec), cos[:T], sin[:T]))
                    total += math.ceil(k.shape[0] * T * rr * bits / 8) + 4 * extra * k.shape[0] * rr
                else:  # top{m}
                    m = int(kind[3:])
                    if T <= m + 1:
                        keys[l].append(quant(k, bits, asym))
                        bb = torch.zeros(T) if bb is None else bb
                        total += math.ceil(k.shape[0] * T * k.shape[2] * bits / 8) + 4 * extra * k.shape[0] * k.shape[2]
                        continue
                    score = torch.einsum("htd,hd->t", k, directions[l])
                    keep = torch.sort(torch.topk(score, m).indices).values
                    drop = torch.ones(T, dtype=torch.bool)
                    drop[keep] = False
                    comp = k[:, drop].mean(dim=1, keepdim=True)
                    kk = quant(torch.cat([k[:, keep], comp], dim=1), bits, asym)
                    keys[l].append(kk)
                    bb = torch.cat([torch.zeros(m), torch.tensor([math.log(int(drop.sum()))])])
                    total += (math.ceil(k.shape[0] * (m + 1) * k.shape[2] * bits / 8) + 4 * extra * k.shape[0] * k.shape[2]
                              + 2 * m)
            nbytes.append(total)
            if bb is not None:
                biases.append(bb)
        cat = {l: torch.cat(keys[l], dim=1) for l in layers}
        if biases:
            bias = torch.cat(biases)
        return cat, bias, float(np.mean(nbytes))

    def lengths_of(keys_blocks, point):
        if point.startswith("top"):
            m = int(point[3:].split("-")[0])
            return [b.shape[2] if b.shape[2] <= m + 1 else m + 1 for b in keys_blocks]
        return [b.shape[2] for b in keys_blocks]

    def scores_of(rows, keys, lengths, bias):
        feats = []
        for l in layers:
            mm = probe_mass(rows, l, keys[l], lengths, bias)
            feats.append(mm[0] - mm[1])
        from heedrank.reranker.scoring import linear_head_scores

        return linear_head_scores(torch.stack(feats, dim=1).double(), w).numpy()

    need_fit = any(p not in ("float16", "int8", "int4") for p in points)
    fit_qs = queries[: args.fit_queries] if need_fit else []
    if need_fit:  # fit bases and directions on the first queries (a train-style split of the set)
        for q in tqdm(fit_qs, desc="fit", unit="query"):
            prompt = r.build_prompt(q.text, cands[q.query_id])
            blocks = raw_keys(prompt)
            with torch.inference_mode():
                rows = probe_query_pass(r.lm, prompt, kv0, layers)
            fit_add(rows, blocks)
        for l in layers:
            for p in points:
                if p.startswith("rank"):
                    rr = int(p[4:].split("-")[0])
                    projectors[(l, rr)] = basis.projector(l, rr)
            directions[l] = (basis.qmean[l] / basis.qmean[l].norm(dim=-1, keepdim=True)).float()
    fitted = {q.query_id for q in fit_qs}
    with out_path.open("a") as fh:
        for q in tqdm([q for q in queries if q.query_id not in done and q.query_id not in fitted], desc="codecs",
                      unit="query"):
            docs = cands[q.query_id]
            prompt = r.build_prompt(q.text, docs)
            blocks = raw_keys(prompt)
            lengths = [b.shape[2] for b in blocks]
            with torch.inference_mode():
                rows = probe_query_pass(r.lm, prompt, kv0, layers)
                exact = {l: torch.cat([b[i] for b in blocks], dim=1) for i, l in enumerate(layers)}
                ref = scores_of(rows, exact, lengths, None)
                rec = {"query_id": q.query_id, "doc_ids": [d.doc_id for d in docs], "first": list(first[q.query_id]),
                       "float32": ref.tolist(), "points": {}}
                for p in points:
                    keys, bias, nbytes = encode(p, blocks)
                    s = scores_of(rows, keys, lengths_of(blocks, p), bias)
                    err = []
                    if not p.startswith("top"):
                        for l in layers:
                            qg = rows.q[l]
                            H, R, d = qg.shape
                            kvh = exact[l].shape[0]
                            z0 = torch.matmul(qg.reshape(kvh, -1, d), exact[l].transpose(-1, -2)).reshape(H, -1)
                            z1 = torch.matmul(qg.reshape(kvh, -1, d), keys[l].transpose(-1, -2)).reshape(H, -1)
                            err.append(((z1 - z0).pow(2).mean(1).sqrt() / z0.std(1)).tolist())
                    rec["points"][p] = {"scores": s.tolist(), "bytes": nbytes, "logit_rel_rmse": err}
            fh.write(json.dumps(rec) + "\n")
            fh.flush()
            done[q.query_id] = rec
    summarize(done, qrels, points, alpha)


def CachedBlockRankReranker_header(probe_reranker):
    """The full store header the index's store was built with (the probe reranker's model and
    layout, ``l* = layer``, float16, keys and values)."""
    from dataclasses import replace

    h = probe_reranker.block_store_header()
    return replace(h, layer=probe_reranker.layer, layers=None, keys_only=False, dtype="float16")


def summarize(done, qrels, points, alpha) -> None:
    from scipy.stats import kendalltau

    def run_of(key):
        out = {}
        for qid, rec in done.items():
            s = rec["float32"] if key == "float32" else rec["points"][key]["scores"]
            out[qid] = dict(zip(rec["doc_ids"], s))
        return out

    def fused_of(key):
        out = {}
        for qid, rec in done.items():
            s = rec["float32"] if key == "float32" else rec["points"][key]["scores"]
            out[qid] = dict(zip(rec["doc_ids"], fuse(np.asarray(rec["first"]), np.asarray(s), alpha).tolist()))
        return out

    def per_query(run):
        ev = evaluate_run(run, qrels, ["nDCG@10"], query_ids=sorted(run))
        return {q: {"ndcg_cut_10": v["nDCG@10"]} for q, v in ev.per_query.items()}

    base_p = per_query(run_of("float32"))
    grid = {}
    for a in np.linspace(0.0, 1.0, 11):  # the fusion weight this set would choose (use on dev only)
        run = {qid: dict(zip(rec["doc_ids"], fuse(np.asarray(rec["first"]), np.asarray(rec["float32"]), a).tolist()))
               for qid, rec in done.items()}
        grid[round(float(a), 1)] = np.mean([v["ndcg_cut_10"] for v in per_query(run).values()]) * 100
    best_a = max(grid, key=grid.get)
    print(f"fusion weight this set would choose (float32 keys): {best_a} ({grid[best_a]:.2f}); "
          + ", ".join(f"{a}: {v:.2f}" for a, v in grid.items()))
    base_f = per_query(fused_of("float32"))
    print(f"queries: {len(done)}; fusion alpha {alpha}")
    print("| point | bytes / doc | logit rel. RMSE (mean over heads) | Kendall tau vs float32 | pure nDCG@10 (delta, p) "
          "| fused nDCG@10 (delta, p) |")
    print("|---|---|---|---|---|---|")
    mp = np.mean([v["ndcg_cut_10"] for v in base_p.values()]) * 100
    mf = np.mean([v["ndcg_cut_10"] for v in base_f.values()]) * 100
    print(f"| float32 (exact) | - | 0 | 1 | {mp:.2f} | {mf:.2f} |")
    for p in points:
        pp, pf = per_query(run_of(p)), per_query(fused_of(p))
        dp = [pp[q]["ndcg_cut_10"] - base_p[q]["ndcg_cut_10"] for q in base_p]
        df = [pf[q]["ndcg_cut_10"] - base_f[q]["ndcg_cut_10"] for q in base_f]
        taus = [kendalltau(rec["float32"], rec["points"][p]["scores"])[0] for rec in done.values()]
        errs = [np.mean(rec["points"][p]["logit_rel_rmse"]) for rec in done.values() if rec["points"][p]["logit_rel_rmse"]]
        nbytes = np.mean([rec["points"][p]["bytes"] for rec in done.values()])
        err_s = f"{np.mean(errs):.4f}" if errs else "-"
        print(f"| {p} | {nbytes:,.0f} | {err_s} | {np.nanmean(taus):.4f} | {mp + np.mean(dp) * 100:.2f} "
              f"({np.mean(dp) * 100:+.2f}, p {randomization_test(dp):.3f}) | {mf + np.mean(df) * 100:.2f} "
              f"({np.mean(df) * 100:+.2f}, p {randomization_test(df):.3f}) |")


if __name__ == "__main__":
    main()

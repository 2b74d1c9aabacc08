"""Issue #24 lever 5 (first step): a fusion weight predicted per query instead of the fixed
one, from what both stages already have (the Cosine Adapter idea: a query-dependent map of
the scores; here the map is the weight ``alpha(q)`` of ``alpha z(first stage) + (1 - alpha)
z(reranker)``).

For every query of a study dump (``heedrank eval study-dump``) the pure reranker's scores
are the weights card's (``--card``) on the dump's ``calibrated@--features`` features, and
nDCG@10 is computed for alpha on a grid of 0.05. The per-query features are the query's
length in words, the standard deviation and top-1/top-2 gap of each stage's raw scores, and
the agreement of the two rankings (Spearman correlation, overlap of their top 10). The model
is ``alpha(q) = clip(alpha_0 + w . standardised features, 0, 1)``; it is fitted on the
training dumps by maximising the mean nDCG@10 over queries (Nelder-Mead from the fixed
weight, each trial read off the grid), with ``w``'s L1 shrinkage chosen on dev among a few
values; a model that does not beat the fixed weight on dev is not used (the fixed weight is
one of the candidates). Prints dev and test nDCG@10 of the fixed weight and of the chosen
model, with the paired randomization test of their difference.

    python bench/fusion_query.py --card reranker/data/smollm2-135m-instruct.blockrank-cached.json \\
        --features qa --train runs/probe/qa-nf-train.npz --train runs/probe/qa-dl21.npz \\
        --dev runs/probe/nf-dev-hybrid50.npz --test nf-hybrid50=runs/probe/nf-test-hybrid50.npz
"""

from __future__ import annotations

import argparse
import json
import logging

import numpy as np

from heedrank.eval.study import load_items, ndcg10, variant_run, with_features

logger = logging.getLogger("bench.fusion_query")
GRID = np.round(np.linspace(0.0, 1.0, 21), 2)
FEATURES = ("query_words", "first_std", "first_gap", "rerank_std", "rerank_gap", "spearman", "overlap10")


def pure_scores(items, card) -> dict[str, np.ndarray]:
    layers = card.get("layers") or list(range(int(card["layer"]) + 1))
    v = {"kind": "linear", "spec": "heads", "weights": card["weights"], "layers": layers}
    run = variant_run(items, v)
    return {it.query_id: np.array([run[it.query_id][d] for d in it.doc_ids]) for it in items}


def z(x: np.ndarray) -> np.ndarray:
    s = x.std()
    return (x - x.mean()) / s if s > 0 else np.zeros_like(x)


def table(items, card, qrels, texts) -> tuple[list[str], np.ndarray, np.ndarray]:
    """``(query ids, features (Q, F), nDCG@10 x100 on the alpha grid (Q, len(GRID)))`` over
    every query of ``qrels`` (one without candidates scores 0 at every alpha; its features
    are the training means)."""
    pure = pure_scores(items, card)
    by = {it.query_id: it for it in items}
    zs = {}
    feats = {}
    for it in items:
        f = np.asarray(it.first_stage, dtype=np.float64)
        r = pure[it.query_id]
        zs[it.query_id] = (z(f), z(r))
        fs, rs = np.sort(f)[::-1], np.sort(r)[::-1]
        rf, rr = np.argsort(np.argsort(-f)), np.argsort(np.argsort(-r))
        top_f, top_r = set(np.argsort(-f)[:10].tolist()), set(np.argsort(-r)[:10].tolist())
        feats[it.query_id] = [len(texts.get(it.query_id, "").split()), f.std(), (fs[0] - fs[1]) / (f.std() or 1),
                              r.std(), (rs[0] - rs[1]) / (r.std() or 1), float(np.corrcoef(rf, rr)[0, 1]),
                              len(top_f & top_r) / 10]
    cols = []
    for a in GRID:
        run = {q: {d: float(x) for d, x in zip(by[q].doc_ids, a * zf + (1 - a) * zr)} for q, (zf, zr) in zs.items()}
        cols.append(ndcg10(items, run, qrels))
    ids = sorted(cols[0])
    mean = np.mean(list(feats.values()), axis=0)
    X = np.asarray([feats.get(q, mean) for q in ids], dtype=np.float64)
    G = np.asarray([[c[q] for c in cols] for q in ids], dtype=np.float64)
    return ids, X, G


def predict(params: np.ndarray, X: np.ndarray) -> np.ndarray:
    return np.clip(params[0] + X @ params[1:], 0.0, 1.0)


def mean_ndcg(alpha: np.ndarray, G: np.ndarray) -> float:
    """Mean nDCG@10 at each query's alpha, linearly interpolated on the grid."""
    pos = alpha * (len(GRID) - 1)
    lo = np.floor(pos).astype(int).clip(0, len(GRID) - 1)
    hi = np.minimum(lo + 1, len(GRID) - 1)
    t = pos - lo
    rows = np.arange(len(G))
    return float(((1 - t) * G[rows, lo] + t * G[rows, hi]).mean())


def per_query(alpha: np.ndarray, G: np.ndarray) -> np.ndarray:
    idx = np.rint(alpha * (len(GRID) - 1)).astype(int)
    return G[np.arange(len(G)), idx]


def main() -> None:
    from scipy.optimize import minimize

    from heedrank.data import load_beir_queries
    from heedrank.eval.compare import randomization_test

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--card", required=True)
    ap.add_argument("--features", default="qa")
    ap.add_argument("--train", action="append", required=True)
    ap.add_argument("--dev", required=True)
    ap.add_argument("--test", action="append", default=[], help="NAME=DUMP")
    ap.add_argument("--exclude", action="append", default=[], help="a dump whose queries are left out of training "
                    "(the reranker's own training queries: its scores there are optimistic)")
    ap.add_argument("--fixed", type=float, default=None, help="the fixed weight (default: the card's fusion alpha)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO)
    card = json.load(open(args.card))
    fixed = args.fixed if args.fixed is not None else float(card.get("fusion", {}).get("alpha", 0.6))

    seen = {it.query_id for p in args.exclude for it in load_items(p)[1]}

    def load(path, drop=(), dumped_only=False):
        meta, items = load_items(path)
        items = [it for it in with_features(items, args.features) if it.query_id not in drop]
        keep = {it.query_id for it in items}
        meta["qrels"] = {q: r for q, r in meta["qrels"].items() if q not in drop and (q in keep or not dumped_only)}
        texts = {}
        data = meta.get("data")
        if data:
            try:
                texts = {q: getattr(v, "text", v) for q, v in load_beir_queries(data).items()}
            except Exception:  # noqa: BLE001 - TREC DL folders: query length unknown (0)
                texts = {}
        return table(items, card, meta["qrels"], texts)

    train = [load(p, seen, dumped_only=True) for p in args.train]  # a partial (resumed) dump: its queries so far
    logger.info("training queries: %d (%d excluded)", sum(len(t[0]) for t in train), len(seen))
    Xtr = np.concatenate([t[1] for t in train])
    Gtr = np.concatenate([t[2] for t in train])
    mu, sd = Xtr.mean(0), Xtr.std(0)
    sd[sd == 0] = 1
    dev_ids, Xdev, Gdev = load(args.dev)
    norm = lambda X: (X - mu) / sd  # noqa: E731
    candidates = {"fixed": np.array([fixed] + [0.0] * len(FEATURES))}
    for l1 in (0.0, 0.1, 0.3, 1.0, 3.0):
        def loss(p, l1=l1):
            return -mean_ndcg(predict(p, norm(Xtr)), Gtr) + l1 * np.abs(p[1:]).sum()
        res = minimize(loss, candidates["fixed"], method="Nelder-Mead", options={"maxiter": 4000, "xatol": 1e-4,
                                                                                "fatol": 1e-6})
        candidates[f"l1={l1}"] = res.x
    dev_scores = {k: mean_ndcg(predict(p, norm(Xdev)), Gdev) for k, p in candidates.items()}
    best = max(dev_scores, key=lambda k: (dev_scores[k], k == "fixed"))
    print("| model | train | dev |\n|---|---|---|")
    for k, p in candidates.items():
        print(f"| {k} | {mean_ndcg(predict(p, norm(Xtr)), Gtr):.2f} | {dev_scores[k]:.2f} |")
    print(f"\nchosen on dev: {best}; weights (standardised features {FEATURES}): "
          f"{np.round(candidates[best], 3).tolist()}")
    out = {"chosen": best, "params": candidates[best].tolist(), "features": FEATURES, "mu": mu.tolist(),
           "sd": sd.tolist(), "dev": dev_scores}
    print("\n| set | fixed alpha | per-query alpha (chosen) | delta (p) | mean alpha |\n|---|---|---|---|---|")
    sets = [("dev", (dev_ids, Xdev, Gdev))] + [(t.split("=", 1)[0], load(t.split("=", 1)[1])) for t in args.test]
    for name, (ids, X, G) in sets:
        a_fixed = np.full(len(G), fixed)
        a_q = predict(candidates[best], norm(X))
        x, y = per_query(a_fixed, G), per_query(a_q, G)
        p = randomization_test(y - x)
        print(f"| {name} ({len(G)} q) | {x.mean():.2f} | {y.mean():.2f} | {(y - x).mean():+.2f} "
              f"(p {p:.3f}) | {a_q.mean():.2f} |")
        out[name] = {"fixed": x.mean(), "per_query": y.mean(), "p": p}
    oracle = [(name, G.max(1).mean()) for name, (_, _, G) in sets]
    print("\n(per-query oracle alpha, the ceiling: " + ", ".join(f"{n} {v:.2f}" for n, v in oracle) + ")")
    if args.out:
        json.dump(out, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()

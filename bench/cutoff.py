"""Issue #24 lever 5 (the cut-off, first step): the served fused score calibrated to a
probability of relevance, and one global threshold on it, against the best fixed top-k.

For every query of a study dump the fused score is today's ``alpha z(first stage) + (1 -
alpha) z(reranker)`` (the weights card's head weights on ``calibrated@--features``, its
alpha). A logistic map (Platt scaling, Platt 1999) of ``(fused score, its rank, the query's
top fused score)`` to ``P(relevant)`` is fitted on the calibration dumps (``--calibrate``:
queries the reranker was not trained on); the threshold on it (``"auto"``) and the best fixed
top-k are both chosen on dev for the mean F1; both are then applied to each test dump.
Per query: precision, recall (of every judged relevant document in the qrels, grade > 0)
and F1 of the returned set (an empty set has precision 1 and F1 0 when the query has a
relevant document). Prints one table per set and the calibration's Brier score.

    python bench/cutoff.py --card reranker/data/smollm2-135m-instruct.blockrank-cached.json --features qa \\
        --calibrate runs/study24/nf-train-all-qa.npz --exclude runs/probe/qa-nf-train.npz \\
        --dev runs/probe/nf-dev-hybrid50.npz --test nf-hybrid50=runs/probe/nf-test-hybrid50.npz
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from attnrank.eval.study import load_items, variant_run, with_features


def fused(items, card) -> dict[str, np.ndarray]:
    layers = card.get("layers") or list(range(int(card["layer"]) + 1))
    v = {"kind": "linear", "spec": "heads", "weights": card["weights"], "layers": layers}
    alpha = float(card.get("fusion", {}).get("alpha", 0.6))
    run = variant_run(items, {"kind": "interpolate", "alpha": alpha, "of": v})
    return {it.query_id: np.array([run[it.query_id][d] for d in it.doc_ids]) for it in items}


def rows(items, card, qrels):
    """Per query ``(doc ids sorted by fused score, features (N, 3), labels (N,) 0/1, relevant in qrels)``."""
    s = fused(items, card)
    out = {}
    for it in items:
        x = s[it.query_id]
        order = np.argsort(-x, kind="stable")
        xs = x[order]
        rel = {d for d, g in qrels.get(it.query_id, {}).items() if g > 0}
        docs = [it.doc_ids[i] for i in order]
        f = np.stack([xs, np.log1p(np.arange(len(xs))), np.full(len(xs), xs[0])], axis=1)
        out[it.query_id] = (docs, f, np.array([d in rel for d in docs], dtype=np.float64), len(rel))
    for q, r in qrels.items():  # judged queries without candidates: nothing returned
        if q not in out and any(g > 0 for g in r.values()):
            out[q] = ([], np.zeros((0, 3)), np.zeros(0), sum(g > 0 for g in r.values()))
    return out


def prf(sel: np.ndarray, labels: np.ndarray, n_rel: int) -> tuple[float, float, float]:
    tp = float(labels[sel].sum())
    k = int(sel.sum())
    p = tp / k if k else 1.0
    r = tp / n_rel if n_rel else 1.0
    f = 2 * p * r / (p + r) if p + r and tp else 0.0
    return p, r, f


def per_query(data, choose) -> np.ndarray:
    """(P, R, F1, returned) per query (sorted ids), ``choose(features, n) -> bool mask``."""
    vals = []
    for q in sorted(data):
        docs, f, y, n_rel = data[q]
        sel = choose(f, len(docs)) if len(docs) else np.zeros(0, dtype=bool)
        vals.append((*prf(sel, y, n_rel), sel.sum()))
    return np.asarray(vals)


def evaluate(data, choose) -> np.ndarray:
    """Mean (P, R, F1, returned) over queries."""
    return per_query(data, choose).mean(0)


def main() -> None:
    from sklearn.linear_model import LogisticRegression

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--card", required=True)
    ap.add_argument("--features", default="qa")
    ap.add_argument("--calibrate", action="append", required=True)
    ap.add_argument("--exclude", action="append", default=[])
    ap.add_argument("--dev", required=True)
    ap.add_argument("--test", action="append", default=[], help="NAME=DUMP")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    card = json.load(open(args.card))
    seen = {it.query_id for p in args.exclude for it in load_items(p)[1]}

    def load(path, drop=frozenset()):
        meta, items = load_items(path)
        items = [it for it in with_features(items, args.features) if it.query_id not in drop]
        return rows(items, card, {q: r for q, r in meta["qrels"].items() if q not in drop})

    cal = {}
    for p in args.calibrate:
        cal.update({q: r for q, r in load(p, seen).items() if len(r[1])})  # queries dumped so far
    X = np.concatenate([f for _, f, _, _ in cal.values()])
    Y = np.concatenate([y for _, _, y, _ in cal.values()])
    model = LogisticRegression(C=1.0, max_iter=1000).fit(X, Y)
    prob = lambda f: model.predict_proba(f)[:, 1] if len(f) else np.zeros(0)  # noqa: E731
    dev = load(args.dev)
    ks = list(range(1, 51))
    topk = {k: evaluate(dev, lambda f, n, k=k: np.arange(n) < k)[2] for k in ks}
    k_best = max(topk, key=topk.get)
    ts = np.round(np.linspace(0.02, 0.9, 45), 3)
    thr = {t: evaluate(dev, lambda f, n, t=t: prob(f) >= t)[2] for t in ts}
    t_best = max(thr, key=thr.get)
    Xd = np.concatenate([f for _, f, _, _ in dev.values() if len(f)])
    Yd = np.concatenate([y for _, f, y, _ in dev.values() if len(f)])
    brier = float(np.mean((prob(Xd) - Yd) ** 2))
    print(f"calibration: {sum(1 for _, f, _, _ in cal.values() if len(f))} queries, {len(Y)} candidates; dev Brier {brier:.4f} "
          f"(base rate {Yd.mean():.3f}: {float(np.mean((Yd.mean() - Yd) ** 2)):.4f})")
    print(f"dev choices: top-k k={k_best}; threshold P >= {t_best}\n")
    from attnrank.eval.compare import randomization_test

    print("| set | best fixed top-k (k from dev): P / R / F1 | cut-off 'auto': P / R / F1 / mean hits returned | "
          "F1 delta (p) |")
    print("|---|---|---|---|")
    report = {"k": k_best, "threshold": t_best, "brier_dev": brier,
              "coef": model.coef_.tolist(), "intercept": model.intercept_.tolist()}
    for name, data in [("dev", dev)] + [(t.split("=", 1)[0], load(t.split("=", 1)[1])) for t in args.test]:
        pa = per_query(data, lambda f, n: np.arange(n) < k_best)
        pb = per_query(data, lambda f, n: prob(f) >= t_best)
        a, b = pa.mean(0), pb.mean(0)
        p = randomization_test(pb[:, 2] - pa[:, 2])
        print(f"| {name} ({len(data)} q) | {100 * a[0]:.1f} / {100 * a[1]:.1f} / **{100 * a[2]:.1f}** | "
              f"{100 * b[0]:.1f} / {100 * b[1]:.1f} / **{100 * b[2]:.1f}** / {b[3]:.1f} | "
              f"{100 * (b[2] - a[2]):+.1f} (p {p:.3f}) |")
        report[name] = {"topk": a.tolist(), "auto": b.tolist()}
    if args.out:
        json.dump(report, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    main()

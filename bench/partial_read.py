"""Benchmark: the default's scorer on a list the LM read only in part, from captured signals.

Serves NFCorpus test (hybrid top ``--candidates``) through the product twice, recording what
:meth:`heedrank.serving.ScorerServing.serve` receives per query (the candidates and their signal
matrix: the attention log-odds of those the LM read, the dense cosines): once from ``--index``
(every candidate read; its store full, or filled by this run) and once from ``--budgeted-index`` (a store under a disk
budget, e.g. ``bench/tiered_store.py``'s ``OUT/ix`` after its stream, read with the service's
recompute budget of ``--cold-budget`` blocks). Then re-scores the captured signals offline with the
installed card's scorer, so the combination rules compare on identical inputs, nDCG@10 x 100:

- which candidates carry attention: none, the budgeted store's (as served), the same number drawn
  at random per query, every one;
- how: the attention model for those with attention and the model without it for the others
  (``A`` / ``N``), the step form (``N + A - B``, :meth:`heedrank.scorer.Scorer.logit` with
  ``step``), and a half blend ``N + 0.5 (A - N)``;
- and the product's own rule (:meth:`heedrank.serving.ScorerServing.serve`: the step form
  in a list read in part, ``A`` in a list read whole), paired against no attention, and against the
  first stage alone and the embedder alone on the same candidates;
- and each model's mean predicted probability against the base rate (calibration).

Captures are cached under ``--out``. With ``--drop-prefix x`` (a ``bench/scale_corpus.py`` index,
whose distractors' ids start with ``x``) the table is printed a second time with those documents
removed from every ranking before nDCG@10 (a condensed list: what the ranking does with the real
documents alone), with the mean number of them in each top 10.

    python bench/partial_read.py --index indexes/nfcorpus --budgeted-index runs/tiered/ix [--out runs/partial]
        [--drop-prefix x]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def capture(index: Path, cold_budget: int | None, candidates: int) -> dict[str, Any]:
    """``{query_id: {"cands", "att", "dense"}}`` of one NFCorpus test run through the product."""
    sys.path.insert(0, str(ROOT / "bench"))
    import tiered_store

    from heedrank.config import PipelineConfig, RerankerConfig
    from heedrank.pipeline import Pipeline
    from heedrank.serving import ScorerServing
    from heedrank.signals.attention import NAME as ATTENTION
    from heedrank.signals.dense import NAME as DENSE

    got: dict[str, Any] = {}
    orig = ScorerServing.serve

    def recording(self, cands, X, cutoff):  # type: ignore[no-untyped-def]
        col = {f: X[:, j] for j, f in enumerate(self.features)}

        def of(name: str) -> dict[str, float]:
            values = col.get(name)
            return {} if values is None else {h.doc_id: float(v) for h, v in zip(cands.hits, values) if v == v}

        got[cands.query_id] = {"cands": [h.doc_id for h in cands.hits], "att": of(ATTENTION), "dense": of(DENSE)}
        return orig(self, cands, X, cutoff)

    ScorerServing.serve = recording  # type: ignore[method-assign]
    try:
        pipe = Pipeline.from_config(PipelineConfig(index_dir=str(index), reranker=RerankerConfig(method="default")))
        tiered_store.nf_test_run(pipe, cold_budget, retriever="hybrid", candidates=candidates)
        pipe.close()
    finally:
        ScorerServing.serve = orig  # type: ignore[method-assign]
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", type=Path, required=True, help="an NFCorpus index with a full store")
    ap.add_argument("--budgeted-index", type=Path, required=True, help="the same index with a budgeted store")
    ap.add_argument("--cold-budget", type=int, default=4)
    ap.add_argument("--candidates", type=int, default=50)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "partial")
    ap.add_argument("--drop-prefix", help="also score each ranking with the documents of this id prefix removed")
    args = ap.parse_args()
    import ir_measures
    import torch

    torch.set_num_threads(2)
    from heedrank.data import load_beir_qrels
    from heedrank.scorer import Scorer
    from heedrank.signals.rank import feature as rank_feature

    args.out.mkdir(parents=True, exist_ok=True)
    caps = {}
    # the budgeted capture first: with one index for both (its store after a stream), the full
    # capture's cold blocks would otherwise be read by the budgeted one
    for name, index, cold in (("budgeted", args.budgeted_index, args.cold_budget), ("full", args.index, None)):
        path = args.out / f"{name}.json"
        if not path.exists():
            path.write_text(json.dumps(capture(index, cold, args.candidates)))
        caps[name] = json.loads(path.read_text())
    full, budgeted = caps["full"], caps["budgeted"]
    card = json.loads((ROOT / "reranker" / "data" / "smollm2-135m-instruct.blockrank-cached.json").read_text())
    scorer = Scorer.from_card(card)
    assert scorer is not None
    qrels = load_beir_qrels(ROOT.parent / "shared" / "data" / "beir-nfcorpus", "test")

    def features(r: dict[str, Any], i: int, d: str) -> dict[str, float]:
        x = {"dense": r["dense"].get(d), "rank": rank_feature(i)}
        return {k: v for k, v in x.items() if v is not None}

    def rescored(mask: Any, rule: str) -> dict[str, dict[str, float]]:
        run: dict[str, dict[str, float]] = {}
        for q, r in full.items():
            have, out = mask(q, r) & set(r["att"]), {}
            # the product's rule: the step form in a list read in part, A in one read whole
            form = ("step" if len(have) < len(r["cands"]) else "A") if rule == "product" else rule
            for i, d in enumerate(r["cands"]):
                x = features(r, i, d)
                n = scorer.logit(x)[0]  # type: ignore[index]
                if d not in have:
                    out[d] = n
                    continue
                xa = {**x, "attention": r["att"][d]}
                a = scorer.model_for(list(xa)).logit(xa)  # type: ignore[union-attr]
                out[d] = {"A": a, "step": scorer.logit(xa, step=True)[0],  # type: ignore[index]
                          "half": n + 0.5 * (a - n)}[form]
            run[q] = out
        return run

    def per_query(run: dict[str, dict[str, float]], drop: str | None) -> dict[str, float]:
        if drop:
            run = {q: {d: s for d, s in r.items() if not d.startswith(drop)} for q, r in run.items()}
        return {m.query_id: 100 * m.value for m in ir_measures.iter_calc([ir_measures.nDCG @ 10], qrels, run)}

    def ndcg(run: dict[str, dict[str, float]], drop: str | None) -> float:
        return statistics.fmean(per_query(run, drop).values())

    def paired_p(run: dict[str, dict[str, float]], base: dict[str, dict[str, float]], drop: str | None) -> float:
        a, b = per_query(run, drop), per_query(base, drop)
        diffs = [a[q] - b[q] for q in sorted(a.keys() & b.keys())]
        rng, observed = random.Random(0), abs(sum(diffs))
        hits = sum(abs(sum(d if rng.random() < 0.5 else -d for d in diffs)) >= observed - 1e-9 for _ in range(5000))
        return (hits + 1) / 5001

    def dropped_in_top10(run: dict[str, dict[str, float]], drop: str) -> float:
        return statistics.fmean(sum(d.startswith(drop) for d, _ in sorted(r.items(), key=lambda kv: (-kv[1], kv[0]))[:10])
                                for r in run.values())

    masks = {"none": lambda q, r: set(),
             "as served (the budgeted store's)": lambda q, r: set(budgeted[q]["att"]),
             "as many, at random": lambda q, r: set(random.Random(q).sample(r["cands"], len(budgeted[q]["att"]))),
             "every one": lambda q, r: set(r["att"])}
    share = sum(len(r["att"]) for r in budgeted.values()) / sum(len(r["cands"]) for r in budgeted.values())
    print(f"NFCorpus test ({len(full)} queries, hybrid top {args.candidates}); the budgeted store read {share:.1%} "
          "of the candidates; nDCG@10 x 100\n")
    rules = ("A", "step", "half", "product")
    runs = {(name, rule): rescored(mask, rule) for name, mask in masks.items() for rule in rules}
    head = ("| candidates with attention | A / N | step N + A - B | half N + 0.5 (A - N) | the product's rule | "
            "its paired p against none |\n|---|---|---|---|---|---|")
    for drop in (None, args.drop_prefix) if args.drop_prefix else (None,):
        if drop:
            print(f"\nthe same rankings with the documents of id prefix {drop!r} removed (in brackets: how many of "
                  "them each top 10 held, mean)\n")
        print(head)
        for name in masks:
            cells = [f"{ndcg(runs[name, rule], drop):.2f}" + (f" ({dropped_in_top10(runs[name, rule], drop):.2f})"
                                                              if drop else "") for rule in rules]
            p = paired_p(runs[name, "product"], runs["none", "A"], drop) if name != "none" else float("nan")
            print(f"| {name} | " + " | ".join(cells) + f" | {p:.3f} |")
    # the strongest single signals on the same candidates: the first stage's order, the embedder alone
    alone = {"first stage alone": {q: {d: -float(i) for i, d in enumerate(r["cands"])} for q, r in full.items()},
             "embedder alone": {q: {d: r["dense"].get(d, -2.0) for d in r["cands"]} for q, r in full.items()}}
    for drop in (None, args.drop_prefix) if args.drop_prefix else (None,):
        print(f"\nagainst the single signals{f' (prefix {drop!r} removed)' if drop else ''}: the product's rule as "
              "served and with every candidate read, paired\n\n| ranking | nDCG@10 | as served - it | p | every one "
              "read - it | p |\n|---|---|---|---|---|---|")
        served, every = runs["as served (the budgeted store's)", "product"], runs["every one", "product"]
        for name, run in alone.items():
            base = ndcg(run, drop)
            print(f"| {name} | {base:.2f} | {ndcg(served, drop) - base:+.2f} | {paired_p(served, run, drop):.3f} | "
                  f"{ndcg(every, drop) - base:+.2f} | {paired_p(every, run, drop):.3f} |")
    sig = lambda v: 1 / (1 + 2.718281828459045 ** -v)  # noqa: E731
    rows = [(q, d, i) for q, r in full.items() for i, d in enumerate(r["cands"])
            if d in r["att"] and d in r["dense"]]
    rate = statistics.fmean(1.0 if qrels.get(q, {}).get(d, 0) >= 1 else 0.0 for q, d, _ in rows)
    print(f"\ncalibration on {len(rows)} candidates with every signal (base rate {rate:.3f}):\n\n"
          "| model | mean probability |\n|---|---|")
    for with_att in (True, False):
        ps = []
        for q, d, i in rows:
            x = features(full[q], i, d)
            if with_att:
                x["attention"] = full[q]["att"][d]
            ps.append(sig(scorer.logit(x)[0]))  # type: ignore[index]
        model = scorer.model_for(list(x))
        print(f"| {' + '.join(model.uses)} | {statistics.fmean(ps):.3f} |")  # type: ignore[union-attr]


if __name__ == "__main__":
    main()

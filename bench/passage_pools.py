"""Passage blocks: how a document's score should pool its passages' scores, on NFCorpus dev.

Each query's first-stage candidates (hybrid top ``--candidates``) become their passage blocks
(:func:`heedrank.reranker.cached.passages.expand`, at most ``--passages`` per document), the
default reranker scores every passage in one prompt (the store keeps the blocks), and the
passage scores are saved (``--scores``, JSON; resumable: a saved query is not scored again).
Then every pool is served as the service serves it (fused with the first stage at the card's
weight, z-scores over the candidates) and judged by nDCG@10 on the split's qrels:

- ``first``: the first passage only (the document's usual block, scored beside its other passages);
- ``max``: the best passage (MaxP, what ``--opt passages=N`` serves);
- ``mean``: the mean of its passages;
- ``first + b (max - first)``: between the two.

    python bench/passage_pools.py --index indexes/nfcorpus --scores runs/eval33p/pools-dev.json
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", type=Path, required=True)
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data" / "beir-nfcorpus")
    ap.add_argument("--split", default="dev")
    ap.add_argument("--candidates", type=int, default=50)
    ap.add_argument("--passages", type=int, default=3)
    ap.add_argument("--scores", type=Path, required=True)
    args = ap.parse_args()

    import ir_measures
    from ir_measures import nDCG
    from tqdm.auto import tqdm

    from heedrank.config import PipelineConfig, RerankerConfig
    from heedrank.data import load_beir_qrels, load_beir_queries
    from heedrank.fusion import combine, standardize_list
    from heedrank.pipeline import Pipeline, SearchOptions
    from heedrank.reranker.cached.passages import expand

    qrels = load_beir_qrels(args.data, args.split)
    queries = [q for qid, q in sorted(load_beir_queries(args.data).items()) if qid in qrels]
    pipe = Pipeline.from_config(PipelineConfig(index_dir=str(args.index), reranker=RerankerConfig(method="default")))
    reranker = pipe._cache().get("default")[0]
    reranker.load()
    store = pipe.index.block_store(reranker.block_store_header(), create=True)
    alpha = float(reranker.default_fusion)
    saved = json.loads(args.scores.read_text()) if args.scores.exists() else {}
    options = pipe.validate(SearchOptions(top_k=10, retriever="hybrid", rerank="default", candidates=args.candidates))
    todo = [q for q in queries if q.query_id not in saved]
    for row in tqdm(pipe.first_stage_rows(todo, options), total=len(todo), desc="passages", unit="query"):
        cands = row.hydrated.top(args.candidates).hits
        docs = [h.document for h in cands]
        passages, owner = expand(reranker.base_lm.tokenizer, docs, reranker.config.max_doc_tokens, args.passages)
        rr = reranker.rerank(row.query, passages, block_store=store)
        by_id = {h.doc_id: h.score for h in rr.ranking.hits}
        saved[row.query.query_id] = {
            "first_stage": [[h.doc_id, float(h.score)] for h in cands],
            "passages": [[docs[o].doc_id, float(by_id[p.doc_id])] for p, o in zip(passages, owner)],
        }
        if len(saved) % 20 == 0 or len(saved) == len(queries):
            tmp = args.scores.with_suffix(".tmp")
            tmp.write_text(json.dumps(saved))
            os.replace(tmp, args.scores)
    args.scores.parent.mkdir(parents=True, exist_ok=True)
    args.scores.write_text(json.dumps(saved))

    pools = {
        "first": lambda s: s[0],
        "max": max,
        "mean": lambda s: sum(s) / len(s),
        **{f"first + {b} (max - first)": (lambda b: lambda s: s[0] + b * (max(s) - s[0]))(b) for b in (0.25, 0.5, 0.75)},
    }
    print(f"\nPassage pools: NFCorpus {args.split}, hybrid top {args.candidates}, at most {args.passages} passages, "
          f"fused at {alpha}; {len(saved)} queries\n")
    print("| pool | nDCG@10 fused | nDCG@10 reranker alone |\n|---|---|---|")
    for name, pool in pools.items():
        runs = {"fused": {}, "alone": {}}
        for qid, rec in saved.items():
            per: dict[str, list[float]] = {}
            for d, s in rec["passages"]:
                per.setdefault(d, []).append(s)
            ids = [d for d, _ in rec["first_stage"]]
            r = standardize_list([pool(per[d]) for d in ids])
            f = standardize_list([s for _, s in rec["first_stage"]])
            runs["fused"][qid] = {d: float(combine(a, b, alpha)) for d, a, b in zip(ids, f, r)}
            runs["alone"][qid] = dict(zip(ids, r))
        score = {k: 100 * ir_measures.calc_aggregate([nDCG @ 10], qrels, v)[nDCG @ 10] for k, v in runs.items()}
        print(f"| {name} | {score['fused']:.2f} | {score['alone']:.2f} |")
    pipe.close()


if __name__ == "__main__":
    main()

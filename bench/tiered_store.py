"""Benchmark: a corpus larger than its document KV store's disk budget.

Every passage the shared data holds (BEIR NFCorpus and SciFact, the DL19 and DL21 passages of all
their runs: about 30k documents) in one BM25 index; the default reranker served as the service
serves it (recompute budget per search, background fill between searches) with a disk budget of
``--budget-share`` of the full int8 store; a stream of ``--stream`` queries drawn from all their
queries with a Zipf popularity (``--zipf``: weight ``1 / rank**s`` over a seeded shuffle), one
after another with ``--gap`` idle seconds between them (when the fill runs). Reports:

- per stream quarter: p50 / p95 latency (seconds), the share of candidate blocks found stored
  (hit rate) and the share of candidates reranked;
- then NFCorpus test (BM25 top 20) nDCG@10 as served from the budgeted store (its recompute
  budget applies) against every candidate reranked from an unbounded store (the fully filled
  store's ranking), with a paired randomization test.

Beside them, on the same candidates: the first stage alone, the embedder alone (``dense``) and the
embedder and first stage fused (the default's scorer without the LM: every candidate cold, recompute
budget 0, no store), each paired against the served ranking.

``--minutes M`` runs the stream for ``M`` minutes of wall time instead of ``--stream`` queries, and
the report adds a row per minute: queries, p50 / p99, hit rate, share reranked, and the store's
blocks and GB at the minute's end (its fill rate).

``--disk-bytes`` sets the budget in bytes instead (no pass over every document to size the full
store: at 1M documents that pass alone tokenises the corpus), and ``--no-reference`` leaves out
the every-candidate-reranked run (at 1M its 6,460 cold blocks take about 20 minutes).

``--index DIR`` serves a copy of an existing index (e.g. NFCorpus's, with dense vectors) instead of
the 30k-passage one, and ``--reference-index`` names one whose store is already full (the reference
run then reads it instead of encoding every block); ``--retriever`` and ``--candidates`` set the
first stage of the stream and of the NFCorpus test run.

Steps are cached under ``--out`` (corpus, index, the reference run); the budgeted store starts
empty each run.

    python bench/tiered_store.py [--out runs/tiered] [--stream 600] [--gap 0.3] [--budget-share 0.1]
        [--cold-budget 4] [--data ../shared/data] [--index DIR [--reference-index DIR]]
        [--retriever bm25] [--candidates 20] [--disk-bytes N] [--no-reference] [--minutes M]
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MEAN_BLOCK = None


def build_corpus(data: Path, out: Path) -> int:
    """``out``: BEIR-layout rows of every passage (NFCorpus ids as they are, the others prefixed)."""
    from heedrank.data import iter_beir_documents, load_run_json

    seen: set[str] = set()
    n = 0
    with gzip.open(out, "wt", encoding="utf-8") as f:
        def put(doc_id: str, title: str, text: str) -> None:
            nonlocal n
            if doc_id in seen:
                return
            seen.add(doc_id)
            f.write(json.dumps({"_id": doc_id, "title": title, "text": text}) + "\n")
            n += 1
        for d in iter_beir_documents(data / "beir-nfcorpus"):
            put(d.doc_id, d.title, d.text)
        for d in iter_beir_documents(data / "beir-scifact"):
            put(f"sf-{d.doc_id}", d.title, d.text)
        for year in ("2019", "2021"):
            folder = data / f"msmarco-trec-dl-{year}-passage"
            for run in sorted(folder.glob("retrieve_results_*.json.gz")):
                _, docs, _ = load_run_json(run)
                for doc_id, d in docs.items():
                    put(f"dl{year[2:]}-{doc_id}", "", d.text)
    return n


def query_pool(data: Path) -> list[str]:
    from heedrank.data import load_beir_qrels, load_beir_queries, load_trec_topics

    pool: list[str] = []
    nf = load_beir_queries(data / "beir-nfcorpus")
    for split in ("test", "dev"):
        pool += [nf[q].text for q in sorted(load_beir_qrels(data / "beir-nfcorpus", split)) if q in nf]
    sf = load_beir_queries(data / "beir-scifact")
    pool += [sf[q].text for q in sorted(sf)]
    pool += [q.text for q in load_trec_topics(data / "msmarco-trec-dl-2019-passage" / "topics.dl19-passage.txt").values()]
    pool += [q.text for q in load_trec_topics(data / "msmarco-trec-dl-2021-passage" / "topics.dl21.txt").values()]
    return [q for q in pool if q.strip()]


def pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def nf_test_run(pipe, cold_budget: int | None, retriever: str = "bm25", candidates: int = 20,
                rerank: str = "default") -> tuple[dict[str, dict[str, float]], dict[str, int]]:
    from heedrank.data import load_beir_qrels, load_beir_queries
    from heedrank.pipeline import SearchOptions
    from heedrank.types import Query

    data = ROOT.parent / "shared" / "data" / "beir-nfcorpus"
    queries = load_beir_queries(data)
    qids = [q for q in sorted(load_beir_qrels(data, "test")) if q in queries]
    run: dict[str, dict[str, float]] = {}
    counts = {"reranked": 0, "skipped": 0}
    opts = SearchOptions(top_k=10, retriever=retriever, rerank=rerank, candidates=candidates,
                         fusion="default", cold_budget=cold_budget)
    for qid in qids:
        res = pipe.search(Query(qid, queries[qid].text), opts)
        run[qid] = {h.doc_id: float(h.score) for h in res.ranking.hits}
        if res.rerank is None:  # the first stage found nothing
            continue
        counts["reranked"] += len(res.rerank.ranking)
        counts["skipped"] += len(res.skipped)
    return run, counts


def ndcg(run: dict[str, dict[str, float]]) -> dict[str, float]:
    import ir_measures

    from heedrank.data import load_beir_qrels

    qrels = load_beir_qrels(ROOT.parent / "shared" / "data" / "beir-nfcorpus", "test")
    return {m.query_id: m.value for m in ir_measures.iter_calc([ir_measures.nDCG @ 10], qrels, run)}


def paired_p(a: list[float], b: list[float], trials: int = 10000) -> float:
    rng = random.Random(0)
    diffs = [y - x for x, y in zip(a, b)]
    observed = abs(sum(diffs))
    hits = sum(abs(sum(d if rng.random() < 0.5 else -d for d in diffs)) >= observed - 1e-12 for _ in range(trials))
    return (hits + 1) / (trials + 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "tiered")
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--stream", type=int, default=600)
    ap.add_argument("--gap", type=float, default=0.3)
    ap.add_argument("--zipf", type=float, default=1.0)
    ap.add_argument("--budget-share", type=float, default=0.1)
    ap.add_argument("--cold-budget", type=int, default=4)
    ap.add_argument("--eviction", default="lru")
    ap.add_argument("--torch-threads", type=int, default=1)
    ap.add_argument("--index", type=Path, help="serve a copy of this index (its store left out)")
    ap.add_argument("--reference-index", type=Path, help="an index with a full store: the reference run reads it")
    ap.add_argument("--retriever", default="bm25")
    ap.add_argument("--candidates", type=int, default=20)
    ap.add_argument("--disk-bytes", type=int, help="disk budget in bytes (instead of --budget-share)")
    ap.add_argument("--no-reference", action="store_true", help="leave out the every-candidate-reranked run")
    ap.add_argument("--minutes", type=float, help="run the stream this many minutes (instead of --stream queries)")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.torch_threads)
    sys.path.insert(0, str(ROOT))
    from heedrank.api.fill import BlockFiller
    from heedrank.config import KVTiers, PipelineConfig, RerankerConfig
    from heedrank.index.builder import build_index
    from heedrank.pipeline import Pipeline, SearchOptions
    from heedrank.reranker.doccache import document_blocks
    from heedrank.types import Query

    args.out.mkdir(parents=True, exist_ok=True)
    corpus = args.out / "corpus.jsonl.gz"
    ix_dir = args.out / "ix"
    if args.index is not None:
        if not (ix_dir / "params.json").exists():
            shutil.rmtree(ix_dir, ignore_errors=True)
            shutil.copytree(args.index, ix_dir, ignore=shutil.ignore_patterns("kv"))
    elif not corpus.exists():
        tmp = args.out / "corpus.tmp.jsonl.gz"
        n = build_corpus(args.data, tmp)
        tmp.rename(corpus)
        print(f"corpus: {n} documents", flush=True)
    if not (ix_dir / "params.json").exists():
        shutil.rmtree(ix_dir, ignore_errors=True)
        build_index(corpus, ix_dir, dense=False, show_progress=False)
    shutil.rmtree(ix_dir / "kv", ignore_errors=True)  # the budgeted store starts empty

    if args.disk_bytes:
        budget = args.disk_bytes
        print(f"disk budget {budget / 1e9:.2f} GB (given)", flush=True)
    else:  # the full store's size: every distinct block's int8 bytes
        probe = Pipeline.from_config(PipelineConfig(index_dir=str(ix_dir), reranker=RerankerConfig(method="default")))
        reranker = probe._cache().get("default")[0]
        reranker.load()
        from heedrank.index.kv.codec import codec_for

        codec = codec_for(reranker.block_store_header())
        texts = [d.content for d in probe.index.docstore.iter_documents()]
        lengths = {tuple(ids): len(ids) for ids, _ in document_blocks(reranker.base_lm.tokenizer, reranker.layout, texts)}
        full_bytes = sum(codec.nbytes(t) for t in lengths.values())
        probe.close()
        budget = int(args.budget_share * full_bytes)
        print(f"{len(texts)} documents, {len(lengths)} distinct blocks, full int8 store {full_bytes / 1e9:.2f} GB, "
              f"disk budget {budget / 1e9:.2f} GB ({args.budget_share:.0%})", flush=True)

    tiers = KVTiers(disk_bytes=budget, eviction=args.eviction)
    t_open = time.perf_counter()
    pipe = Pipeline.from_config(PipelineConfig(index_dir=str(ix_dir), reranker=RerankerConfig(method="default"),
                                               kv_tiers=tiers))
    cache = pipe._cache()
    reranker, lock = cache.get("default")
    reranker.load()
    print(f"pipeline open and reranker loaded: {time.perf_counter() - t_open:.1f} s", flush=True)
    filler = BlockFiller(pipe.index, reranker, lock, cache, name="tiered").start()
    cache.cold_listener = lambda _r, _store, docs: filler.offer(docs)

    pool = query_pool(args.data)
    rng = random.Random(7)
    rng.shuffle(pool)
    weights = [1.0 / (r + 1) ** args.zipf for r in range(len(pool))]
    limit = args.stream if args.minutes is None else 10**9
    stream = (rng.choices(pool, weights=weights)[0] for _ in range(limit))
    opts = SearchOptions(top_k=10, retriever=args.retriever, rerank="default", candidates=args.candidates,
                         fusion="default", cold_budget=args.cold_budget)
    rows = []
    minutes: list[dict[str, float]] = []  # the store at the end of each minute
    t_start = time.monotonic()
    for i, text in enumerate(stream):
        elapsed = time.monotonic() - t_start
        while elapsed >= 60 * (len(minutes) + 1):  # a minute ended: read the store's fill
            st = filler.store.stats()
            minutes.append({"blocks": st.blocks, "gb": st.live_bytes / 1e9})
        if args.minutes is not None and elapsed >= 60 * args.minutes:
            break
        t0 = time.perf_counter()
        res = pipe.search(Query(f"s{i}", text), opts)
        seconds = time.perf_counter() - t0
        rr = res.rerank
        if rr is None:  # the first stage found nothing
            continue
        skipped = len(res.skipped)
        cache_counts = (rr.cache or {"hits": 0, "misses": 0})
        n = len(rr.ranking) + skipped
        rows.append({"seconds": seconds, "candidates": n, "hits": cache_counts["hits"], "reranked": len(rr.ranking),
                     "minute": int((time.monotonic() - t_start) // 60)})
        time.sleep(args.gap)
    stream_minutes = (time.monotonic() - t_start) / 60
    store = filler.store
    filler.stop()
    stats = store.stats()
    print(f"\nstream of {len(rows)} queries from {len(pool)} (Zipf s={args.zipf}), gap {args.gap} s, cold budget "
          f"{args.cold_budget}, eviction {args.eviction}: {stream_minutes:.1f} min; store after: {stats.blocks} blocks, "
          f"{stats.live_bytes / 1e9:.2f} GB live, {stats.bytes_on_disk / 1e9:.2f} GB on disk, {stats.evictions} "
          f"evictions, {stats.not_admitted} not admitted; the fill encoded {filler.filled} blocks\n")
    print("| queries | p50 s | p95 s | p99 s | hit rate | reranked |\n|---|---|---|---|---|---|")
    q = max(1, len(rows) // 4)
    for part in range(4):
        rs = rows[part * q:(part + 1) * q] if part < 3 else rows[3 * q:]
        cand = sum(r["candidates"] for r in rs)
        lat = [r["seconds"] for r in rs]
        print(f"| {part * q + 1}-{part * q + len(rs)} | {statistics.median(lat):.3f} | {pct(lat, 0.95):.3f} | "
              f"{pct(lat, 0.99):.3f} | "
              f"{sum(r['hits'] for r in rs) / cand:.1%} | {sum(r['reranked'] for r in rs) / cand:.1%} |")
    lat = [r["seconds"] for r in rows]
    cand = sum(r["candidates"] for r in rows)
    print(f"| all | {statistics.median(lat):.3f} | {pct(lat, 0.95):.3f} | {pct(lat, 0.99):.3f} | "
          f"{sum(r['hits'] for r in rows) / cand:.1%} | "
          f"{sum(r['reranked'] for r in rows) / cand:.1%} |")

    if minutes:
        print("\n| minute | queries | p50 s | p99 s | hit rate | reranked | store blocks | store GB |\n"
              "|---|---|---|---|---|---|---|---|")
        for m, fill in enumerate(minutes):
            rs = [r for r in rows if r["minute"] == m]
            if not rs:
                continue
            lat, cand = [r["seconds"] for r in rs], sum(r["candidates"] for r in rs)
            print(f"| {m + 1} | {len(rs)} | {statistics.median(lat):.3f} | {pct(lat, 0.99):.3f} | "
                  f"{sum(r['hits'] for r in rs) / cand:.1%} | {sum(r['reranked'] for r in rs) / cand:.1%} | "
                  f"{fill['blocks']} | {fill['gb']:.2f} |")

    first = dict(retriever=args.retriever, candidates=args.candidates)
    served, counts = nf_test_run(pipe, args.cold_budget, **first)
    pipe.close()
    ref_path = args.out / "nf-test-reference.json"
    reference: dict[str, dict[str, float]] | None = None
    if ref_path.exists():
        reference = json.loads(ref_path.read_text())
    elif not args.no_reference:
        ref_dir = args.reference_index or args.out / "ix-ref"
        if not (ref_dir / "params.json").exists():
            shutil.copytree(ix_dir, ref_dir, ignore=shutil.ignore_patterns("kv"))
        ref = Pipeline.from_config(PipelineConfig(index_dir=str(ref_dir), reranker=RerankerConfig(method="default")))
        reference, _ = nf_test_run(ref, None, **first)
        ref.close()
        ref_path.write_text(json.dumps(reference))
    # the same candidates without the LM: the scorer's embedder + first-stage model (every candidate
    # cold, none encoded, no store), the embedder alone and the first stage alone
    floor_dir = args.out / "ix-floor"
    shutil.rmtree(floor_dir, ignore_errors=True)
    shutil.copytree(ix_dir, floor_dir, ignore=shutil.ignore_patterns("kv"))
    floor = Pipeline.from_config(PipelineConfig(index_dir=str(floor_dir), reranker=RerankerConfig(method="default")))
    others = {"embedder + first stage (no LM)": nf_test_run(floor, 0, **first)[0]}
    if floor.index.dense is not None:  # an index without vectors has no embedder to rank by
        others["embedder alone"] = nf_test_run(floor, None, rerank="dense", **first)[0]
    others["first stage alone"] = nf_test_run(floor, None, rerank="none", **first)[0]
    floor.close()
    b = ndcg(served)
    print(f"\nNFCorpus test ({len(b)} queries, {args.retriever} top {args.candidates}), nDCG@10 x 100; as served "
          f"from the budgeted store: reranked {counts['reranked']} of {counts['reranked'] + counts['skipped']} "
          f"candidates\n\n| ranking | nDCG@10 | served - it | paired p |\n|---|---|---|---|")
    print(f"| as served from the budgeted store | {100 * statistics.fmean(b.values()):.2f} | | |")
    compared = ({"every candidate reranked (unbounded store)": reference} if reference is not None else {}) | others
    for name, run in compared.items():
        a = ndcg(run)
        qids = sorted(set(a) & set(b))
        xa, xb = [a[q] for q in qids], [b[q] for q in qids]
        print(f"| {name} | {100 * statistics.fmean(xa):.2f} | {100 * (statistics.fmean(xb) - statistics.fmean(xa)):+.2f} "
              f"| {paired_p(xa, xb):.3f} |")
    (args.out / "stream.json").write_text(json.dumps({"rows": rows, "minutes": minutes, "args": {k: str(v) for k, v in vars(args).items()}}))


if __name__ == "__main__":
    main()

"""Benchmark: is the served probability of relevance the same whether a document is sent alone
or among others, and does it separate relevant from non-relevant documents sent alone?

The probability measured is the one ``/rerank`` serves (``relevance_score``): one call of
:meth:`heedrank.pipeline.Pipeline.rerank_documents` per list, with ``/rerank``'s first-stage
stand-in (``1 / (1 + i)`` down the given order) and, by default, its position prior
(``--by prior``; ``--by rank``: fused with the reciprocal rank, ``/rerank`` with a fusion
weight; ``--by score``: fused with the hybrid first stage's scores, the ``/search`` step).
No server: the Python pipeline directly, on the NFCorpus index ``--index``.

For each of ``--queries`` NFCorpus test queries (seeded subset, :func:`heedrank.eval.harness.select_queries`):

- ``--per-query K`` documents are sampled (seeded): ``K/2`` relevant (qrels grade >= 1) and
  ``K/2`` non-relevant, the unjudged hits of the hybrid first stage's top ``--neg-depth``
  (NFCorpus's test qrels hold no grade 0: unjudged counts as non-relevant, as BEIR scores it);
  when one side runs short the other fills the K;
- each is served alone (``p_alone``) and in lists of 5, 20 and 50 (``p_in_list``): the
  document plus the first 4, 19, 49 first-stage (hybrid) hits other than it, in first-stage
  order, the document placed at its first-stage rank (``--place first-stage``; a document
  ranked below the list, or not retrieved, goes last) or at a seeded random position
  (``--place random``); with ``--by score`` the list is sent in first-stage score order (a
  document not retrieved takes the list's lowest score);
- three junk documents are served alone: the empty text, whitespace, 200 random characters.

Figures (one markdown table; targets in the last column):

- ``|p_alone - p_in_list|`` for lists of 5, 20, 50: median and 90th percentile over the
  sampled (query, document) pairs;
- ROC AUC of ``p_alone`` against the labels above (NFCorpus), and, with ``--dl19``, of DL19
  judged passages sent alone (grade >= 2 relevant, the TREC DL passage convention; up to K
  per query, balanced, from the judged passages with text in the ``--dl19-run`` run);
- for reference, ROC AUC of ``p_in_list`` over the same pairs, and over the plain first-stage
  top 5/20/50 lists (every document, unjudged = non-relevant);
- junk documents alone: median and max ``p`` over queries, per kind;
- expected calibration error (10 equal-width bins): of ``p_alone`` over the sampled pairs
  (balanced: half relevant, so not the collection's base rate), and of ``p_in_list`` over
  the plain first-stage top 5/20/50 lists (every document, unjudged = non-relevant): the
  lists the service serves.

The index's document KV store is opened read-only (nothing is written to ``--index``):
collection documents read their stored blocks; junk and DL19 texts are encoded on the fly
and kept in RAM only.

    python bench/list_independence.py [--queries 50] [--per-query 6] [--place first-stage]
        [--by prior] [--rerank default] [--opt key=value ...] [--dl19] [--threads 0]
"""

from __future__ import annotations

import argparse
import logging
import math
import random
import statistics
import string
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

logger = logging.getLogger("bench.list_independence")

LIST_SIZES = (5, 20, 50)
JUNK = ("empty", "whitespace", "random")
TARGETS = {"median": 0.05, "p90": 0.15, "auc": 0.70, "junk": 0.10, "ece": 0.05}


# ------------------------------------------------------------------------------ metric helpers
def roc_auc(scores: Sequence[float], labels: Sequence[int]) -> float:
    """ROC AUC of ``scores`` (higher = more relevant) against binary ``labels`` (1 relevant,
    0 not): the probability a random relevant item outscores a random non-relevant one, ties
    counted half (Mann-Whitney U over average ranks). ``nan`` when a class is empty.

    Raises:
        ValueError: ``scores`` and ``labels`` differ in length.
    """
    if len(scores) != len(labels):
        raise ValueError(f"{len(scores)} scores but {len(labels)} labels")
    from scipy.stats import rankdata

    n_pos = sum(1 for y in labels if y)
    n_neg = len(labels) - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    ranks = rankdata(list(scores))  # average ranks for ties, 1-based
    rank_sum = sum(r for r, y in zip(ranks, labels) if y)
    return float((rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def expected_calibration_error(probs: Sequence[float], labels: Sequence[int], bins: int = 10) -> float:
    """Expected calibration error: over ``bins`` equal-width bins of [0, 1], the mean
    ``|mean p - fraction relevant|`` of each bin weighted by its share of the items (``p = 1``
    falls in the last bin). ``nan`` for no items.

    Raises:
        ValueError: lengths differ, ``bins < 1``, or a probability outside [0, 1].
    """
    if len(probs) != len(labels):
        raise ValueError(f"{len(probs)} probabilities but {len(labels)} labels")
    if bins < 1:
        raise ValueError(f"bins must be >= 1, got {bins}")
    if not probs:
        return float("nan")
    sums: list[list[float]] = [[0.0, 0.0, 0.0] for _ in range(bins)]  # count, sum p, sum y
    for p, y in zip(probs, labels):
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"probability {p} outside [0, 1]")
        b = sums[min(int(p * bins), bins - 1)]
        b[0] += 1
        b[1] += p
        b[2] += 1.0 if y else 0.0
    return sum(abs(sp - sy) / len(probs) for n, sp, sy in sums if n)


def spread(values: Sequence[float]) -> dict[str, float]:
    """``{"n", "median", "p90", "max"}`` of ``values`` (percentiles linearly interpolated, as
    ``numpy.percentile``'s default); nan figures for no values."""
    import numpy as np

    if not values:
        return {"n": 0, "median": float("nan"), "p90": float("nan"), "max": float("nan")}
    a = np.asarray(values, dtype=float)
    return {"n": len(a), "median": float(np.percentile(a, 50)), "p90": float(np.percentile(a, 90)),
            "max": float(a.max())}


def placed(first: Sequence[str], doc: str, size: int, place: str, rng: random.Random) -> list[str]:
    """The list of ``size`` ids ``doc`` is served in: the first ``size - 1`` ids of ``first``
    (first-stage order) other than ``doc``, with ``doc`` at its index in ``first``
    (``place="first-stage"``; at the end when it is not within the list) or at a position
    drawn from ``rng`` (``place="random"``). Shorter when ``first`` runs out.

    Raises:
        ValueError: an unknown ``place`` or ``size < 1``.
    """
    if size < 1:
        raise ValueError(f"size must be >= 1, got {size}")
    others = [d for d in first if d != doc][: size - 1]
    if place == "first-stage":
        pos = first.index(doc) if doc in first else len(others)
        pos = min(pos, len(others))
    elif place == "random":
        pos = rng.randrange(len(others) + 1)
    else:
        raise ValueError(f"place must be 'first-stage' or 'random', got {place!r}")
    return others[:pos] + [doc] + others[pos:]


def balanced_sample(relevant: Sequence[str], other: Sequence[str], k: int, rng: random.Random) -> list[str]:
    """``k`` ids, half from ``relevant`` and half from ``other`` (sampled by ``rng``), one side
    filling in when the other runs short; sorted for a stable order."""
    rel, oth = sorted(relevant), sorted(other)
    n_rel = min(len(rel), max(k // 2, k - len(oth)))
    n_oth = min(len(oth), k - n_rel)
    return sorted(rng.sample(rel, n_rel)) + sorted(rng.sample(oth, n_oth))


def junk_texts(rng: random.Random) -> dict[str, str]:
    """The junk documents, by kind: empty, whitespace, 200 random printable characters."""
    chars = string.ascii_letters + string.digits + string.punctuation + " "
    return {"empty": "", "whitespace": " \n\t  \n ", "random": "".join(rng.choice(chars) for _ in range(200))}


# ------------------------------------------------------------------------------ serving
def read_only_store(index: Any) -> None:
    """Make ``index`` hand out its document KV store opened read-only (no writer lock, no
    block written: :meth:`heedrank.index.store.Index.block_store` opens it for writing)."""
    from heedrank.blocks import as_header
    from heedrank.index.kv import KVStore

    opened: dict[str, Any] = {}

    def block_store(header: Any, *, create: bool = True) -> Any:
        want = as_header(header)
        key = want.fingerprint()
        if key not in opened:
            path = Path(index.path) / index.KV_DIR
            if not (path / "header.json").exists():
                return None
            opened[key] = KVStore.open(path, want, readonly=True,
                                       out_dtype="float32" if want.dtype == "int8" else "float16")
        return opened[key]

    index.block_store = block_store


class Server:
    """Serves lists through :meth:`Pipeline.rerank_documents` as ``/rerank`` does, caching by
    the list's ids (the top-N list is shared by every sampled document within it)."""

    def __init__(self, pipe: Any, options: Any, by: str, docs: Callable[[Sequence[str]], Mapping[str, Any]]):
        self.pipe, self.options, self.by, self.docs = pipe, options, by, docs
        self.cache: dict[tuple[str, tuple[str, ...]], dict[str, float]] = {}
        self.seconds: list[float] = []

    def serve(self, query: Any, docs: Sequence[Any], first_scores: Mapping[str, float] | None = None,
              use_store: bool = True) -> dict[str, float]:
        """``{doc_id: served probability}`` of ``docs`` (:class:`heedrank.types.Document`, in
        the given order) for ``query``."""
        from heedrank.types import Ranking, ScoredDoc

        key = (query.query_id, tuple(d.doc_id for d in docs))
        if key in self.cache:
            return self.cache[key]
        if self.by == "score":
            low = min(first_scores.values()) if first_scores else 0.0
            scores = [first_scores.get(d.doc_id, low) if first_scores else 0.0 for d in docs]
        else:
            scores = [1.0 / (1 + i) for i in range(len(docs))]  # /rerank's stand-in
        hits = [ScoredDoc(d.doc_id, s, d) for d, s in zip(docs, scores)]
        # --by score: the list in first-stage score order (a document not retrieved has the lowest score)
        given = Ranking.from_hits(query.query_id, hits) if self.by == "score" else Ranking(query.query_id, tuple(hits))
        t0 = time.perf_counter()
        done = self.pipe.rerank_documents(query, given, self.options, by=self.by, use_store=use_store,
                                          share_texts=True)
        self.seconds.append(time.perf_counter() - t0)
        served = done.served
        probs = served.relevance if served.relevance is not None else served.probabilities
        if probs is None:
            raise SystemExit("the reranker serves no probability (no calibration and no relevance)")
        self.cache[key] = {d: float(p) for d, p in probs.items()}
        return self.cache[key]


# ------------------------------------------------------------------------------ runs
def run_nfcorpus(args: argparse.Namespace, pipe: Any, server: Server) -> dict[str, Any]:
    from heedrank.data import load_beir_qrels, load_beir_queries
    from heedrank.eval.harness import select_queries
    from heedrank.types import Document

    queries = load_beir_queries(args.data)
    qrels = load_beir_qrels(args.data, "test")
    selected, _ = select_queries(queries, qrels, args.queries, args.seed)
    depth = max(max(LIST_SIZES), args.neg_depth)
    rankings = pipe.retrievers[args.retriever].retrieve(selected, depth)
    rng = random.Random(args.seed)
    junk = junk_texts(random.Random(args.seed + 1))
    out: dict[str, Any] = {"gaps": {n: [] for n in LIST_SIZES}, "alone": [], "list_auc": {n: [] for n in LIST_SIZES},
                           "junk": {k: [] for k in JUNK}, "ece_lists": {n: [] for n in LIST_SIZES}}
    t0 = time.perf_counter()
    for qi, (q, ranking) in enumerate(zip(selected, rankings)):
        judged = {d: g for d, g in qrels.get(q.query_id, {}).items() if g >= 1}
        first = list(ranking.doc_ids)
        first_scores = dict(ranking.to_dict())
        negatives = [d for d in first[: args.neg_depth] if d not in qrels.get(q.query_id, {})]
        sample = balanced_sample(list(judged), negatives, args.per_query, rng)
        need = set(sample) | set(first[: max(LIST_SIZES)])
        docs = server.docs(sorted(need))
        sample = [d for d in sample if d in docs]
        for d in sample:
            label = int(d in judged)
            alone = server.serve(q, [docs[d]], first_scores)[d]
            out["alone"].append((alone, label))
            for n in LIST_SIZES:
                ids = [i for i in placed(first, d, n, args.place, rng) if i in docs]
                p = server.serve(q, [docs[i] for i in ids], first_scores)[d]
                out["gaps"][n].append(abs(alone - p))
                out["list_auc"][n].append((p, label))
        for n in LIST_SIZES:  # the plain first-stage lists, as served
            ids = [i for i in first[:n] if i in docs]
            probs = server.serve(q, [docs[i] for i in ids], first_scores)
            out["ece_lists"][n].extend((probs[i], int(i in judged)) for i in ids)
        for kind, text in junk.items():
            doc = Document(f"junk-{kind}", text)
            out["junk"][kind].append(server.serve(q, [doc], None, use_store=True)[doc.doc_id])
        logger.info("query %d/%d %s: %d docs, %.0f s so far", qi + 1, len(selected), q.query_id, len(sample),
                    time.perf_counter() - t0)
    out["queries"] = len(selected)
    return out


def run_dl19(args: argparse.Namespace, server: Server) -> dict[str, Any]:
    from heedrank.data import load_run_json, load_trec_qrels, load_trec_topics, trec_dl_paths
    from heedrank.eval.harness import select_queries

    paths = trec_dl_paths(args.dl19_data, args.dl19_run)
    run, docs, run_queries = load_run_json(paths.run_json)
    queries = {**run_queries, **load_trec_topics(paths.topics)}
    qrels = load_trec_qrels(paths.qrels)
    selected, _ = select_queries({q: v for q, v in queries.items() if q in run}, qrels, args.dl19_queries, args.seed)
    rng = random.Random(args.seed)
    pairs = []
    for q in selected:
        judged = {d: g for d, g in qrels[q.query_id].items() if d in docs}
        rel = [d for d, g in judged.items() if g >= 2]
        non = [d for d, g in judged.items() if g < 2]
        for d in balanced_sample(rel, non, args.per_query, rng):
            pairs.append((server.serve(q, [docs[d]], None, use_store=False)[d], int(d in rel)))
    return {"alone": pairs, "queries": len(selected)}


def table(nf: Mapping[str, Any], dl: Mapping[str, Any] | None, args: argparse.Namespace) -> str:
    def f(x: float) -> str:
        return "n/a" if x != x else f"{x:.3f}"

    rows = ["| figure | value | target |", "|---|---|---|"]
    for n in LIST_SIZES:
        s = spread(nf["gaps"][n])
        rows.append(f"| abs(p_alone - p_in_list), list of {n} (median / p90 / max, {s['n']} pairs) | "
                    f"{f(s['median'])} / {f(s['p90'])} / {f(s['max'])} | <= {TARGETS['median']} / <= {TARGETS['p90']} |")
    alone = nf["alone"]
    n_pos = sum(y for _, y in alone)
    rows.append(f"| ROC AUC of p_alone, NFCorpus ({n_pos} relevant / {len(alone) - n_pos} not) | "
                f"{f(roc_auc([p for p, _ in alone], [y for _, y in alone]))} | >= {TARGETS['auc']} |")
    for n in LIST_SIZES:
        pairs = nf["list_auc"][n]
        rows.append(f"| ROC AUC of p_in_list, list of {n} (same pairs; for reference) | "
                    f"{f(roc_auc([p for p, _ in pairs], [y for _, y in pairs]))} | |")
    for n in LIST_SIZES:
        pairs = nf["ece_lists"][n]
        rows.append(f"| ROC AUC of p_in_list, first-stage top {n} lists (all docs; for reference) | "
                    f"{f(roc_auc([p for p, _ in pairs], [y for _, y in pairs]))} | |")
    if dl is not None:
        pairs = dl["alone"]
        n_pos = sum(y for _, y in pairs)
        rows.append(f"| ROC AUC of p_alone, DL19 {args.dl19_run} judged ({dl['queries']} queries, {n_pos} relevant / "
                    f"{len(pairs) - n_pos} not) | {f(roc_auc([p for p, _ in pairs], [y for _, y in pairs]))} | "
                    f">= {TARGETS['auc']} |")
    for kind in JUNK:
        s = spread(nf["junk"][kind])
        rows.append(f"| {kind} document alone (median / max over {s['n']} queries) | "
                    f"{f(s['median'])} / {f(s['max'])} | <= {TARGETS['junk']} |")
    rows.append(f"| ECE of p_alone, sampled pairs (balanced) | "
                f"{f(expected_calibration_error([p for p, _ in alone], [y for _, y in alone]))} | <= {TARGETS['ece']} |")
    for n in LIST_SIZES:
        pairs = nf["ece_lists"][n]
        rows.append(f"| ECE of p_in_list, first-stage top {n} lists ({len(pairs)} docs, unjudged = 0) | "
                    f"{f(expected_calibration_error([p for p, _ in pairs], [y for _, y in pairs]))} | "
                    f"<= {TARGETS['ece']} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--index", default="/work/idx/nfcorpus", help="NFCorpus index with a filled document KV store")
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "beir-nfcorpus"))
    ap.add_argument("--queries", type=int, default=50, help="NFCorpus test queries (seeded subset)")
    ap.add_argument("--per-query", type=int, default=6, help="sampled documents per query (half relevant)")
    ap.add_argument("--neg-depth", type=int, default=50, help="non-relevant: unjudged hits of this first-stage depth")
    ap.add_argument("--place", choices=("first-stage", "random"), default="first-stage")
    ap.add_argument("--by", choices=("prior", "rank", "score"), default="prior",
                    help="prior: /rerank's default; rank: /rerank with a fusion weight; score: /search's fusion")
    ap.add_argument("--fusion", default="default", help="fusion weight for --by rank/score (default: the card's)")
    ap.add_argument("--retriever", default="hybrid")
    ap.add_argument("--rerank", default="default", help="reranker method")
    ap.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE", help="reranker option (repeatable)")
    ap.add_argument("--max-doc-tokens", type=int, default=None)
    ap.add_argument("--dl19", action="store_true", help="also the DL19 alone-AUC")
    ap.add_argument("--dl19-data", default=str(ROOT.parent / "shared" / "data" / "msmarco-trec-dl-2019-passage"))
    ap.add_argument("--dl19-run", default="BM25")
    ap.add_argument("--dl19-queries", type=int, default=None, help="DL19 queries (default: all judged)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0 = torch's default)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for name in ("heedrank", "faiss", "sentence_transformers", "transformers", "httpx"):
        logging.getLogger(name).setLevel(logging.WARNING)

    import torch

    from heedrank import Pipeline, PipelineConfig, SearchOptions
    from heedrank.cli.options import parse_opts
    from heedrank.config import RerankerConfig

    if args.threads:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    pipe = Pipeline.from_config(PipelineConfig(index_dir=args.index, reranker=RerankerConfig(
        method=args.rerank, max_doc_tokens=args.max_doc_tokens)))
    read_only_store(pipe.index)
    opts = parse_opts(args.opt) or None
    fusion = None if args.by == "prior" else args.fusion
    options = SearchOptions(rerank=args.rerank, rerank_options=opts, fusion=fusion)

    def hydrate(ids: Sequence[str]) -> dict[str, Any]:
        return dict(pipe.docstore.get_many(list(ids)))

    server = Server(pipe, options, args.by, hydrate)
    nf = run_nfcorpus(args, pipe, server)
    dl = run_dl19(args, server) if args.dl19 else None
    seconds = time.perf_counter() - t0
    cmd = "python bench/list_independence.py " + " ".join(sys.argv[1:])
    print(f"`{cmd}`: NFCorpus test, {nf['queries']} queries, {args.per_query} sampled documents each, "
          f"hybrid first stage, document at its {args.place} position, --by {args.by}, --rerank {args.rerank}"
          f"{' ' + ' '.join('--opt ' + o for o in args.opt) if args.opt else ''}; {len(server.seconds)} lists "
          f"served (median {statistics.median(server.seconds):.2f} s), {seconds / 60:.1f} min in all")
    print()
    print(table(nf, dl, args))
    if math.isnan(roc_auc([p for p, _ in nf["alone"]], [y for _, y in nf["alone"]])):
        logger.warning("one class is empty: raise --per-query or --queries")


if __name__ == "__main__":
    main()

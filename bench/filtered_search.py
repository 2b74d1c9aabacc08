"""Benchmark: metadata-filtered vector search, HNSW vs exact vs IVF, at selectivities
0.1 %, 1 %, 10 %, 50 % and 100 %.

Two vector sets:

* **14k real**: all-MiniLM-L6-v2 embeddings (packaged model, 384-d) of the 3,633 NFCorpus
  documents and the 10,852 DL19 candidate passages (14,485 vectors), queried with the 323
  NFCorpus test queries and the 43 DL19 queries (366 real queries).
* **1M synthetic**: 1,000,000 vectors clustered like the real ones, not iid: each is a
  real document embedding plus Gaussian noise with the real embeddings' covariance
  (anisotropic), scaled so that a point's cosine to its seed is ~0.8, then normalised.
  Queried with the same real query embeddings.

Every document gets synthetic but reproducible metadata (seeded): ``cat`` (100 values,
uniform), ``year`` (2000-2019, uniform), ``open`` (boolean, p = 0.5), stored as JSON in a
:class:`heedrank.index.docstore.SQLiteDocStore`. Filters per level (a pool of distinct filters,
queries assigned round-robin; the id set comes from the docstore's SQL, timed apart):

==========  ===========================================================================
level       filter
==========  ===========================================================================
0.1 %       ``cat == c AND year in [y, y + 1]``
1 %         ``cat == c``
10 %        ``cat in {10 values}``
50 %        ``open == b``
100 %       ``year >= 2000`` (matches everything, but still goes through the filter path)
==========  ===========================================================================

Strategies (one query per call, as the service runs them):

* ``flat/exact``: exact filtered search (the planner on a flat index): the ground truth's
  speed reference.
* ``hnsw/selector``, ``ivf/selector``: faiss's own filtered search, an ``IDSelector``
  through ``SearchParameters`` with the index's default ``efSearch`` / ``nprobe`` and no
  fallback: what most vector stores do.
* ``hnsw/planner``, ``ivf/planner``: :func:`heedrank.index.planner.planned_search`: exact below a
  selectivity threshold, raised ``efSearch`` / ``nprobe`` above it, exact retry of short
  answers.

For each: recall@10 against exact filtered search (numpy brute force), the fraction of
short answers (fewer than ``min(k, matching)`` hits), queries/s, and what the planner
chose; per index: build time and size (serialised faiss index). Prints markdown tables
and, with ``--out``, appends them to a results file.

    python bench/filtered_search.py [--sizes 14k,1m] [--queries 366] [--n-synthetic 1000000]
        [--threads 2] [--cache DIR] [--out runs/filtered_search.md]

Run it in the background with a log (``... > bench.log 2>&1 &``): progress goes to stderr.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import logging
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

logger = logging.getLogger("bench.filtered_search")

DATA = Path(os.environ.get("HEEDRANK_SHARED_DATA", ROOT.parent / "shared" / "data"))
LEVELS = ("0.1%", "1%", "10%", "50%", "100%")
K = 10


def default_cache() -> Path:
    from heedrank.data import default_cache_dir

    return default_cache_dir() / "bench"


# ------------------------------------------------------------------------------- data
def real_corpus(data: Path) -> tuple[list[str], list[str], list[tuple[str, str]]]:
    """NFCorpus documents + the DL19 candidate passages: ``(doc_ids, texts, queries)``.

    Doc ids are prefixed ``nf:`` / ``dl:`` (the two id spaces overlap); texts are
    ``Document.content``. Queries: the 323 NFCorpus test queries and the 43 DL19 queries.
    """
    from heedrank.data import iter_beir_documents, load_beir_qrels, load_beir_queries, load_run_json

    ids, texts = [], []
    for d in iter_beir_documents(data / "beir-nfcorpus"):
        ids.append("nf:" + d.doc_id)
        texts.append(d.content)
    passages: dict[str, str] = {}
    dl_queries: dict[str, str] = {}
    for f in sorted((data / "msmarco-trec-dl-2019-passage").glob("retrieve_results_*_dl19_top100.json.gz")):
        _, docs, queries = load_run_json(f)
        for did, doc in docs.items():
            passages.setdefault(did, doc.content)
        for qid, q in queries.items():
            dl_queries.setdefault(qid, q.text)
    for did in sorted(passages):
        ids.append("dl:" + did)
        texts.append(passages[did])
    nf_q = load_beir_queries(data / "beir-nfcorpus")
    qrels = load_beir_qrels(data / "beir-nfcorpus", "test")
    queries = [("nf:" + q, nf_q[q].text) for q in sorted(qrels)] + [("dl:" + q, t) for q, t in sorted(dl_queries.items())]
    return ids, texts, queries


def embed(texts: list[str], cache: Path, name: str, batch_size: int = 64) -> np.ndarray:
    """all-MiniLM-L6-v2 embeddings of ``texts`` (float32 ``(n, 384)``), cached by content hash."""
    from heedrank.index.encoder import SentenceTransformerEncoder, model_sha256

    h = hashlib.sha256(model_sha256(None).encode())
    for t in texts:
        h.update(t.encode("utf-8"))
        h.update(b"\0")
    file = cache / f"{name}-{h.hexdigest()[:16]}.npy"
    if file.is_file():
        return np.load(file)
    cache.mkdir(parents=True, exist_ok=True)
    enc = SentenceTransformerEncoder(batch_size=batch_size)
    t0 = time.perf_counter()
    x = enc.encode_documents(texts, show_progress=True)
    logger.info("encoded %d texts in %.0f s", len(texts), time.perf_counter() - t0)
    tmp = file.with_suffix(".tmp.npy")
    np.save(tmp, x)
    tmp.rename(file)
    return x


def synthetic(real: np.ndarray, n: int, *, seed: int = 0, target_cos: float = 0.8) -> np.ndarray:
    """``n`` unit vectors clustered like ``real``: a random real vector plus Gaussian noise
    with the real vectors' covariance, scaled to a mean cosine of ``target_cos`` to the seed."""
    rng = np.random.default_rng(seed)
    centred = real - real.mean(axis=0)
    cov = centred.T @ centred / len(real)
    evals, evecs = np.linalg.eigh(cov)
    a = (evecs * np.sqrt(np.clip(evals, 0, None))).astype(np.float32)  # noise = z @ a.T has covariance cov
    r = np.tan(np.arccos(target_cos))
    alpha = np.float32(r / np.sqrt(np.trace(cov)))
    out = np.empty((n, real.shape[1]), dtype=np.float32)
    for start in range(0, n, 100_000):
        stop = min(n, start + 100_000)
        seeds = real[rng.integers(0, len(real), stop - start)]
        z = rng.standard_normal((stop - start, real.shape[1]), dtype=np.float32)
        x = seeds + alpha * (z @ a.T)
        out[start:stop] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return out


def metadata(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Reproducible synthetic metadata columns of ``n`` documents."""
    rng = np.random.default_rng(seed)
    return {
        "cat": rng.integers(0, 100, n),
        "year": rng.integers(2000, 2020, n),
        "open": rng.random(n) < 0.5,
    }


def build_docstore(path: Path, meta: dict[str, np.ndarray]) -> Any:
    """SQLite docstore whose row ``vid = i`` carries document ``i``'s metadata (no text)."""
    from heedrank.types import Document
    from heedrank.index.docstore import SQLiteDocStore

    store = SQLiteDocStore(path, create=True)
    n = len(meta["cat"])
    for start in range(0, n, 50_000):
        stop = min(n, start + 50_000)
        store.add_many(
            Document(str(i), "", "", {"cat": f"c{int(meta['cat'][i]):02d}", "year": int(meta["year"][i]),
                                      "open": bool(meta["open"][i])})
            for i in range(start, stop)
        )
    return store


def filter_pool(level: str, rng: np.random.Generator, size: int) -> list[dict[str, Any]]:
    """``size`` distinct filters of one selectivity level (see the module docstring)."""
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    while len(out) < size:
        if level == "0.1%":
            y = int(rng.integers(2000, 2019))
            f = {"must": [{"key": "cat", "match": {"value": f"c{int(rng.integers(100)):02d}"}},
                          {"key": "year", "range": {"gte": y, "lte": y + 1}}]}
        elif level == "1%":
            f = {"must": [{"key": "cat", "match": {"value": f"c{int(rng.integers(100)):02d}"}}]}
        elif level == "10%":
            cats = sorted(rng.choice(100, 10, replace=False).tolist())
            f = {"must": [{"key": "cat", "match": {"any": [f"c{c:02d}" for c in cats]}}]}
        elif level == "50%":
            f = {"must": [{"key": "open", "match": {"value": bool(len(out) % 2)}}]}
        else:
            f = {"must": [{"key": "year", "range": {"gte": 2000}}]}
        key = json.dumps(f, sort_keys=True)
        if key in seen:
            if level in ("50%", "100%") and len(seen) >= (2 if level == "50%" else 1):
                break
            continue
        seen.add(key)
        out.append(f)
    return out


# ------------------------------------------------------------------------------- bench
@dataclass
class Row:
    index: str
    strategy: str
    level: str
    recall: float
    short: float
    qps: float
    plan: str


@dataclass
class Result:
    title: str
    rows: list[Row] = field(default_factory=list)
    builds: list[tuple[str, str, float, float]] = field(default_factory=list)  # name, params, seconds, MB
    filters: dict[str, tuple[float, float, int]] = field(default_factory=dict)  # level: (selectivity, sql ms, pool)


def exact_truth(x: np.ndarray, q: np.ndarray, allowed: np.ndarray, k: int) -> list[set[int]]:
    """Exact filtered top-``k`` labels per query (numpy brute force, blocks of 200k)."""
    best_s = np.full((len(q), 0), -np.inf, dtype=np.float32)
    best_l = np.zeros((len(q), 0), dtype=np.int64)
    for start in range(0, len(allowed), 200_000):
        ids = allowed[start : start + 200_000]
        s = q @ x[ids].T
        s = np.concatenate([best_s, s], axis=1)
        lab = np.concatenate([best_l, np.broadcast_to(ids, (len(q), len(ids)))], axis=1)
        kk = min(k, s.shape[1])
        part = np.argpartition(-s, kk - 1, axis=1)[:, :kk]
        best_s, best_l = np.take_along_axis(s, part, 1), np.take_along_axis(lab, part, 1)
    return [set(row.tolist()) for row in best_l]


def index_size_mb(dense: Any) -> float:
    import faiss

    with tempfile.NamedTemporaryFile(suffix=".faiss", dir=os.environ.get("TMPDIR", "/tmp")) as f:
        faiss.write_index(dense.index, f.name)
        return os.path.getsize(f.name) / 2**20


def build(kind: str, x: np.ndarray, params: Any, threads: int, cache: Path | None = None) -> tuple[Any, float]:
    """Build (with ``threads`` faiss threads) or load from ``cache`` a vector index of ``x``."""
    import faiss

    from heedrank.index.dense import DenseIndex

    file = None
    if cache is not None:  # keyed on the data and the build parameters (not the search defaults)
        build_params = {k: v for k, v in params.to_dict().items() if k not in ("ef_search", "nprobe")}
        key = hashlib.sha256(x[:: max(1, len(x) // 1000)].tobytes() + json.dumps(build_params, sort_keys=True).encode())
        file = cache / f"{kind}-{len(x)}-{key.hexdigest()[:12]}.faiss"
        if file.is_file() and file.with_suffix(".json").is_file():
            secs = json.loads(file.with_suffix(".json").read_text())["build_seconds"]
            logger.info("  loading cached %s index %s (built in %.0f s)", kind, file, secs)
            return DenseIndex.load(file, params), float(secs)
    faiss.omp_set_num_threads(threads)
    t0 = time.perf_counter()
    labels = np.arange(len(x), dtype=np.int64)
    if kind != "hnsw" or len(x) <= 200_000:
        dense = DenseIndex.build(x, labels, params)
    else:  # add in chunks with a progress log
        dense = DenseIndex(x.shape[1], params)
        for start in range(0, len(x), 50_000):
            dense.add(x[start : start + 50_000], labels[start : start + 50_000])
            logger.info("  hnsw: %d / %d vectors added, %.0f s", min(len(x), start + 50_000), len(x),
                        time.perf_counter() - t0)
    secs = time.perf_counter() - t0
    if file is not None:
        file.parent.mkdir(parents=True, exist_ok=True)
        dense.save(file)
        file.with_suffix(".json").write_text(json.dumps({"build_seconds": secs, "params": params.to_dict()}))
    return dense, secs


def unfiltered_recall(dense: Any, q: np.ndarray, x: np.ndarray) -> float:
    """recall@10 of the index's default search without a filter (a check of its parameters)."""
    truth = exact_truth(x, q, np.arange(len(x), dtype=np.int64), K)
    rows = dense.search_ann(q, K)
    return float(np.mean([len(set(r[0].tolist()) & t) / len(t) for r, t in zip(rows, truth)]))


def run_strategy(dense: Any, strategy: str, q: np.ndarray, groups: list[tuple[np.ndarray, np.ndarray]],
                 truth: list[list[set[int]]], n_total: int) -> tuple[float, float, float, str]:
    from heedrank.index.planner import PlannerParams, planned_search

    recalls, shorts, plans = [], 0, {}
    n_queries = 0
    t = 0.0
    params = PlannerParams() if strategy == "planner" else PlannerParams(retry_exact=False)
    mode = "auto" if strategy == "planner" else "ann" if strategy == "selector" else "exact"
    for (allowed, qidx), tr in zip(groups, truth):
        m = len(allowed)
        filt = allowed  # every level goes through the filter path, 100 % included
        for j, qi in enumerate(qidx):
            t0 = time.perf_counter()
            if strategy == "selector":  # faiss's own filtered search, default efSearch/nprobe, no fallback
                rows = dense.search_ann(q[qi : qi + 1], K, allowed=filt)
                desc = "selector"
            else:
                rows, report = planned_search(dense, q[qi : qi + 1], K, allowed=filt, params=params, strategy=mode)
                p = report.plan
                desc = p.strategy + (f" ef={p.ef_search}" if p.ef_search and p.strategy == "ann" else "") + (
                    f" nprobe={p.nprobe}" if p.nprobe and p.strategy == "ann" else "") + (
                    " +retry" if report.retried else "")
            t += time.perf_counter() - t0
            ids = rows[0][0]
            want = min(K, m)
            shorts += len(ids) < want
            recalls.append(len(set(ids.tolist()) & tr[j]) / max(1, len(tr[j])))
            plans[desc] = plans.get(desc, 0) + 1
            n_queries += 1
    top = sorted(plans.items(), key=lambda kv: -kv[1])
    plan = ", ".join(f"{d} {100 * c / n_queries:.0f}%" for d, c in top[:2])
    return float(np.mean(recalls)), shorts / n_queries, n_queries / t, plan


def bench_set(title: str, x: np.ndarray, q: np.ndarray, work: Path, configs: dict[str, Any],
              pool: int, threads: int, index_cache: Path | None = None, seed: int = 0) -> Result:
    import faiss

    res = Result(title)
    n = len(x)
    logger.info("[%s] metadata + SQLite docstore of %d documents", title, n)
    t0 = time.perf_counter()
    store = build_docstore(work / f"meta-{n}.sqlite", metadata(n, seed))
    logger.info("[%s] docstore built in %.0f s", title, time.perf_counter() - t0)
    rng = np.random.default_rng(seed + 1)
    groups: dict[str, list[tuple[np.ndarray, np.ndarray]]] = {}
    for level in LEVELS:
        filters = filter_pool(level, rng, pool)
        ids, times = [], []
        for f in filters:
            t1 = time.perf_counter()
            ids.append(store.filter_vids(f))
            times.append(time.perf_counter() - t1)
        assign = np.arange(len(q)) % len(filters)
        groups[level] = [(ids[i], np.flatnonzero(assign == i)) for i in range(len(filters))]
        sel = float(np.mean([len(a) for a in ids])) / n
        res.filters[level] = (sel, 1000 * float(np.median(times)), len(filters))
        logger.info("[%s] %s: %d filters, selectivity %.4f%%, SQL %.1f ms", title, level, len(filters), 100 * sel,
                    1000 * float(np.median(times)))
    store.close()
    truth = {}
    for level in LEVELS:
        truth[level] = [exact_truth(x, q[qidx], allowed, K) for allowed, qidx in groups[level]]
    logger.info("[%s] ground truth done", title)
    for name, params in configs.items():
        kind = params.index_type
        logger.info("[%s] building %s %s", title, name, params)
        dense, secs = build(kind, x, params, threads, index_cache)
        faiss.omp_set_num_threads(1)  # one query per call: no thread fan-out (the machine is shared)
        mb = index_size_mb(dense)
        if kind != "flat":
            logger.info("[%s] %s unfiltered recall@10 with its defaults: %.3f", title, name,
                        unfiltered_recall(dense, q, x))
        desc = {"flat": "IndexFlatIP", "hnsw": f"M={params.hnsw_m} efC={params.ef_construction} efS={params.ef_search}",
                "ivf": f"nlist={dense.params.nlist} nprobe={params.nprobe}"}[kind]
        res.builds.append((name, desc, secs, mb))
        logger.info("[%s] %s built in %.1f s, %.0f MB", title, name, secs, mb)
        strategies = ["exact"] if kind == "flat" else ["selector", "planner"]
        for strategy in strategies:
            for level in LEVELS:
                recall, short, qps, plan = run_strategy(dense, strategy, q, groups[level], truth[level], n)
                res.rows.append(Row(name, strategy, level, recall, short, qps, plan))
                logger.info("[%s] %s/%s %s: recall %.3f short %.1f%% %.0f q/s (%s)", title, name, strategy, level,
                            recall, 100 * short, qps, plan)
        del dense
        gc.collect()
    return res


def format_result(res: Result) -> str:
    lines = [f"### {res.title}", "", "| index | parameters | build s | size MB |", "|---|---|---|---|"]
    for name, desc, secs, mb in res.builds:
        lines.append(f"| {name} | {desc} | {secs:.1f} | {mb:.0f} |")
    lines += ["", "| level | actual selectivity | filters | filter SQL ms (median) |", "|---|---|---|---|"]
    for level, (sel, ms, count) in res.filters.items():
        lines.append(f"| {level} | {100 * sel:.3f}% | {count} | {ms:.1f} |")
    lines += ["", "| index / strategy | " + " | ".join(LEVELS) + " |", "|---|" + "---|" * len(LEVELS)]
    by = {(r.index, r.strategy, r.level): r for r in res.rows}
    for name, strat in dict.fromkeys((r.index, r.strategy) for r in res.rows):
        for metric, fmt in (("recall@10", "{:.3f}"), ("short", "{:.1%}"), ("q/s", "{:.0f}")):
            cells = []
            for level in LEVELS:
                r = by.get((name, strat, level))
                value = None if r is None else {"recall@10": r.recall, "short": r.short, "q/s": r.qps}[metric]
                cells.append("-" if value is None else fmt.format(value))
            lines.append(f"| {name}/{strat} {metric} | " + " | ".join(cells) + " |")
    lines += ["", "| index / strategy | " + " | ".join(f"plan at {lv}" for lv in LEVELS) + " |",
              "|---|" + "---|" * len(LEVELS)]
    for name, strat in dict.fromkeys((r.index, r.strategy) for r in res.rows):
        if strat == "planner":
            lines.append(f"| {name}/{strat} | " + " | ".join(by[(name, strat, lv)].plan for lv in LEVELS) + " |")
    return "\n".join(lines) + "\n"


def machine() -> str:
    import faiss

    cpu = "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{cpu}, {os.cpu_count()} cores, {mem:.0f} GB RAM; Python {platform.python_version()}, "
            f"faiss {faiss.__version__} ({faiss.omp_get_max_threads()} threads), numpy {np.__version__}")


def main(argv: list[str] | None = None) -> int:
    from heedrank.index.dense import DenseParams

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="14k,1m", help="comma list of 14k, 1m")
    ap.add_argument("--queries", type=int, default=366, help="queries used (of the 366 real ones)")
    ap.add_argument("--n-synthetic", type=int, default=1_000_000)
    ap.add_argument("--pool", type=int, default=12, help="distinct filters per selectivity level")
    ap.add_argument("--threads", type=int, default=2, help="faiss threads while building (searches use 1)")
    ap.add_argument("--params-14k", default="hnsw_m=32,ef_construction=100,ef_search=128,nprobe=32",
                    help="DenseParams of the 14k HNSW / IVF indexes")
    ap.add_argument("--params-1m", default="hnsw_m=32,ef_construction=100,ef_search=512,nprobe=160",
                    help="DenseParams of the 1M HNSW / IVF indexes")
    ap.add_argument("--extra-hnsw-1m", default="hnsw_m=16,ef_construction=40,ef_search=1024",
                    help="a second, cheaper HNSW on the 1M set ('' = none)")
    ap.add_argument("--queries-1m", type=int, default=200, help="queries used on the 1M set")
    ap.add_argument("--cache", type=Path, default=None)
    ap.add_argument("--index-cache", type=Path, default=None, help="save / reuse built indexes here")
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--out", type=Path, default=None, help="append the tables to this markdown file")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", stream=sys.stderr)
    import faiss
    import torch

    faiss.omp_set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    if args.index_cache is not None:
        args.index_cache.mkdir(parents=True, exist_ok=True)
    cache = args.cache or default_cache()
    ids, texts, queries = real_corpus(args.data)
    q = embed([t for _, t in queries], cache, "queries")[: args.queries]
    x_real = embed(texts, cache, "docs")
    sizes = [s.strip().lower() for s in args.sizes.split(",") if s.strip()]

    def parse(spec: str) -> dict[str, int]:
        return {k.strip(): int(v) for k, v in (item.split("=") for item in spec.split(",") if item.strip())}

    def configs(spec: str, extra_hnsw: str = "") -> dict[str, Any]:
        kw = parse(spec)
        out = {"flat": DenseParams("flat"), "hnsw": DenseParams("hnsw", **kw)}
        if extra_hnsw:
            e = parse(extra_hnsw)
            out[f"hnsw-m{e.get('hnsw_m', 32)}"] = DenseParams("hnsw", **e)
        out["ivf"] = DenseParams("ivf", **kw)
        return out
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = [f"## Filtered vector search, {stamp}", "", f"Machine: {machine()}.", "",
           f"k = {K}; real queries, one per call, faiss with 1 thread while searching ({args.threads} while "
           "building); recall@10 against exact filtered search (numpy brute force); short = fewer than "
           "min(k, matching) hits; q/s = single-query wall time, excluding the filter's SQL (timed apart). "
           f"Command: `python bench/filtered_search.py {' '.join(argv if argv is not None else sys.argv[1:])}`.", ""]
    with tempfile.TemporaryDirectory(dir=str(cache)) as tmp:
        work = Path(tmp)
        for size in sizes:
            if size == "14k":
                res = bench_set(f"{len(x_real):,} real vectors (NFCorpus + DL19 passages, all-MiniLM-L6-v2, d=384), "
                                f"{len(q)} real queries", x_real, q, work, configs(args.params_14k), args.pool,
                                args.threads, args.index_cache)
            elif size == "1m":
                t0 = time.perf_counter()
                x = synthetic(x_real, args.n_synthetic)
                logger.info("synthetic set of %d vectors in %.0f s", len(x), time.perf_counter() - t0)
                q1 = q[: args.queries_1m]
                res = bench_set(f"{len(x):,} synthetic clustered vectors (d=384), {len(q1)} real queries", x, q1, work,
                                configs(args.params_1m, args.extra_hnsw_1m), args.pool, args.threads, args.index_cache)
                del x
            else:
                raise SystemExit(f"unknown size {size!r}")
            table = format_result(res)
            print(table, flush=True)
            out.append(table)
    text = "\n".join(out)
    if args.out is not None:
        with open(args.out, "a", encoding="utf-8") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

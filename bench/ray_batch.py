"""rerank-batch on the local engine vs Ray (1 and 2 actors) on the same DL19 queries, Ray's
fixed overhead, and the BlockRank block-encoding rate (the KV store's per-document cost).

Each configuration runs in its own process (cold: its own torch threads, LM load and, for
Ray, its own ``ray.init``) and writes one JSON line; all outputs must be byte-identical.

    .venv/bin/python bench/ray_batch.py --queries 6 --candidates 20 --method icr --out runs/bench-ray
    .venv/bin/python bench/ray_batch.py --encode 128      # block-encoding docs/s at l*=15, 96 tokens

On 2 shared cores the point is correctness and the scaling path, not a speed-up.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DL19 = Path(os.environ.get("HEEDRANK_SHARED_DATA", ROOT.parent / "shared" / "data")) / "msmarco-trec-dl-2019-passage"

CONFIGS = {  # name -> (engine, torch threads (local) / actors, CPUs per actor)
    "local-2t": ("local", 2, None),
    "local-1t": ("local", 1, None),
    "ray-1x1": ("ray", 1, 1.0),
    "ray-2x1": ("ray", 2, 1.0),
    "ray-1x2": ("ray", 1, 2.0),
}


def _inputs(out: Path, queries: int, depth: int) -> tuple[Path, Path, Path]:
    sys.path.insert(0, str(ROOT / "tests" / "eval"))
    from ray_fakes import dl19_batch_inputs

    out.mkdir(parents=True, exist_ok=True)
    return dl19_batch_inputs(DL19, out, queries=queries, depth=depth)


def run_one(name: str, args: argparse.Namespace) -> dict:
    from heedrank.config import RerankerConfig
    from heedrank.eval.batch import rerank_batch

    engine, n, cpus = CONFIGS[name]
    out_dir = Path(args.out)
    topics, run, docs = _inputs(out_dir, args.queries, args.depth)
    out = out_dir / f"{name}.trec"
    eng = None
    if engine == "local":
        import torch

        torch.set_num_threads(n)
    else:
        from heedrank.engine import EngineOptions
        from heedrank.engine.ray import RayEngine

        eng = RayEngine(EngineOptions(engine="ray", actors=n, num_cpus=cpus))
    t0 = time.perf_counter()
    summary = rerank_batch(topics, run, docs, out, method=args.method, candidates=args.candidates, overwrite=True,
                           show_progress=False, engine=eng, reranker_config=RerankerConfig(method=args.method))
    wall = time.perf_counter() - t0
    recs = [json.loads(line) for line in (out_dir / f"{name}.trec.progress").read_text().splitlines()[1:]]
    per_query = [r["seconds"] for r in recs]
    row = {"config": name, "engine": engine, "queries": summary.done, "wall_s": wall,
           "statuses": sorted({r["status"] for r in recs})}  # all "reranked", or the figures mean nothing
    if eng is None:
        first = wall - sum(per_query[1:])  # start, LM load and the first query
        steady = sum(per_query[1:])
        row.update(threads=n, first_result_s=first, steady_s=steady)
    else:
        s = eng.last_stats
        row.update(actors=n, cpus_per_actor=cpus, ray_init_s=s.init_seconds, prepare_s=s.prepare_seconds,
                   first_result_s=s.init_seconds + s.first_result_seconds, lm_load_s=s.load_seconds,
                   steady_s=s.steady_seconds)
    row["steady_qps"] = (summary.done - 1) / row["steady_s"] if row["steady_s"] > 0 else None
    row["qps_incl_overhead"] = summary.done / wall
    return row


def encode_rate(n_docs: int, layer: int = 15, max_doc_tokens: int = 96, batch_size: int = 32) -> list[dict]:
    """Documents/s of :func:`heedrank.reranker.doccache.encode_blocks` on DL19 passages."""
    import torch

    from heedrank.data import load_run_json
    from heedrank.reranker.doccache import build_layout, document_block, encode_blocks, instruction_kv
    from heedrank.reranker.lm import load_lm

    lm = load_lm()
    _, docs, _ = load_run_json(DL19 / "retrieve_results_BM25_dl19_top100.json.gz")
    layout = build_layout(lm.tokenizer, max_doc_tokens)
    blocks = [document_block(lm.tokenizer, layout, d.content)[0] for d in list(docs.values())[:n_docs]]
    kv0 = instruction_kv(lm, layout.instruction_ids, layer)
    rows = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        encode_blocks(lm, kv0, blocks[:batch_size], layer, batch_size=batch_size)  # warm-up
        t0 = time.perf_counter()
        encode_blocks(lm, kv0, blocks, layer, batch_size=batch_size)
        dt = time.perf_counter() - t0
        rows.append({"threads": threads, "docs": len(blocks), "seconds": dt, "docs_per_s": len(blocks) / dt,
                     "mean_block_tokens": sum(map(len, blocks)) / len(blocks), "layer": layer,
                     "max_doc_tokens": max_doc_tokens})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--queries", type=int, default=6)
    p.add_argument("--depth", type=int, default=30, help="Run hits per query.")
    p.add_argument("--candidates", type=int, default=20)
    p.add_argument("--method", default="blockrank")
    p.add_argument("--out", default="runs/bench-ray")
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--encode", type=int, default=0, help="Only measure block encoding on this many passages.")
    args = p.parse_args()
    if args.encode:
        for row in encode_rate(args.encode):
            print(json.dumps(row), flush=True)
        return
    if args.one:
        print("RESULT " + json.dumps(run_one(args.one, args)), flush=True)
        return
    rows = []
    for name in args.configs.split(","):
        cmd = [sys.executable, __file__, "--one", name, "--queries", str(args.queries), "--depth", str(args.depth),
               "--candidates", str(args.candidates), "--method", args.method, "--out", args.out]
        proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
        line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            sys.stderr.write(proc.stderr[-4000:])
            raise SystemExit(f"{name} failed")
        rows.append(json.loads(line[7:]))
        print(json.dumps(rows[-1]), flush=True)
    outs = {r["config"]: (Path(args.out) / f"{r['config']}.trec").read_bytes() for r in rows}
    print("byte-identical outputs:", len(set(outs.values())) == 1,
          "; all queries reranked:", all(r["statuses"] == ["reranked"] for r in rows))


if __name__ == "__main__":
    main()

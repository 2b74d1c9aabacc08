"""``heedrank lab heads``: query-focused retrieval heads of ICR: save attention dumps, detect
the heads, fit per-head weights; and ``heedrank lab ablation``, the ICR variants they allow
(all/QR/learned heads x ReAttn x fusion) from one pass per query."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from heedrank.cli.options import DeviceOpt, MaxDocTokensOpt, ModelOpt, SeedOpt, reranker_config
from heedrank.config import RerankerConfig

EXAMPLES = """\
Examples:

  heedrank lab heads detect --data data/beir-nfcorpus --out heads/nfcorpus.json --split train --queries 128
  heedrank lab heads fit --dump heads/nfcorpus.dump --heads heads/nfcorpus.json
  heedrank lab heads dump --data data/beir-nfcorpus --split test --out dumps/test --queries 100
  heedrank lab ablation --dump dumps/test --heads heads/nfcorpus.json --data data/beir-nfcorpus
"""

app = typer.Typer(help="Query-focused retrieval heads: detect, fit weights.", epilog=EXAMPLES, no_args_is_help=True)


def _dump(data: Path, source: str, split: str, queries: Optional[int], candidates: int, seed: int,
          index: Optional[Path], run: str, shuffle: bool, ensure_gold: bool, out: Path, cfg: RerankerConfig) -> Path:
    from heedrank.lab.candidates import beir_candidates, trec_dl_candidates
    from heedrank.lab.head_study import dump_attention

    if source == "beir":
        qs, cands, scores, qrels = beir_candidates(
            data, split, queries=queries, candidates=candidates, seed=seed, index_dir=index, ensure_gold=ensure_gold
        )
        info: dict[str, Any] = {"dataset": data.resolve().name, "split": split, "first_stage": "bm25"}
    else:
        qs, cands, scores, qrels = trec_dl_candidates(data, run_name=run, candidates=candidates, queries=queries, seed=seed,
                                                      split=split)
        info = {"dataset": data.resolve().name, "split": split, "first_stage": run}
    info.update(candidates=candidates, queries=len(qs))
    return dump_attention(out, qs, cands, scores, qrels, reranker_config=cfg, shuffle=shuffle, seed=seed, info=info)


@app.command("dump")
def heads_dump(
    data: Annotated[Path, typer.Option("--data", help="BEIR dataset folder, or the TREC DL folder with --source trec-dl.")],
    out: Annotated[Path, typer.Option("--out", help="Dump directory (resumable).")],
    source: Annotated[str, typer.Option("--source", help="beir or trec-dl.")] = "beir",
    split: Annotated[str, typer.Option("--split")] = "test",
    queries: Annotated[Optional[int], typer.Option("--queries", help="Seeded subset size.")] = None,
    candidates: Annotated[int, typer.Option("--candidates")] = 20,
    seed: SeedOpt = 0,
    index: Annotated[Optional[Path], typer.Option("--index")] = None,
    run: Annotated[str, typer.Option("--run", help="TREC DL first-stage run.")] = "BM25",
    shuffle: Annotated[bool, typer.Option("--shuffle/--first-stage-order")] = False,
    model: ModelOpt = None,
    max_doc_tokens: MaxDocTokensOpt = None,
    device: DeviceOpt = "cpu",
) -> None:
    """Save one ICR pass per query (per-head calibrated token attention) for detection and ablations."""
    cfg = reranker_config("icr", model, max_doc_tokens, device)
    path = _dump(data, source, split, queries, candidates, seed, index, run, shuffle, False, out, cfg)
    typer.echo(f"dump written to {path}")


@app.command("detect")
def heads_detect(
    data: Annotated[Path, typer.Option("--data", help="BEIR-layout dataset folder.")],
    out: Annotated[Path, typer.Option("--out", help="Head-set JSON to write.")],
    split: Annotated[str, typer.Option("--split", help="Detection split (train; never test).")] = "train",
    queries: Annotated[int, typer.Option("--queries")] = 128,
    candidates: Annotated[int, typer.Option("--candidates")] = 20,
    top_k: Annotated[int, typer.Option("--top-k", help="Heads kept.")] = 16,
    method: Annotated[str, typer.Option("--method", help="qrscore or ndcg.")] = "qrscore",
    seed: SeedOpt = 0,
    index: Annotated[Optional[Path], typer.Option("--index")] = None,
    dump: Annotated[Optional[Path], typer.Option("--dump", help="Dump directory (default: next to --out).")] = None,
    model: ModelOpt = None,
    max_doc_tokens: MaxDocTokensOpt = None,
    device: DeviceOpt = "cpu",
) -> None:
    """Detect query-focused heads: BM25 candidates shuffled with the gold always included, per-head scores, top-k."""
    from heedrank.lab.train.icr_heads import detect_heads

    cfg = reranker_config("icr", model, max_doc_tokens, device)
    dump = dump or out.with_suffix(".dump")
    _dump(data, "beir", split, queries, candidates, seed, index, "BM25", True, True, dump, cfg)
    hs = detect_heads(dump, method=method, top_k=top_k)
    hs.save(out)
    typer.echo(json.dumps({"heads": [list(h) for h in hs.heads], "detection": dict(hs.detection)}, indent=1))


@app.command("fit")
def heads_fit(
    dump: Annotated[Path, typer.Option("--dump", help="Dump of a train split (e.g. the detection dump).")],
    heads: Annotated[Path, typer.Option("--heads", help="Head-set JSON; weights are added to it.")],
    max_layer: Annotated[Optional[int], typer.Option("--max-layer", help="Deepest layer weighted (default: deepest QR head).")] = None,
    epochs: Annotated[int, typer.Option("--epochs")] = 200,
    lr: Annotated[float, typer.Option("--lr")] = 0.05,
    l2: Annotated[float, typer.Option("--l2")] = 1e-3,
    support: Annotated[str, typer.Option("--support", help="qr: re-weight the selected heads; all: every head up to --max-layer.")] = "qr",
    nonneg: Annotated[bool, typer.Option("--nonneg/--signed", help="Keep weights >= 0.")] = True,
) -> None:
    """Learn per-head weights with the group contrastive loss (used with heads=learned)."""
    from heedrank.lab.train.icr_heads import fit_head_weights

    hs = fit_head_weights(dump, heads, max_layer=max_layer, epochs=epochs, lr=lr, l2=l2, support=support,
                          nonneg=nonneg)
    typer.echo(json.dumps(dict(hs.weights_info), indent=1))


def lab_ablation(
    dump: Annotated[Path, typer.Option("--dump", help="Attention dump of the evaluated queries (first-stage order).")],
    heads: Annotated[Path, typer.Option("--heads", help="Head-set JSON (with learned weights, if fitted).")],
    out: Annotated[Optional[Path], typer.Option("--out", help="JSON report.")] = None,
    data: Annotated[Optional[Path], typer.Option(
        "--data", help="Dataset folder whose qrels score the runs (BEIR folder or TREC DL folder); "
        "without it only the candidates' own labels are known (within-candidates nDCG).")] = None,
    split: Annotated[str, typer.Option("--split", help="BEIR qrels split.")] = "test",
) -> None:
    """ICR variants (all/QR/learned heads x ReAttn x RRF fusion) from one pass per query, with paired tests."""
    from heedrank.lab.head_study import ablation, format_ablation

    qrels = None
    if data is not None:
        from heedrank.data import load_beir_qrels
        from heedrank.eval.sets import load_candidate_set

        qrels = load_beir_qrels(data, split) if (data / "qrels").is_dir() else load_candidate_set(data, split="all").qrels
    result = ablation(dump, heads, qrels=qrels)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1, default=str))
    typer.echo(format_ablation(result))

"""``heedrank eval study-dump`` and ``eval study-fit``: per-candidate attention features of
cached BlockRank from one pass per query, and the fit and comparison of scorers on them
(learned head weights, fusion with the first stage). Registered in the ``eval`` group
(:mod:`heedrank.cli.eval`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from heedrank.cli.options import DeviceOpt, MaxDocTokensOpt, ModelOpt, SeedOpt, reranker_config


def eval_study_dump(
    out: Annotated[Path, typer.Option("--out", help="Feature dump to write (.npz); a rerun resumes it.")],
    data: Annotated[Path, typer.Option("--data", help="BEIR folder, or a TREC DL folder with --trec-run.")],
    split: Annotated[str, typer.Option("--split", help="BEIR split.")] = "test",
    retriever: Annotated[str, typer.Option("--retriever", help="BEIR first stage: bm25, dense or hybrid.")] = "hybrid",
    trec_run: Annotated[Optional[str], typer.Option("--trec-run", help="TREC DL run name (e.g. BM25): "
                                                    "candidates from its top-100 JSON.")] = None,
    candidates: Annotated[int, typer.Option("--candidates")] = 50,
    max_queries: Annotated[Optional[int], typer.Option("--max-queries", help="Seeded subset of queries.")] = None,
    query_ids: Annotated[Optional[Path], typer.Option("--query-ids", help="Only these queries (a text file, one id "
                                                      "per line), e.g. the held-out calibration queries.")] = None,
    seed: SeedOpt = 0,
    index: Annotated[Optional[Path], typer.Option("--index", help="Index directory (BEIR); its document KV store "
                                                  "serves the blocks.")] = None,
    layer: Annotated[int, typer.Option("--layer", help="l*: layers 0..l* are read.")] = 15,
    max_doc_tokens: MaxDocTokensOpt = 128,
    kv_dtype: Annotated[str, typer.Option("--kv-dtype", help="dtype of the index's document KV store.")] = "float16",
    model: ModelOpt = None,
    device: DeviceOpt = "cpu",
    adapter: Annotated[Optional[Path], typer.Option("--adapter", help="Query adapter (heedrank train query-adapter "
                                                    "output, e.g. OUT/best) applied to the query passes.")] = None,
    block_store: Annotated[Optional[Path], typer.Option(
        "--store", help="Writable document KV store for candidates without an index store (TREC DL): blocks are "
        "computed once and kept there for later dumps.")] = None,
    document_adapter: Annotated[Optional[Path], typer.Option(
        "--document-adapter", help="Document-side adapter (`train query-adapter --tower document`): candidate "
        "blocks are encoded with it, never read from the index's base-model store (give --store).")] = None,
    variant: Annotated[Optional[list[str]], typer.Option(
        "--variant", help="NAME=BELOW[:adapter] (repeatable): features calibrated@NAME of a query pass whose layers "
        "< BELOW do not attend to the candidates (0: today's pass; l*+1 or 'none': no layer does, the probe "
        "store), on the base LM or, with ':adapter', the query adapter's (packaged unless --adapter).")] = None,
) -> None:
    """Per-candidate attention features of cached BlockRank (calibrated per layer and head,
    signal per head, the served calibrated score), first-stage scores and qrels, from ONE
    pass per query: the input of `heedrank eval study-fit` (docs/RESULTS.md, "Training and fusion study")."""
    from heedrank.eval.heads import beir_candidates, trec_dl_candidates
    from heedrank.eval.study import dump_features
    from heedrank.registry import build_reranker

    config = reranker_config("blockrank-cached", model, max_doc_tokens, device, None).with_options(
        layer=layer, scoring="calibrated", kv_dtype=kv_dtype, query_adapter=None)
    variants = _variants(variant or [], layer)
    if adapter is not None:  # the reranker loads it on a private copy of the LM (option query_adapter)
        config = config.with_options(query_adapter=str(adapter))
    elif any(which == "adapter" for which, _ in variants.values()):
        config = config.with_options(query_adapter="packaged")
    if document_adapter is not None:
        config = config.with_options(document_adapter=str(document_adapter))
    reranker = build_reranker(config)
    store = None
    if trec_run:
        queries, cands, scores, qrels = trec_dl_candidates(data, run_name=trec_run, candidates=candidates,
                                                           queries=max_queries, seed=seed)
        source = {"data": str(data), "run": trec_run}
    else:
        queries, cands, scores, qrels = beir_candidates(data, split, queries=max_queries, candidates=candidates,
                                                        seed=seed, index_dir=index, retriever=retriever)
        source = {"data": str(data), "split": split, "retriever": retriever}
        if index is not None and (index / "kv" / "header.json").exists() and document_adapter is None:
            from heedrank.index.kv import KVStore

            # read-only: several dumps may read one store at once (blocks it lacks are computed, not stored)
            store = KVStore.open(index / "kv", reranker.block_store_header(), readonly=True)
    if query_ids is not None:
        wanted = {line.strip() for line in query_ids.read_text(encoding="utf-8").splitlines() if line.strip()}
        queries = [q for q in queries if q.query_id in wanted]
    if store is None and block_store is not None:
        from heedrank.index.kv import KVStore

        store = KVStore.open_or_create(block_store, reranker.block_store_header())
    meta = {**source, "candidates": candidates, "layer": layer, "max_doc_tokens": max_doc_tokens,
            "variants": {name: list(v) for name, v in variants.items()},
            "reranker": reranker.describe(),
            "adapter": reranker.describe().get("query_adapter"), "qrels": {q.query_id: dict(qrels.get(q.query_id, {})) for q in queries}}
    try:
        items = dump_features(out, queries, cands, scores, qrels, reranker, block_store=store, meta=meta,
                              variants=variants or None)
    finally:
        if store is not None:
            store.close()
    typer.echo(json.dumps({"out": str(out), "queries": len(items)}))


def _variants(specs: list[str], layer: int) -> dict[str, tuple[str, int]]:
    """``--variant NAME=BELOW[:adapter]`` values as ``{name: (lm, below)}``."""
    out: dict[str, tuple[str, int]] = {}
    for item in specs:
        name, sep, rest = item.partition("=")
        below, _, which = rest.partition(":")
        if not sep or not name or which not in ("", "adapter") or not (below == "none" or below.isdigit()):
            raise typer.BadParameter(f"expected NAME=BELOW[:adapter] (BELOW a layer count or 'none'), got {item!r}",
                                     param_hint="--variant")
        out[name] = (which or "base", layer + 1 if below == "none" else int(below))
    return out


def eval_study_fit(
    dev: Annotated[Path, typer.Option("--dev", help="Dev dump: every choice is made on it.")],
    test: Annotated[list[str], typer.Option("--test", help="NAME=DUMP test sets (repeatable).")],
    train: Annotated[Optional[list[Path]], typer.Option("--train", help="Training feature dumps (repeatable); "
                                                        "none: only zero-shot and --fixed-weights variants.")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", help="Write the report (JSON) here.")] = None,
    epochs: Annotated[int, typer.Option("--epochs")] = 150,
    export: Annotated[Optional[Path], typer.Option("--export", help="Write the learned head weights (pure reranker) "
                                                   "as a weights card for --opt scoring=learned.")] = None,
    loss: Annotated[str, typer.Option("--loss", help="listwise (softmax, every positive), pairwise (RankNet) or "
                                      "lambdarank (pairs weighted by |delta nDCG@10|).")] = "listwise",
    temperature: Annotated[float, typer.Option("--temperature", help="Scores are divided by it in the loss.")] = 1.0,
    max_layer: Annotated[Optional[int], typer.Option("--max-layer", help="Use layers 0..N only: the model a store "
                                                     "with l* = N serves (exact: the query pass is causal in depth).")] = None,
    layer_set: Annotated[Optional[str], typer.Option(
        "--layers", help="Comma-separated layers to use (e.g. 13,15): the layers a probe store would keep; "
        "overrides --max-layer.")] = None,
    features: Annotated[Optional[str], typer.Option(
        "--features", help="Variant NAME of a dump written with --variant: its calibrated@NAME and raw@NAME "
        "features are the ones fitted and scored.")] = None,
    fixed_weights: Annotated[Optional[list[str]], typer.Option(
        "--fixed-weights", help="NAME=PATH head weights scored as given (repeatable): a weights card (.json) or a "
        "query adapter folder (its trained weights, else the model's shipped card).")] = None,
) -> None:
    """Fit and compare the study's variants (zero-shot scorers, learned head weights, fusion
    with the first stage): choices on dev only, then nDCG@10 with paired randomization tests
    against the first stage on each test set."""
    from heedrank.eval.study import format_study, load_items, run_study, with_features

    train = train or []

    def load(path: Path) -> tuple[dict, list]:
        meta, items = load_items(path)
        if features is None:
            return meta, items
        try:
            return meta, with_features(items, features)
        except KeyError as exc:
            raise typer.BadParameter(f"dump {path}: {exc.args[0]}", param_hint="--features") from None

    train_items = [it for path in train for it in load(path)[1]]
    fixed = {}
    for item in fixed_weights or []:
        name, sep, path = item.partition("=")
        if not sep:
            raise typer.BadParameter(f"expected NAME=PATH, got {item!r}", param_hint="--fixed-weights")
        fixed[name] = _fixed_weights(Path(path))
    dev_meta, dev_items = load(dev)
    tests = {}
    for item in test:
        name, sep, path = item.partition("=")
        if not sep:
            raise typer.BadParameter(f"expected NAME=DUMP, got {item!r}", param_hint="--test")
        meta, items = load(Path(path))
        tests[name] = (items, meta["qrels"])
    if loss not in ("listwise", "pairwise", "lambdarank"):
        raise typer.BadParameter(f"expected listwise, pairwise or lambdarank, got {loss!r}", param_hint="--loss")
    layers = list(range(max_layer + 1)) if max_layer is not None else None
    if layer_set:
        layers = sorted({int(x) for x in layer_set.split(",")})
    report = run_study(train_items, dev_items, dev_meta["qrels"], tests, epochs=epochs, loss=loss,
                       temperature=temperature, layers=layers, fixed=fixed)
    report["fit"] = {"loss": loss, "temperature": temperature, "layers": layers, "features": features}
    report["train"] = {"dumps": [str(p) for p in train], "queries": len(train_items)}
    if out is not None:
        out.write_text(json.dumps(report, indent=1))
    if export is not None:
        from heedrank.eval.study import weights_card

        if not train:
            raise typer.BadParameter("--export writes the learned head weights: give --train dumps", param_hint="--export")
        card = weights_card(report, dev_meta, command="heedrank eval study-fit " + " ".join(
            [f"--train {p}" for p in train] + [f"--dev {dev}"] + [f"--test {t}" for t in test]
            + [f"--loss {loss}", f"--temperature {temperature:g}"]
            + ([f"--max-layer {max_layer}"] if max_layer is not None else []) + [f"--export {export}"]))
        card["fit"] = report["fit"]
        variant_of = (dev_meta.get("variants") or {}).get(features or "")
        below = int(variant_of[1]) if variant_of else 0
        if features and below > int(dev_meta.get("layer", 0)):  # fitted on the probe pass: a probe store's card
            card["attend"] = "none"
            card["layers"] = layers or list(range(int(dev_meta["layer"]) + 1))
        elif features and layers is not None:  # attend from layer m (0: all), read layers: a window store's card
            card["attend"] = below if below > 0 else "all"
            card["layers"] = layers
        elif layers is not None and layers != list(range(int(dev_meta.get("layer", 0)) + 1)):
            raise typer.BadParameter("a card for the full store weighs layers 0..l*: --layers needs a probe or "
                                     "window variant (--features)", param_hint="--layers")
        export.write_text(json.dumps(card, indent=1))
    typer.echo(format_study(report))


def _fixed_weights(path: Path) -> list[float]:
    """Head weights of a weights card (``.json``) or of a query adapter folder (its trained
    ``scorer.weights``, else the shipped card of its model)."""
    from heedrank.errors import NotFoundError

    if path.is_dir():
        from safetensors.numpy import load_file

        tensors = load_file(str(path / "adapter.safetensors"))
        if "scorer.weights" in tensors:
            return tensors["scorer.weights"].astype(float).tolist()
        from heedrank.reranker.heads import packaged_data_dir

        card = json.loads((path / "adapter.json").read_text())
        path = packaged_data_dir() / f"{card['model']['name']}.blockrank-cached.json"
    if not path.is_file():
        raise NotFoundError(f"no weights at {path}: pass a weights card (.json) or a query adapter folder")
    return [float(x) for x in json.loads(path.read_text())["weights"]]


def eval_calibrate(
    card: Annotated[Path, typer.Option("--card", help="Weights card whose learned scorer and fusion weight are "
                                       "calibrated; --write adds the calibration to it.")],
    calibrate: Annotated[list[Path], typer.Option("--calibrate", help="Dumps of queries the reranker was NOT trained "
                                                  "on: the maps are fitted on them (repeatable).")],
    dev: Annotated[Path, typer.Option("--dev", help="Dev dump: the thresholds and the fixed top-k are chosen on it.")],
    test: Annotated[Optional[list[str]], typer.Option(
        "--test", help="NAME=DUMP[@MIN_GRADE] test sets (repeatable; MIN_GRADE: the lowest relevant grade, default "
        "1; 2 for TREC DL's binary measures).")] = None,
    exclude: Annotated[Optional[list[Path]], typer.Option(
        "--exclude", help="Dumps whose queries are dropped from --calibrate (the reranker's training queries).")] = None,
    features: Annotated[Optional[str], typer.Option("--features", help="Dump variant NAME (calibrated@NAME).")] = None,
    counts: Annotated[str, typer.Option("--counts", help="Candidate counts the maps are fitted and chosen at: the "
                                        "first stage's top N of each dump.")] = "10,20,30,50",
    test_counts: Annotated[str, typer.Option("--test-counts", help="Counts measured on test sets ('all': every "
                                             "candidate of the dump).")] = "20,all",
    write: Annotated[bool, typer.Option("--write/--no-write", help="Write the calibration into --card.")] = False,
    out: Annotated[Optional[Path], typer.Option("--out", help="Write the report (JSON) here.")] = None,
) -> None:
    """The relevance cut-off: served scores mapped to P(relevant) (Platt scaling, one map per
    serving mode), thresholds ("auto") chosen on dev for mean F1, then precision, recall and F1
    at the cut-off against the best fixed top-k (also chosen on dev) on each test set."""
    from heedrank.calibration import MODES
    from heedrank.eval.calibration import evaluate_cutoff, fit_calibration
    from heedrank.eval.study import load_items, with_features

    card_data = json.loads(card.read_text(encoding="utf-8"))
    seen = {it.query_id for p in exclude or [] for it in load_items(p)[1]}

    def load(path: Path, drop: set[str] = set()) -> tuple[list, dict, dict]:
        meta, items = load_items(path)
        items = with_features(items, features) if features else items
        return ([it for it in items if it.query_id not in drop],
                {q: r for q, r in meta["qrels"].items() if q not in drop}, meta)

    cal_items: list = []
    cal_qrels: dict = {}
    for p in calibrate:
        items, qrels, _ = load(p, seen)
        cal_items += items
        cal_qrels.update({q: qrels[q] for q in {it.query_id for it in items} if q in qrels})
    dev_items, dev_qrels, dev_meta = load(dev)
    n_counts = [int(x) for x in counts.split(",")]
    calibration, report = fit_calibration(cal_items, cal_qrels, dev_items, dev_qrels, card_data, counts=n_counts)
    lines = [f"calibration: {len(cal_items)} queries ({len(seen)} excluded), counts {n_counts}", "",
             "| set | mode | candidates | fixed top-k (k from dev): P / R / F1 | cut-off 'auto': P / R / F1 / hits | "
             "F1 delta (p) | best k on the set: F1 (auto vs it, p) |", "|---|---|---|---|---|---|---|"]
    tests = {}
    for spec in test or []:
        name, sep, rest = spec.partition("=")
        if not sep:
            raise typer.BadParameter(f"expected NAME=DUMP[@MIN_GRADE], got {spec!r}", param_hint="--test")
        path, _, min_grade = rest.partition("@")
        items, qrels, _ = load(Path(path))
        tests[name] = (items, qrels, int(min_grade) if min_grade else 1)
    results: dict = {}
    for name, (items, qrels, grade) in [("dev", (dev_items, dev_qrels, 1)), *tests.items()]:
        for mode in MODES:
            k = int(report[mode]["top_k"])
            for c in test_counts.split(","):
                n = None if c == "all" else int(c)
                r = evaluate_cutoff(items, qrels, card_data, calibration, mode, n, k, min_grade=grade)
                results.setdefault(name, {}).setdefault(mode, {})[c] = r
                a, f = r["auto"], r["fixed"]
                lines.append(f"| {name} ({r['queries']} q) | {mode} | {c} | {100 * f[0]:.1f} / {100 * f[1]:.1f} / "
                             f"{100 * f[2]:.1f} (k {k}) | {100 * a[0]:.1f} / {100 * a[1]:.1f} / **{100 * a[2]:.1f}** / "
                             f"{a[3]:.1f} | {100 * r['delta_f1']:+.1f} (p {r['p']:.3f}) | {100 * r['fixed_best_k'][2]:.1f}"
                             f" (k {r['best_k_on_this_set']}; {100 * (a[2] - r['fixed_best_k'][2]):+.1f}, p "
                             f"{r['p_vs_best_k']:.3f}) |")
    command = ("heedrank eval calibrate " + " ".join(
        [f"--card {card}"] + [f"--calibrate {p}" for p in calibrate] + [f"--exclude {p}" for p in exclude or []]
        + [f"--dev {dev}"] + [f"--test {t}" for t in test or []] + ([f"--features {features}"] if features else [])
        + [f"--counts {counts}", f"--test-counts {test_counts}", "--write"]))
    entry = calibration.to_json()
    adapter = (dev_meta.get("adapter") or {}).get("sha256")  # the query adapter of the dump's ':adapter' variants
    if adapter and features and (dev_meta.get("variants") or {}).get(features, [""])[0] == "adapter":
        entry["query_adapter_sha256"] = adapter  # the maps hold only with the adapter the dumps used
    entry.update({"test": {n: {m: {c: {k: v for k, v in r.items()} for c, r in byc.items()} for m, byc in v.items()}
                           for n, v in results.items() if n != "dev"}, "command": command})
    if out is not None:
        out.write_text(json.dumps({"calibration": entry, "results": results}, indent=1))
    if write:
        card_data["calibration"] = entry
        card.write_text(json.dumps(card_data, indent=1))
    typer.echo("\n".join(lines))


def eval_weak_labels(
    data: Annotated[Path, typer.Option("--data", help="BEIR folder whose corpus gets pseudo-queries.")],
    out: Annotated[Path, typer.Option("--out", help="BEIR folder to write (queries, qrels/train.tsv, a link to the "
                                      "corpus); then `eval study-dump --data OUT --split train`.")],
    source: Annotated[str, typer.Option("--source", help="title (a document's title as its query) or generated "
                                        "(an instruct LM writes a question from the body).")] = "title",
    docs: Annotated[Optional[int], typer.Option("--docs", help="Seeded sample of documents (default: all).")] = None,
    seed: SeedOpt = 0,
    protect: Annotated[str, typer.Option("--protect", help="Splits whose queries the leak guard protects "
                                         "(comma-separated).")] = "dev,test",
    strict: Annotated[bool, typer.Option("--strict/--no-strict", help="Also leave out every document a protected "
                                         "split judges.")] = False,
    max_jaccard: Annotated[float, typer.Option("--max-jaccard", help="Drop pseudo-queries this close (word-set "
                                               "Jaccard) to a protected query.")] = 0.6,
    model: ModelOpt = None,
    device: DeviceOpt = "cpu",
) -> None:
    """Weak labels (issue #24 lever 2): pseudo-queries for corpus documents, each relevant to
    its own document, with a leak guard against the protected splits' queries."""
    from heedrank.eval.weak_labels import build

    counts = build(data, out, source=source, docs=docs, seed=seed, protect=[s for s in protect.split(",") if s],
                   strict=strict, max_jaccard=max_jaccard, model=model, device=device)
    typer.echo(json.dumps(counts))

"""The library side of ``heedrank lab`` (:mod:`heedrank.cli.lab`): the cached-BlockRank
feature study's dump and fit, its weights card and the relevance cut-off's calibration, as
functions that read their inputs from files and return records (a report, a card, the
figures of a table) that the command line prints or writes.

The computations are :mod:`heedrank.eval.study` and :mod:`heedrank.eval.calibration`;
this module only reads dumps, cards and adapters, and names what a run did
(:func:`command_line`, the ``command`` a card records for provenance).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence, Set
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from heedrank.config import RerankerConfig
from heedrank.errors import NotFoundError, ValidationError

LOSSES = ("listwise", "pairwise", "lambdarank")
"""Losses of :func:`fit_study` (:func:`heedrank.eval.study.fit_listwise`)."""


def command_line(program: str, options: Sequence[tuple[str, Any]]) -> str:
    """The command line that reproduces a run, as a card records it: ``program`` then each
    ``(flag, value)`` in order; a list or tuple repeats the flag, ``True`` is the bare flag,
    ``None``, ``False`` and empty lists are left out, floats are written with ``:g``."""
    words = [program]
    for flag, value in options:
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if v is None or v is False:
                continue
            words.append(flag if v is True else f"{flag} {v:g}" if isinstance(v, float) else f"{flag} {v}")
    return " ".join(words)


def parse_named(items: Sequence[str], option: str, form: str = "NAME=PATH") -> dict[str, str]:
    """``NAME=VALUE`` items (a repeatable option's values) as ``{name: value}``, in order.

    Raises:
        ValidationError: an item without ``=``; the message names ``option`` and ``form``.
    """
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise ValidationError(f"{option}: expected {form}, got {item!r}")
        out[name] = value
    return out


def read_query_ids(paths: Sequence[Path]) -> set[str]:
    """Query ids of text files (one per line) and of study dumps (``.npz``: their queries)."""
    from heedrank.eval.study import load_items

    ids: set[str] = set()
    for path in paths:
        if path.suffix == ".npz":
            ids |= {it.query_id for it in load_items(path)[1]}
        else:
            ids |= {line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()}
    return ids


def fixed_weights(path: Path) -> list[float]:
    """Head weights of a weights card (``.json``) or of a query adapter folder (its trained
    ``scorer.weights``, else the shipped card of its model).

    Raises:
        NotFoundError: no card at ``path``.
    """
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


# ---------------------------------------------------------------------------- the study
def dump_study(
    out: Path, config: RerankerConfig, data: Path, *, split: str = "test", retriever: str = "hybrid",
    trec_run: str | None = None, candidates: int = 50, max_queries: int | None = None,
    query_ids: Path | None = None, seed: int = 0, index: Path | None = None, block_store: Path | None = None,
) -> dict[str, Any]:
    """Write the study's feature dump (:func:`heedrank.eval.study.dump_features`, resumable)
    of cached BlockRank ``config`` over the first-stage candidates of a BEIR folder (blocks
    read from ``index``'s document KV store when it has one) or of the TREC DL run
    ``trec_run``; blocks no store holds are computed, and kept in ``block_store`` if given.

    Returns:
        ``{"out": path, "queries": n}``.
    """
    from heedrank.eval.heads import beir_candidates, trec_dl_candidates
    from heedrank.eval.study import dump_features
    from heedrank.index.kv import KVStore
    from heedrank.registry import build_reranker

    reranker = build_reranker(config)
    store = None
    if trec_run:
        queries, cands, scores, qrels = trec_dl_candidates(data, run_name=trec_run, candidates=candidates,
                                                           queries=max_queries, seed=seed)
        source: dict[str, Any] = {"data": str(data), "run": trec_run}
    else:
        queries, cands, scores, qrels = beir_candidates(data, split, queries=max_queries, candidates=candidates,
                                                        seed=seed, index_dir=index, retriever=retriever)
        source = {"data": str(data), "split": split, "retriever": retriever}
        if index is not None and (index / "kv" / "header.json").exists():
            # read-only: several dumps may read one store at once (blocks it lacks are computed, not stored)
            store = KVStore.open(index / "kv", reranker.block_store_header(), readonly=True)
    if query_ids is not None:
        wanted = read_query_ids([query_ids])
        queries = [q for q in queries if q.query_id in wanted]
    if store is None and block_store is not None:
        store = KVStore.open_or_create(block_store, reranker.block_store_header())
    described = reranker.describe()
    meta = {**source, "candidates": candidates, "layer": config.option_values.get("layer"),
            "max_doc_tokens": config.max_doc_tokens, "reranker": described, "adapter": described.get("query_adapter"),
            "qrels": {q.query_id: dict(qrels.get(q.query_id, {})) for q in queries}}
    try:
        items = dump_features(out, queries, cands, scores, qrels, reranker, block_store=store, meta=meta)
    finally:
        if store is not None:
            store.close()
    return {"out": str(out), "queries": len(items)}


@dataclass(frozen=True)
class StudyFit:
    """What :func:`fit_study` found.

    Attributes:
        report: :func:`heedrank.eval.study.run_study`'s report, with ``"fit"`` (loss,
            temperature, layers) and ``"train"`` (dumps, queries) added.
        dev_meta: The dev dump's metadata (its reranker, ``l*``, block budget, qrels).
    """

    report: dict[str, Any]
    dev_meta: dict[str, Any]


def fit_study(
    train: Sequence[Path], dev: Path, tests: Mapping[str, Path], *, epochs: int = 150, loss: str = "listwise",
    temperature: float = 1.0, max_layer: int | None = None, fixed: Mapping[str, Path] | None = None,
) -> StudyFit:
    """Fit and compare the study's variants on feature dumps: learned head weights fitted on
    ``train`` (none: only the zero-shot scorers and the ``fixed`` weights, read with
    :func:`fixed_weights`), every choice made on ``dev``, then nDCG@10 with paired tests on
    each of ``tests``; layers ``0..max_layer`` only when given.

    Raises:
        ValidationError: an unknown ``loss``.
    """
    from heedrank.eval.study import load_items, run_study

    if loss not in LOSSES:
        raise ValidationError(f"--loss: expected one of {', '.join(LOSSES)}, got {loss!r}")
    train_items = [it for path in train for it in load_items(path)[1]]
    weights = {name: fixed_weights(path) for name, path in (fixed or {}).items()}
    dev_meta, dev_items = load_items(dev)
    test_sets = {}
    for name, path in tests.items():
        meta, items = load_items(path)
        test_sets[name] = (items, meta["qrels"])
    layers = list(range(max_layer + 1)) if max_layer is not None else None
    report = run_study(train_items, dev_items, dev_meta["qrels"], test_sets, epochs=epochs, loss=loss,
                       temperature=temperature, layers=layers, fixed=weights)
    report["fit"] = {"loss": loss, "temperature": temperature, "layers": layers}
    report["train"] = {"dumps": [str(p) for p in train], "queries": len(train_items)}
    return StudyFit(report, dev_meta)


# ---------------------------------------------------------------------------- the cut-off
@dataclass(frozen=True)
class CutoffCalibration:
    """What :func:`calibrate_cutoff` found.

    Attributes:
        entry: The card's ``"calibration"`` entry: the maps, their dev choices, the test
            figures and the ``command`` that wrote it.
        results: ``{set: {mode: {count: record}}}`` of
            :func:`heedrank.eval.calibration.evaluate_cutoff`, dev first.
        calibration_queries: Queries the maps were fitted on.
        excluded: Queries dropped from them (the reranker's training queries).
        counts: Candidate counts the maps were fitted and chosen at.
    """

    entry: dict[str, Any]
    results: dict[str, Any]
    calibration_queries: int
    excluded: int
    counts: list[int]


def calibrate_cutoff(
    card: Mapping[str, Any], calibrate: Sequence[Path], dev: Path, tests: Mapping[str, str], *,
    exclude: Sequence[Path] = (), counts: Sequence[int] = (10, 20, 30, 50), test_counts: Sequence[str] = ("20", "all"),
    command: str = "",
) -> CutoffCalibration:
    """Fit the relevance cut-off of ``card``'s learned scorer on the ``calibrate`` dumps (less
    the queries of the ``exclude`` dumps), choose its thresholds and the fixed top-k on
    ``dev``, and measure both on dev and on each test set (``{name: "DUMP[@MIN_GRADE]"}``)
    at each of ``test_counts`` (``"all"``: every candidate of the dump)."""
    from heedrank.calibration import MODES
    from heedrank.eval.calibration import evaluate_cutoff, fit_calibration
    from heedrank.eval.study import QueryItem, load_items

    seen = read_query_ids(list(exclude))

    def load(path: Path, drop: Set[str] = frozenset()) -> tuple[list[QueryItem], dict[str, Any], dict[str, Any]]:
        meta, items = load_items(path)
        return ([it for it in items if it.query_id not in drop],
                {q: r for q, r in meta["qrels"].items() if q not in drop}, meta)

    cal_items: list[QueryItem] = []
    cal_qrels: dict[str, Any] = {}
    for path in calibrate:
        items, qrels, _ = load(path, seen)
        cal_items += items
        cal_qrels.update({q: qrels[q] for q in {it.query_id for it in items} if q in qrels})
    dev_items, dev_qrels, dev_meta = load(dev)
    calibration, report = fit_calibration(cal_items, cal_qrels, dev_items, dev_qrels, card, counts=list(counts))
    sets = {"dev": (dev_items, dev_qrels, 1)}
    for name, spec in tests.items():
        dump, _, min_grade = spec.partition("@")
        items, qrels, _ = load(Path(dump))
        sets[name] = (items, qrels, int(min_grade) if min_grade else 1)
    results: dict[str, Any] = {}
    for name, (items, qrels, grade) in sets.items():
        for mode in MODES:
            k = int(report[mode]["top_k"])
            for c in test_counts:
                results.setdefault(name, {}).setdefault(mode, {})[c] = evaluate_cutoff(
                    items, qrels, card, calibration, mode, None if c == "all" else int(c), k, min_grade=grade)
    entry = calibration.to_json()
    adapter = (dev_meta.get("adapter") or {}).get("sha256")  # the query adapter of the dumps (lab dump --adapter)
    if adapter:
        entry["query_adapter_sha256"] = adapter  # the maps hold only with the adapter the dumps used
    entry.update({"test": {n: v for n, v in results.items() if n != "dev"}, "command": command})
    return CutoffCalibration(entry, results, len(cal_items), len(seen), list(counts))


def format_cutoff(run: CutoffCalibration) -> str:
    """The markdown table of a :class:`CutoffCalibration`: per set, mode and candidate count,
    the fixed top-k (k chosen on dev) against the cut-off ``"auto"`` (precision, recall, F1,
    documents returned), the F1 difference with its p, and the best k on the set itself."""
    lines = [f"calibration: {run.calibration_queries} queries ({run.excluded} excluded), counts {run.counts}", "",
             "| set | mode | candidates | fixed top-k (k from dev): P / R / F1 | cut-off 'auto': P / R / F1 / hits | "
             "F1 delta (p) | best k on the set: F1 (auto vs it, p) |", "|---|---|---|---|---|---|---|"]
    for name, by_mode in run.results.items():
        for mode, by_count in by_mode.items():
            for c, r in by_count.items():
                a, f, best = r["auto"], r["fixed"], r["fixed_best_k"]
                lines.append(
                    f"| {name} ({r['queries']} q) | {mode} | {c} | {100 * f[0]:.1f} / {100 * f[1]:.1f} / "
                    f"{100 * f[2]:.1f} (k {r['top_k']}) | {100 * a[0]:.1f} / {100 * a[1]:.1f} / **{100 * a[2]:.1f}** / "
                    f"{a[3]:.1f} | {100 * r['delta_f1']:+.1f} (p {r['p']:.3f}) | {100 * best[2]:.1f} (k "
                    f"{r['best_k_on_this_set']}; {100 * (a[2] - best[2]):+.1f}, p {r['p_vs_best_k']:.3f}) |")
    return "\n".join(lines)

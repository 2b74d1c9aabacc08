"""The evaluation side of ``heedrank lab`` (:mod:`heedrank.lab.cli`): the cached-BlockRank
feature study's dump (:func:`dump_study`), the query ids of dumps, and the parsing and
provenance helpers of its commands (:func:`command_line`, the ``command`` a card records).

The fits that read these dumps (the study's head weights and weights card, the relevance
cut-off's calibration) are in :mod:`heedrank.lab.train` (:mod:`heedrank.lab.train.head_fit`,
:mod:`heedrank.lab.train.cutoff_fit`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from heedrank.config import RerankerConfig
from heedrank.errors import ValidationError


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


def graded(spec: str) -> tuple[Path, int]:
    """``DUMP[@MIN_GRADE]`` as ``(path, lowest relevant grade)`` (default grade 1)."""
    path, _, grade = spec.partition("@")
    return Path(path), int(grade or 1)


def graded_sets(train: Sequence[str], test: Sequence[str]) -> tuple[list[tuple[Path, int]], dict[str, tuple[Path, int]]]:
    """``--train DUMP[@MIN_GRADE]`` and ``--test NAME=DUMP[@MIN_GRADE]`` values of the lab's fits, parsed."""
    tests = {name: graded(value) for name, value in parse_named(test, "--test", "NAME=DUMP[@MIN_GRADE]").items()}
    return [graded(spec) for spec in train], tests


def read_query_ids(paths: Sequence[Path]) -> set[str]:
    """Query ids of text files (one per line) and of study dumps (``.npz``: their queries)."""
    from heedrank.lab.study import load_items

    ids: set[str] = set()
    for path in paths:
        if path.suffix == ".npz":
            ids |= {it.query_id for it in load_items(path)[1]}
        else:
            ids |= {line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()}
    return ids


# ---------------------------------------------------------------------------- the study
def dump_study(
    out: Path, config: RerankerConfig, data: Path, *, split: str = "test", retriever: str = "hybrid",
    trec_run: str | None = None, candidates: int = 50, max_queries: int | None = None,
    query_ids: Path | None = None, seed: int = 0, index: Path | None = None, block_store: Path | None = None,
) -> dict[str, Any]:
    """Write the study's feature dump (:func:`heedrank.lab.study.dump_features`, resumable)
    of cached BlockRank ``config`` over the first-stage candidates of a BEIR folder (blocks
    read from ``index``'s document KV store when it has one) or of a candidate-list set's run
    ``trec_run`` (a TREC DL year, ``msmarco-passage-dev-600``, NovelEval:
    :func:`heedrank.eval.sets.load_candidate_set`; such a folder is recognised by its file
    names, and without ``trec_run`` its run is ``BM25``); blocks no store holds are computed,
    and kept in ``block_store`` if given. ``split`` is the BEIR split, or the candidate set's
    fold (dev-600: ``train``, ``test`` or ``all``; the other sets: ``test`` = ``all``).

    Returns:
        ``{"out": path, "queries": n}``.
    """
    from heedrank.lab.candidates import beir_candidates, trec_dl_candidates
    from heedrank.lab.study import dump_features
    from heedrank.eval.sets import candidate_set_kind
    from heedrank.index.kv import KVStore
    from heedrank.registry import build_reranker

    reranker = build_reranker(config)
    store = None
    if trec_run or candidate_set_kind(data) is not None:
        trec_run = trec_run or "BM25"
        queries, cands, scores, qrels = trec_dl_candidates(data, run_name=trec_run, candidates=candidates,
                                                           queries=max_queries, seed=seed, split=split)
        source: dict[str, Any] = {"data": str(data), "run": trec_run, "split": split}
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

"""Candidate-list sets: folders of queries, judgements and fixed first-stage lists with passage
text, loaded from the folder alone (:func:`load_candidate_set`), each with the relevance level
of its binary measures and its metrics (:class:`SetKind`). ``heedrank eval trec-dl`` and the
lab's TREC DL candidates (:func:`heedrank.lab.candidates.trec_dl_candidates`) read them here.

Recognised folders (``../shared/data/SOURCES.md`` describes the copies there):

* TREC DL, any year (``msmarco-trec-dl-2019-passage``, ...; kind ``trec-dl``): Anserini topics,
  NIST qrels graded 0-3 and rank_llm top-100 runs with text, found by their names
  (:func:`heedrank.data.trec_dl_paths`). Binary measures count grade >= 2, the TREC DL convention.
* MS MARCO passage dev samples (``msmarco-passage-dev-600``; kind ``msmarco-dev``): the same
  layout with a ``dev<N>`` tag (``topics.dev600.tsv``, ``qrels.dev600.txt``,
  ``retrieve_results_BM25_dev600_top20.json.gz``). Binary qrels, 1 = the query's MS MARCO
  positive, so binary measures count grade >= 1. Fixed seeded train and test folds
  (:func:`seeded_folds`): 450 and 150 of dev-600's 600 queries.
* NovelEval (``noveleval``; kind ``noveleval``): RankGPT's ``queries.tsv``, ``corpus.tsv``
  (doc ids ``<qid>-<n>``, 20 web passages a question) and ``qrels.txt`` graded 0 not relevant,
  1 partly relevant, 2 relevant. Binary measures count grade >= 1 (a partly relevant passage
  is relevant), as ``trec_eval`` and BEIR count graded 0-2 sets such as TREC-COVID. No run file
  comes with it; its first stages are computed here (:data:`NOVELEVAL_RUNS`).

Example:
    >>> cs = load_candidate_set("../shared/data/msmarco-passage-dev-600", split="test")  # doctest: +SKIP
    >>> cs.kind.min_relevant, len(cs.queries), cs.kind.metrics                         # doctest: +SKIP
    (1, 150, ('nDCG@10', 'RR@10', 'R@10'))
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from heedrank.data import (
    load_run_json,
    load_trec_qrels,
    load_trec_topics,
    load_tsv_corpus,
    load_tsv_queries,
    noveleval_paths,
    run_name_of,
    trec_dl_paths,
)
from heedrank.errors import NotFoundError, ValidationError
from heedrank.types import Document, Qrels, Query, Run
from heedrank.eval.metrics import MSMARCO_DEV_METRICS, NOVELEVAL_METRICS, TREC_DL_METRICS

logger = logging.getLogger(__name__)

__all__ = ["FOLD_SEED", "NOVELEVAL_RUNS", "SET_KINDS", "SPLITS", "CandidateSet", "SetKind", "candidate_set_kind",
           "load_candidate_set", "seeded_folds"]

SPLITS = ("train", "test", "all")
"""Query splits of a candidate set: a fold (``train``, ``test``) or every query (``all``). A
set without folds holds test queries only: ``test`` and ``all`` are then the same queries."""

FOLD_SEED = 0
"""Seed of the folds of :func:`seeded_folds` (fixed: a training run and an evaluation that
come later must see the same folds)."""

NOVELEVAL_RUNS = ("BM25", "web")
"""NovelEval's first stages: ``BM25`` (the default) scores each question's own 20 passages with
the index's BM25 (:class:`heedrank.index.bm25.BM25Params`: Lucene's k1 0.9 and b 0.4, English
stop words and stemmer), those 20 passages being the collection (document frequencies and
lengths from them); nDCG@10 56.2, against 55.77 in the source's README. ``web`` keeps the order
in which the source lists them (``<qid>-0``, ``<qid>-1``, ..., the order of RankGPT's own
``data.json``), scored ``20 - position``; nDCG@10 65.0."""


@dataclass(frozen=True)
class SetKind:
    """What a kind of candidate set implies for its evaluation.

    Attributes:
        name: ``"trec-dl"``, ``"msmarco-dev"`` or ``"noveleval"``.
        min_relevant: The lowest grade binary measures (RR, R, P, AP) count as relevant.
        metrics: The default metrics (:mod:`heedrank.eval.metrics`); their binary measures use
            ``min_relevant``.
        folds: Whether the set has seeded train and test folds (:func:`seeded_folds`); a set
            without holds test queries only.
    """

    name: str
    min_relevant: int
    metrics: tuple[str, ...]
    folds: bool = False


SET_KINDS: dict[str, SetKind] = {
    "trec-dl": SetKind("trec-dl", 2, TREC_DL_METRICS),
    "msmarco-dev": SetKind("msmarco-dev", 1, MSMARCO_DEV_METRICS, folds=True),
    "noveleval": SetKind("noveleval", 1, NOVELEVAL_METRICS),
}
"""The kinds of :func:`load_candidate_set`'s folders, by name."""


@dataclass(frozen=True)
class CandidateSet:
    """The queries of one split of a folder, its judgements and its first-stage lists.

    Attributes:
        name: The set's tag: the TREC DL year (``"dl19"``), the dev tag (``"dev600"``) or
            ``"noveleval"``; ``None`` when explicit files do not say.
        kind: Its :class:`SetKind` (relevance level, metrics, folds).
        split: ``"train"``, ``"test"`` or ``"all"`` for a set with folds; ``"test"`` for others.
        run_name: The first stage (``"BM25"``, ``"web"``, a rank_llm run name).
        queries: ``{qid: Query}`` of the split: official topic texts, the run file's own text
            where a topic is missing.
        qrels: ``{qid: {doc_id: grade}}`` of the split's queries (of every query without folds).
        run: ``{qid: {doc_id: score}}``, higher = better: the run file's scores (dev-600:
            ``21 - rank``, its source kept no BM25 scores), or NovelEval's (:data:`NOVELEVAL_RUNS`).
        docs: ``{doc_id: Document}``, the passages of the lists (no titles).
        files: The files read, by role (``topics``, ``qrels``, ``run_json``; NovelEval:
            ``queries``, ``corpus``, ``qrels``).
    """

    name: str | None
    kind: SetKind
    split: str
    run_name: str
    queries: dict[str, Query]
    qrels: Qrels
    run: Run
    docs: dict[str, Document]
    files: Mapping[str, Path] = field(default_factory=dict)


def seeded_folds(query_ids: Iterable[str], judged: Iterable[str], *, seed: int = FOLD_SEED) -> dict[str, list[str]]:
    """The fixed train and test folds of a set with folds.

    The test fold is a quarter of the queries (rounded down: 150 of dev-600's 600), all
    judged, so that each can be evaluated: the judged queries whose sha256 of
    ``"<seed>:<qid>"`` (hex) is smallest. The train fold is every other query, judged or not
    (dev-600: 390 judged, and the 60 lists without a positive). A hash, not ``random.sample``:
    the folds depend on the ids and the seed only, neither on the files' order nor on Python's
    generator.

    Args:
        query_ids: Every query of the set.
        judged: The queries with judgements (others never enter the test fold).
        seed: :data:`FOLD_SEED` unless a study says otherwise.

    Returns:
        ``{"train": [...], "test": [...]}``, each sorted; disjoint, together ``query_ids``.

    Raises:
        ValidationError: fewer judged queries than the test fold needs.
    """
    ids = sorted(set(query_ids))
    pool = sorted(set(judged) & set(ids), key=lambda q: (hashlib.sha256(f"{seed}:{q}".encode()).hexdigest(), q))
    size = len(ids) // 4
    if len(pool) < size:
        raise ValidationError(f"a test fold of {size} judged queries is needed, and only {len(pool)} of {len(ids)} "
                              "queries are judged")
    test = set(pool[:size])
    return {"train": [q for q in ids if q not in test], "test": sorted(test)}


def candidate_set_kind(data_dir: str | Path) -> str | None:
    """The kind (a :data:`SET_KINDS` name) of the folder ``data_dir`` from its file names, or
    ``None`` when it holds no candidate set (a BEIR folder, say)."""
    from heedrank.data import detect_trec_dl_year

    d = Path(data_dir)
    if not d.is_dir():
        return None
    if noveleval_paths(d) is not None:
        return "noveleval"
    try:
        tag = detect_trec_dl_year(d)
    except (NotFoundError, ValidationError):
        return None
    return _kind_of_tag(tag).name


def _kind_of_tag(tag: str | None) -> SetKind:
    return SET_KINDS["msmarco-dev" if tag is not None and tag.startswith("dev") else "trec-dl"]


def load_candidate_set(
    data_dir: str | Path | None,
    run_name: str | None = None,
    *,
    split: str = "test",
    year: str | None = None,
    topics: str | Path | None = None,
    qrels: str | Path | None = None,
    run_file: str | Path | None = None,
) -> CandidateSet:
    """Load a candidate set from its folder, recognised by its file names (module docstring).

    Args:
        data_dir: The folder; ``None`` for a TREC DL-layout set given by ``topics``, ``qrels``
            and ``run_file`` alone.
        run_name: The first stage; ``None`` = ``"BM25"`` (with ``run_file``: the ``<RUN>``
            of its name).
        split: ``"test"``, ``"train"`` or ``"all"`` (:data:`SPLITS`); the folds of a set with
            folds are :func:`seeded_folds`'s, drawn from the judged queries of the qrels in use.
        year: TREC DL year or ``dev<N>`` tag when the folder holds several.
        topics, qrels, run_file: Explicit TREC DL-layout files (:func:`heedrank.data.trec_dl_paths`).

    Raises:
        NotFoundError: missing folder, files or run (the message lists the available runs).
        ValidationError: an unknown split; ``train`` for a set without folds; explicit files
            or ``year`` for NovelEval; malformed files.
    """
    if split not in SPLITS:
        raise ValidationError(f"unknown split {split!r}; choose one of {list(SPLITS)}")
    d = Path(data_dir) if data_dir is not None else None
    nov = noveleval_paths(d) if d is not None and d.is_dir() else None
    if nov is not None:
        given = [f"--{n}" for n, v in (("year", year), ("topics", topics), ("qrels", qrels), ("run-file", run_file)) if v]
        if given:
            raise ValidationError(f"{', '.join(given)} apply to TREC DL-layout folders; {d} is a NovelEval folder")
        name = run_name or NOVELEVAL_RUNS[0]
        queries = load_tsv_queries(nov.queries)
        docs = load_tsv_corpus(nov.corpus)
        run = _noveleval_run(name, queries, docs, nov.corpus)
        files = {"queries": nov.queries, "corpus": nov.corpus, "qrels": nov.qrels}
        return _split_set("noveleval", SET_KINDS["noveleval"], split, name, queries, load_trec_qrels(nov.qrels),
                          run, docs, files)
    if run_name is None:
        run_name = run_name_of(run_file) if run_file is not None else "BM25"
    paths = trec_dl_paths(d, run_name, year=year, topics=topics, qrels=qrels, run_file=run_file)
    topic_queries = load_trec_topics(paths.topics)
    run, docs, run_queries = load_run_json(paths.run_json)
    files = {"topics": paths.topics, "qrels": paths.qrels, "run_json": paths.run_json}
    return _split_set(paths.year, _kind_of_tag(paths.year), split, run_name, {**run_queries, **topic_queries},
                      load_trec_qrels(paths.qrels), run, docs, files)


def _split_set(name: str | None, kind: SetKind, split: str, run_name: str, queries: dict[str, Query], qrels: Qrels,
               run: Run, docs: dict[str, Document], files: Mapping[str, Path]) -> CandidateSet:
    """The :class:`CandidateSet` of ``split``'s queries."""
    if not kind.folds:
        if split == "train":
            raise ValidationError(f"{name or 'this set'} has no train fold (its queries are all test queries); "
                                  "use split test or all")
        split = "test"
    elif split != "all":
        fold = set(seeded_folds(queries, [q for q in queries if qrels.get(q)])[split])
        queries = {q: t for q, t in queries.items() if q in fold}
        qrels = {q: j for q, j in qrels.items() if q in fold}
    return CandidateSet(name, kind, split, run_name, queries, qrels, run, docs, dict(files))


def _noveleval_run(run_name: str, queries: Mapping[str, Query], docs: Mapping[str, Document], corpus: Path) -> Run:
    """NovelEval's first stage ``run_name`` (:data:`NOVELEVAL_RUNS`) over each question's
    passages (doc ids ``<qid>-<n>``, in corpus order).

    Raises:
        NotFoundError: an unknown run name.
        ValidationError: a passage whose id names no question.
    """
    if run_name not in NOVELEVAL_RUNS:
        raise NotFoundError(f"run {run_name!r} not found for NovelEval; available runs: {list(NOVELEVAL_RUNS)}")
    lists: dict[str, list[str]] = {q: [] for q in queries}
    for did in docs:
        qid = did.rpartition("-")[0]
        if qid not in lists:
            raise ValidationError(f"{corpus}: passage {did!r} names no question (NovelEval ids are <qid>-<n>)")
        lists[qid].append(did)
    if run_name == "web":
        return {q: {d: float(len(ids) - i) for i, d in enumerate(ids)} for q, ids in lists.items() if ids}
    from heedrank.index.bm25 import BM25Builder

    run: Run = {}
    for qid, ids in lists.items():
        if not ids:
            continue
        builder = BM25Builder()
        builder.add([docs[d].text for d in ids])
        scores = builder.build().scores(queries[qid].text)
        run[qid] = {d: float(s) for d, s in zip(ids, scores)}
    return run

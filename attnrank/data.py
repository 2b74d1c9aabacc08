"""Loaders and writers for evaluation data: BEIR layout and TREC DL files.

BEIR layout (``data_dir/corpus.jsonl[.gz]``, ``queries.jsonl[.gz]``, ``qrels/<split>.tsv[.gz]``):

* :func:`load_beir_corpus` memory-maps the corpus as an Arrow table through
  ``datasets`` (so large corpora never sit in Python memory); :func:`iter_beir_documents`
  streams it as :class:`~attnrank.types.Document` batches.
* :func:`load_beir_queries` and :func:`load_beir_qrels` read the small files directly.

TREC DL (Anserini-style files): :func:`load_trec_topics` (``qid<TAB>text``),
:func:`load_trec_qrels` (``qid 0 docid rel``), :func:`load_trec_run` /
:func:`write_trec_run` (6-column run files) and :func:`load_run_json` for the
rank_llm ``retrieve_results_<RUN>_dl19_top100.json[.gz]`` files that carry passage text.

Every identifier is returned as ``str`` (some files store numeric ids). ``.gz`` files are
read transparently. Missing files raise :class:`~attnrank.errors.NotFoundError`.
``datasets`` is imported inside the functions that need it.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from attnrank.errors import NotFoundError, ValidationError
from attnrank.types import Document, Qrels, Query, Run

logger = logging.getLogger(__name__)

__all__ = [
    "TrecDLPaths",
    "default_cache_dir",
    "find_beir_corpus",
    "iter_beir_documents",
    "load_beir_corpus",
    "load_beir_qrels",
    "load_beir_queries",
    "load_run_json",
    "load_trec_qrels",
    "load_trec_run",
    "load_trec_topics",
    "trec_dl_paths",
    "write_trec_run",
]


# ------------------------------------------------------------------------------ helpers
def default_cache_dir() -> Path:
    """``$ATTNRANK_CACHE_DIR`` when set, else ``~/.cache/attnrank`` (not created here)."""
    env = os.environ.get("ATTNRANK_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "attnrank"


def _open_text(path: Path) -> IO[str]:
    """Open a text file for reading, gunzipping ``*.gz`` transparently (UTF-8)."""
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8")
    return open(path, encoding="utf-8")


def _first_existing(candidates: list[Path], what: str, hint: str = "") -> Path:
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    tried = ", ".join(str(c) for c in candidates)
    raise NotFoundError(f"{what} not found (tried {tried}){hint}")


def _require_file(path: Path, what: str) -> Path:
    if not path.is_file():
        raise NotFoundError(f"{what} not found: {path}")
    return path


# ------------------------------------------------------------------------------ BEIR
def find_beir_corpus(path: str | Path) -> Path:
    """The corpus file of a BEIR folder (``corpus.jsonl`` or ``corpus.jsonl.gz``), or ``path`` itself.

    Raises:
        NotFoundError: neither a corpus file nor a folder holding one.
    """
    path = Path(path)
    if path.is_dir():
        return _first_existing(
            [path / "corpus.jsonl", path / "corpus.jsonl.gz"],
            "BEIR corpus",
            "; pass a BEIR-layout folder or a corpus .jsonl[.gz] file",
        )
    return _require_file(path, "corpus file")


def load_beir_corpus(path: str | Path):
    """Load a BEIR corpus as a memory-mapped ``datasets.Dataset``.

    The Arrow copy is cached under ``<cache>/datasets`` (``$ATTNRANK_CACHE_DIR`` or
    ``~/.cache/attnrank``), keyed by ``datasets`` on the file's path and modification time.

    Args:
        path: A BEIR-layout folder or a ``corpus.jsonl[.gz]`` file; one JSON object per
            line with ``_id``, ``text`` and optionally ``title`` and ``metadata``.

    Returns:
        ``datasets.Dataset`` with one row per document (columns as in the file).

    Raises:
        NotFoundError: no corpus file at ``path``.
        MissingDependencyError: ``datasets`` is not installed.
    """
    from attnrank.errors import require

    datasets = require("datasets", "index")
    corpus = find_beir_corpus(path)
    cache = default_cache_dir() / "datasets"
    logger.debug("loading corpus %s (Arrow cache %s)", corpus, cache)
    return datasets.load_dataset("json", data_files=str(corpus), split="train", cache_dir=str(cache))


def _clean_metadata(value: Any) -> dict[str, Any]:
    # Arrow unifies the struct of `metadata` over all rows: keys missing in a row come
    # back as None. Drop them so that each document carries only its own fields.
    if not isinstance(value, Mapping):
        return {}
    return {str(k): v for k, v in value.items() if v is not None}


def iter_beir_documents(path: str | Path, batch_size: int = 1000) -> Iterator[Document]:
    """Stream the documents of a BEIR corpus in file order.

    Args:
        path: A BEIR-layout folder or a ``corpus.jsonl[.gz]`` file.
        batch_size: Rows read from the Arrow table at a time.

    Yields:
        :class:`Document` with ``doc_id`` from ``_id`` (as ``str``), ``title`` (``""``
        when absent or null), ``text`` and ``metadata`` (the ``metadata`` object of the
        line when present; null-valued fields are dropped, see below).

    Note:
        Arrow gives all rows the union of the ``metadata`` keys seen in the file, with
        ``None`` where a row lacks a key; such ``None`` fields are dropped, so a JSON
        ``null`` in the source is indistinguishable from an absent field.

    Raises:
        NotFoundError: no corpus file at ``path``.
        ValidationError: a row without ``_id``.
    """
    if batch_size < 1:
        raise ValidationError(f"batch_size must be >= 1, got {batch_size}")
    ds = load_beir_corpus(path)
    columns = set(ds.column_names)
    if "_id" not in columns:
        raise ValidationError(f"corpus {path} has no '_id' column (columns: {sorted(columns)})")
    for batch in ds.iter(batch_size=batch_size):
        ids = batch["_id"]
        n = len(ids)
        titles = batch["title"] if "title" in columns else [None] * n
        texts = batch["text"] if "text" in columns else [None] * n
        metas = batch["metadata"] if "metadata" in columns else [None] * n
        for doc_id, title, text, meta in zip(ids, titles, texts, metas):
            if doc_id is None:
                raise ValidationError(f"corpus {path} has a row without '_id'")
            yield Document(
                doc_id=str(doc_id),
                text="" if text is None else str(text),
                title="" if title is None else str(title),
                metadata=_clean_metadata(meta),
            )


def load_beir_queries(data_dir: str | Path) -> dict[str, Query]:
    """All queries of a BEIR folder (every split), by query id.

    Args:
        data_dir: BEIR-layout folder with ``queries.jsonl`` or ``queries.jsonl.gz``
            (``{"_id", "text", ...}`` per line).

    Returns:
        ``{query_id: Query}`` in file order.

    Raises:
        NotFoundError: no queries file.
    """
    data_dir = Path(data_dir)
    path = _first_existing([data_dir / "queries.jsonl", data_dir / "queries.jsonl.gz"], "BEIR queries")
    queries: dict[str, Query] = {}
    with _open_text(path) as f:
        for line in f:
            if not line.strip():
                continue
            row = json.loads(line)
            qid = str(row["_id"])
            queries[qid] = Query(qid, str(row.get("text") or ""))
    return queries


def load_beir_qrels(data_dir: str | Path, split: str = "test") -> Qrels:
    """Relevance judgements of one split of a BEIR folder.

    Args:
        data_dir: BEIR-layout folder with ``qrels/<split>.tsv`` or ``qrels/<split>.tsv.gz``
            (tab-separated ``query-id corpus-id score`` with that header line).
        split: ``"test"``, ``"dev"`` or ``"train"``.

    Returns:
        ``{query_id: {doc_id: grade}}`` (integer grades).

    Raises:
        NotFoundError: no qrels file for ``split``.
        ValidationError: a malformed line.
    """
    qdir = Path(data_dir) / "qrels"
    path = _first_existing(
        [qdir / f"{split}.tsv", qdir / f"{split}.tsv.gz"], f"BEIR qrels for split {split!r}",
        "; available splits: " + ", ".join(sorted({p.name.split(".")[0] for p in qdir.glob("*.tsv*")}) or ["none"])
        if qdir.is_dir() else "",
    )
    qrels: Qrels = {}
    with _open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            parts = line.rstrip("\n").split("\t")
            if lineno == 1 and parts[0] == "query-id":
                continue
            if not line.strip():
                continue
            if len(parts) != 3:
                raise ValidationError(f"{path}:{lineno}: expected 'query-id<TAB>corpus-id<TAB>score', got {line!r}")
            qid, did, score = parts
            qrels.setdefault(qid, {})[did] = int(float(score))
    return qrels


# ------------------------------------------------------------------------------ TREC
def load_trec_topics(path: str | Path) -> dict[str, Query]:
    """TREC topics in Anserini's TSV format (``qid<TAB>text``, ``.gz`` ok).

    Raises:
        NotFoundError: missing file.
        ValidationError: a line without a tab.
    """
    path = _require_file(Path(path), "TREC topics file")
    topics: dict[str, Query] = {}
    with _open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\n")
            if not line.strip():
                continue
            qid, sep, text = line.partition("\t")
            if not sep:
                raise ValidationError(f"{path}:{lineno}: expected 'qid<TAB>text', got {line!r}")
            topics[qid.strip()] = Query(qid.strip(), text.strip())
    return topics


def load_trec_qrels(path: str | Path) -> Qrels:
    """TREC qrels (``qid iteration docid rel``, whitespace-separated, ``.gz`` ok).

    Raises:
        NotFoundError: missing file.
        ValidationError: a line without four fields.
    """
    path = _require_file(Path(path), "TREC qrels file")
    qrels: Qrels = {}
    with _open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 4:
                raise ValidationError(f"{path}:{lineno}: expected 'qid 0 docid rel', got {line!r}")
            qid, _, did, rel = parts
            qrels.setdefault(qid, {})[did] = int(rel)
    return qrels


def load_trec_run(path: str | Path) -> Run:
    """A 6-column TREC run (``qid Q0 docid rank score tag``, ``.gz`` ok).

    Ranks are ignored (the order is given by the scores); a repeated ``(qid, docid)``
    keeps its highest score.

    Returns:
        ``{query_id: {doc_id: score}}``.

    Raises:
        NotFoundError: missing file.
        ValidationError: a line without six fields or with a non-numeric score.
    """
    path = _require_file(Path(path), "TREC run file")
    run: Run = {}
    with _open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            parts = line.split()
            if not parts:
                continue
            if len(parts) != 6:
                raise ValidationError(f"{path}:{lineno}: expected 'qid Q0 docid rank score tag', got {line!r}")
            qid, _, did, _, score, _ = parts
            try:
                value = float(score)
            except ValueError:
                raise ValidationError(f"{path}:{lineno}: score {score!r} is not a number") from None
            scores = run.setdefault(qid, {})
            if did not in scores or value > scores[did]:
                scores[did] = value
    return run


def write_trec_run(run: Mapping[str, Mapping[str, float]], path: str | Path, tag: str) -> None:
    """Write a 6-column TREC run file (gzipped when ``path`` ends in ``.gz``).

    Queries are written in sorted id order; hits of each query sorted by
    ``(-score, doc_id)`` with ranks from 1. Parent folders are created.

    Raises:
        ValidationError: ``tag`` is empty or contains whitespace.
    """
    if not tag or any(c.isspace() for c in tag):
        raise ValidationError(f"run tag must be non-empty without whitespace, got {tag!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for qid in sorted(run):
        hits = sorted(run[qid].items(), key=lambda kv: (-float(kv[1]), kv[0]))
        lines.extend(f"{qid} Q0 {did} {rank} {float(score)!r} {tag}\n" for rank, (did, score) in enumerate(hits, 1))
    data = "".join(lines)
    if path.suffix == ".gz":
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(data)
    else:
        path.write_text(data, encoding="utf-8")


def load_run_json(path: str | Path) -> tuple[Run, dict[str, Document], dict[str, Query]]:
    """A rank_llm ``retrieve_results_*.json[.gz]`` file: run, passages and queries.

    The file is a list of ``{"query": str, "hits": [{"content", "qid", "docid", "rank",
    "score"}, ...]}``. Passages have no title.

    Returns:
        ``(run, documents, queries)``: ``{qid: {docid: score}}``, ``{docid: Document}``
        (first text seen for an id), ``{qid: Query}``.

    Raises:
        NotFoundError: missing file.
        ValidationError: not in the expected shape.
    """
    path = _require_file(Path(path), "run JSON file")
    with _open_text(path) as f:
        data = json.load(f)
    if not isinstance(data, list):
        raise ValidationError(f"{path}: expected a JSON list of {{query, hits}} objects")
    run: Run = {}
    docs: dict[str, Document] = {}
    queries: dict[str, Query] = {}
    for i, entry in enumerate(data):
        try:
            text = str(entry["query"])
            hits = entry["hits"]
        except (KeyError, TypeError):
            raise ValidationError(f"{path}: entry {i} lacks 'query' or 'hits'") from None
        if not hits:
            continue
        qid = str(hits[0]["qid"])
        queries[qid] = Query(qid, text)
        scores = run.setdefault(qid, {})
        for hit in hits:
            did = str(hit["docid"])
            score = float(hit["score"])
            if did not in scores or score > scores[did]:
                scores[did] = score
            if did not in docs:
                docs[did] = Document(doc_id=did, text=str(hit["content"]))
    return run, docs, queries


@dataclass(frozen=True)
class TrecDLPaths:
    """Files of one TREC DL first-stage run: topics, NIST qrels, run JSON with text, TREC run."""

    topics: Path
    qrels: Path
    run_json: Path
    trec_run: Path | None = None


def trec_dl_paths(data_dir: str | Path, run_name: str = "BM25", *, year: str = "dl19") -> TrecDLPaths:
    """Locate the TREC DL files of run ``run_name`` (e.g. ``"BM25"``) in ``data_dir``.

    Expected names: ``topics.<year>-passage.txt``, ``qrels.<year>-passage.txt``,
    ``retrieve_results_<RUN>_<year>_top100.json[.gz]`` and (optional)
    ``trec_results_<RUN>_<year>_top100.txt[.gz]``.

    Raises:
        NotFoundError: a required file is missing; the message lists the available runs.
    """
    d = Path(data_dir)
    if not d.is_dir():
        raise NotFoundError(f"TREC DL folder not found: {d}")

    def pick(stem: str) -> Path | None:
        for cand in (d / stem, d / f"{stem}.gz"):
            if cand.is_file():
                return cand
        return None

    topics = pick(f"topics.{year}-passage.txt")
    qrels = pick(f"qrels.{year}-passage.txt")
    run_json = pick(f"retrieve_results_{run_name}_{year}_top100.json")
    prefix, suffix = "retrieve_results_", f"_{year}_top100.json"
    available = sorted(
        p.name.removesuffix(".gz")[len(prefix):-len(suffix)]
        for p in d.glob(f"{prefix}*{suffix}*")
    )
    if topics is None or qrels is None:
        raise NotFoundError(f"TREC DL topics/qrels for {year} not found in {d}")
    if run_json is None:
        raise NotFoundError(f"run {run_name!r} not found in {d}; available runs: {available or 'none'}")
    return TrecDLPaths(topics, qrels, run_json, pick(f"trec_results_{run_name}_{year}_top100.txt"))

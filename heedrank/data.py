"""Loaders and writers for evaluation data: BEIR layout and TREC DL files.

BEIR layout (``data_dir/corpus.jsonl[.gz]``, ``queries.jsonl[.gz]``, ``qrels/<split>.tsv[.gz]``):

* :func:`load_beir_corpus` memory-maps the corpus as an Arrow table through
  ``datasets`` (so large corpora never sit in Python memory); :func:`iter_beir_documents`
  streams it as :class:`~heedrank.types.Document` batches.
* :func:`load_beir_queries` and :func:`load_beir_qrels` read the small files directly.

TREC DL (Anserini-style files): :func:`load_trec_topics` (``qid<TAB>text``),
:func:`load_trec_qrels` (``qid 0 docid rel``), :func:`load_trec_run` /
:func:`write_trec_run` (6-column run files) and :func:`load_run_json` for the
rank_llm ``retrieve_results_<RUN>_dl19_top100.json[.gz]`` files that carry passage text.

Every identifier is returned as ``str`` (some files store numeric ids). ``.gz`` files are
read transparently. Missing files raise :class:`~heedrank.errors.NotFoundError`.
``datasets`` is imported inside the functions that need it.

Every reader applies the rules of :mod:`heedrank.textrules`: files must be UTF-8, texts
valid Unicode (no unpaired ``\\ud800``-style surrogates), and document and query ids free
of whitespace and control characters (a TREC run line could not carry them). A broken rule
raises :class:`~heedrank.errors.ValidationError` naming the file and line (``path:line:``),
and :func:`write_trec_run` refuses such ids too.

TREC DL folders of any year are recognised by their Anserini / rank_llm file names
(:func:`trec_dl_paths`, :func:`detect_trec_dl_year`), and so are folders of the same layout
whose set tag is ``dev<N>`` instead of a year (``msmarco-passage-dev-600``: ``topics.dev600.tsv``,
``qrels.dev600.txt``, ``retrieve_results_BM25_dev600_top20.json.gz``).

NovelEval (RankGPT's layout: ``queries.tsv``, ``corpus.tsv``, ``qrels.txt``) is read by
:func:`noveleval_paths`, :func:`load_tsv_queries` and :func:`load_tsv_corpus`; its TSV files
quote fields as CSV does. Which set a folder holds, its first stage and its relevance level
are :mod:`heedrank.eval.sets`'s.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import logging
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from heedrank.errors import NotFoundError, ValidationError
from heedrank.files import cache_dir
from heedrank.textrules import check_id, check_text, id_problem, json_problem
from heedrank.types import Document, Qrels, Query, Run

logger = logging.getLogger(__name__)

__all__ = [
    "NovelEvalPaths",
    "TrecDLPaths",
    "default_cache_dir",
    "detect_trec_dl_year",
    "find_beir_corpus",
    "iter_beir_documents",
    "load_beir_corpus",
    "load_beir_qrels",
    "load_beir_queries",
    "load_run_json",
    "load_trec_qrels",
    "load_trec_run",
    "load_trec_topics",
    "load_tsv_corpus",
    "load_tsv_queries",
    "normalize_trec_dl_year",
    "noveleval_paths",
    "run_name_of",
    "trec_dl_paths",
    "write_trec_run",
]


# ------------------------------------------------------------------------------ helpers
def default_cache_dir() -> Path:
    """The cache folder (see :func:`heedrank.files.cache_dir`)."""
    return cache_dir()


def _iter_lines(path: Path) -> Iterator[tuple[int, str]]:
    """``(line number, line)`` of a UTF-8 text file (``*.gz`` gunzipped), line ends kept;
    a byte-order mark at the start is dropped.

    Raises:
        ValidationError: a line that is not valid UTF-8, or a corrupt gzip file (``path:line:``).
    """
    opener: Any = gzip.open if path.suffix == ".gz" else open
    lineno = 0
    try:
        with opener(path, "rb") as f:
            for lineno, raw in enumerate(f, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    raise ValidationError(
                        f"{path}:{lineno}: not valid UTF-8 ({exc.reason} at byte {exc.start} of the line); "
                        "save the file as UTF-8"
                    ) from None
                yield lineno, line.removeprefix("\ufeff") if lineno == 1 else line
    except (OSError, EOFError) as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise ValidationError(f"{path}:{lineno + 1}: cannot be read ({exc}); check that the file is intact") from None


def _json_line(path: Path, lineno: int, line: str) -> dict[str, Any]:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValidationError(f"{path}:{lineno}: not valid JSON ({exc}); each line must be one JSON object") from None
    if not isinstance(row, dict):
        raise ValidationError(f"{path}:{lineno}: expected a JSON object, got {type(row).__name__}")
    return row


def _check_row_text(path: Path, lineno: int, row: Mapping[str, Any], what: str) -> None:
    found = json_problem(row)
    if found:
        where, problem = found
        raise ValidationError(f"{path}:{lineno}: {what}{' field ' + where if where else ''} {problem}")


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

    The Arrow copy is cached under ``<cache>/datasets`` (``$HEEDRANK_CACHE_DIR`` or
    ``~/.cache/heedrank``), keyed by ``datasets`` on the file's path and modification time.
    Beside each cached copy ``datasets`` leaves an empty ``<cache key>.lock`` (its
    ``filelock.FileLock``, released with ``flock`` and not deleted, by design: deleting a lock
    file races with another process waiting on it); they are harmless and go with the copy
    they guard when the cache folder is cleared.

    Args:
        path: A BEIR-layout folder or a ``corpus.jsonl[.gz]`` file; one JSON object per
            line with ``_id``, ``text`` and optionally ``title`` and ``metadata``.

    Returns:
        ``datasets.Dataset`` with one row per document (columns as in the file).

    Raises:
        NotFoundError: no corpus file at ``path``.
        MissingDependencyError: ``datasets`` is not installed.
    """
    from heedrank.errors import require

    datasets = require("datasets", "index")
    corpus = find_beir_corpus(path)
    cache = default_cache_dir() / "datasets"
    logger.debug("loading corpus %s (Arrow cache %s)", corpus, cache)
    try:
        return datasets.load_dataset("json", data_files=str(corpus), split="train", cache_dir=str(cache))
    except Exception:
        _diagnose_corpus(corpus)  # raises ValidationError naming the line when the file is at fault
        raise


def _diagnose_corpus(corpus: Path) -> None:
    """Find why Arrow could not read ``corpus``: the first line that is not UTF-8, not a
    JSON object, without a valid ``_id`` or with invalid text. Returns when none is found.

    Raises:
        ValidationError: ``path:line:`` and what is wrong.
    """
    for lineno, line in _iter_lines(corpus):
        if not line.strip():
            continue
        row = _json_line(corpus, lineno, line)
        if row.get("_id") is None:
            raise ValidationError(f"{corpus}:{lineno}: document without '_id'")
        check_id(str(row["_id"]), f"{corpus}:{lineno}: document")
        _check_row_text(corpus, lineno, row, f"document {str(row['_id'])!r}")


def _corpus_line(corpus: Path, row: int, doc_id: str) -> str:
    """``"<file>:<line>"`` of the document ``doc_id`` at 0-based Arrow row ``row`` (its
    line number counts the blank lines Arrow skips); ``"<file>, document <row + 1>"`` when
    the line cannot be found."""
    n = -1
    for lineno, line in _iter_lines(corpus):
        if line.strip():
            n += 1
            if n == row:
                try:
                    if str(json.loads(line).get("_id")) == doc_id:
                        return f"{corpus}:{lineno}"
                except (ValueError, AttributeError):
                    pass
                break
    return f"{corpus}, document {row + 1}"


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
        ValidationError: a row without ``_id``, an id with whitespace or control characters,
            a line that is not UTF-8 or JSON, or text with unpaired surrogates; the message
            names the corpus file and line.
    """
    if batch_size < 1:
        raise ValidationError(f"batch_size must be >= 1, got {batch_size}")
    ds = load_beir_corpus(path)
    corpus = find_beir_corpus(path)
    columns = set(ds.column_names)
    if "_id" not in columns:
        raise ValidationError(f"corpus {corpus} has no '_id' column (columns: {sorted(columns)})")
    row = -1
    batches = ds.iter(batch_size=batch_size)
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            break
        except UnicodeDecodeError:  # Arrow reads invalid UTF-8 and fails only when converting it
            _diagnose_corpus(corpus)
            raise
        ids = batch["_id"]
        n = len(ids)
        titles = batch["title"] if "title" in columns else [None] * n
        texts = batch["text"] if "text" in columns else [None] * n
        metas = batch["metadata"] if "metadata" in columns else [None] * n
        for doc_id, title, text, meta in zip(ids, titles, texts, metas):
            row += 1
            if doc_id is None:
                raise ValidationError(f"{_corpus_line(corpus, row, 'None')}: document without '_id'")
            # Arrow decoded the file as UTF-8, so texts cannot hold surrogates; ids are checked here.
            if problem := id_problem(str(doc_id)):
                raise ValidationError(f"{_corpus_line(corpus, row, str(doc_id))}: document id {problem}")
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
        ValidationError: a line that is not UTF-8 or a JSON object, without ``_id``, with an
            id holding whitespace or control characters, or with invalid text (``path:line:``).
    """
    data_dir = Path(data_dir)
    path = _first_existing([data_dir / "queries.jsonl", data_dir / "queries.jsonl.gz"], "BEIR queries")
    queries: dict[str, Query] = {}
    for lineno, line in _iter_lines(path):
        if not line.strip():
            continue
        row = _json_line(path, lineno, line)
        if row.get("_id") is None:
            raise ValidationError(f"{path}:{lineno}: query without '_id'")
        qid = check_id(str(row["_id"]), f"{path}:{lineno}: query")
        _check_row_text(path, lineno, row, f"query {qid!r}")
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
    for lineno, line in _iter_lines(path):
        parts = line.rstrip("\r\n").split("\t")
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
        ValidationError: a line without a tab, a query id with whitespace or control
            characters, a line that is not UTF-8 (``path:line:``).
    """
    path = _require_file(Path(path), "TREC topics file")
    topics: dict[str, Query] = {}
    for lineno, line in _iter_lines(path):
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        qid, sep, text = line.partition("\t")
        if not sep:
            raise ValidationError(f"{path}:{lineno}: expected 'qid<TAB>text', got {line!r}")
        qid = check_id(qid.strip(), f"{path}:{lineno}: query")
        topics[qid] = Query(qid, text.strip())
    return topics


def load_trec_qrels(path: str | Path) -> Qrels:
    """TREC qrels (``qid iteration docid rel``, whitespace-separated, ``.gz`` ok).

    Raises:
        NotFoundError: missing file.
        ValidationError: a line without four fields.
    """
    path = _require_file(Path(path), "TREC qrels file")
    qrels: Qrels = {}
    for lineno, line in _iter_lines(path):
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
    for lineno, line in _iter_lines(path):
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
    ``(-score, doc_id)`` with ranks from 1. Parent folders are created. Nothing is written
    when an id or the tag is refused.

    Raises:
        ValidationError: ``tag``, a query id or a document id is empty or contains
            whitespace or control characters (the line's columns would shift; see
            :mod:`heedrank.textrules`).
    """
    if problem := id_problem(tag):
        raise ValidationError(f"run tag {problem}")
    for qid, hits in run.items():
        check_id(qid, f"cannot write run {path}: query")
        for did in hits:
            if problem := id_problem(did):
                raise ValidationError(f"cannot write run {path}: query {qid!r}: document id {problem}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    for qid in sorted(run):
        ranked = sorted(run[qid].items(), key=lambda kv: (-float(kv[1]), kv[0]))
        lines.extend(f"{qid} Q0 {did} {rank} {float(score)!r} {tag}\n" for rank, (did, score) in enumerate(ranked, 1))
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
        ValidationError: not UTF-8 JSON in the expected shape, an id with whitespace or
            control characters, or text with unpaired surrogates.
    """
    path = _require_file(Path(path), "run JSON file")
    raw = "".join(line for _, line in _iter_lines(path))
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise ValidationError(f"{path}: not valid JSON ({exc})") from None
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
        try:
            qid = check_id(str(hits[0]["qid"]), f"{path}: entry {i}: query")
            check_text(text, f"{path}: entry {i}: query {qid!r}")
            queries[qid] = Query(qid, text)
            scores = run.setdefault(qid, {})
            for j, hit in enumerate(hits):
                did = check_id(str(hit["docid"]), f"{path}: entry {i} hit {j}: document")
                score = float(hit["score"])
                if did not in scores or score > scores[did]:
                    scores[did] = score
                if did not in docs:
                    docs[did] = Document(doc_id=did, text=check_text(str(hit["content"]),
                                                                     f"{path}: entry {i} hit {j}: content"))
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, ValidationError):
                raise
            raise ValidationError(f"{path}: entry {i} has a hit without qid, docid, score or content ({exc!r})") from None
    return run, docs, queries


@dataclass(frozen=True)
class TrecDLPaths:
    """Files of one TREC DL first-stage run: topics, NIST qrels, run JSON with text, TREC
    run, and the set tag: the track year (``"dl21"``) or a ``dev<N>`` tag (``"dev600"``);
    ``None`` when explicit paths do not say."""

    topics: Path
    qrels: Path
    run_json: Path
    trec_run: Path | None = None
    year: str | None = None


SET_TAG = r"dl\d\d|dev\d+"
"""Set tags in TREC DL-layout file names: a track year (``dl19``) or an MS MARCO dev sample
(``dev600``)."""

_TREC_DL_FILE = re.compile(
    rf"^(?:topics\.(?P<a>{SET_TAG})(?:-passage)?\.(?:txt|tsv)|qrels\.(?P<b>{SET_TAG})(?:-passage)?\.txt)(?:\.gz)?$"
    rf"|^(?:retrieve_results_.+_(?P<c>{SET_TAG})_top\d+\.json|trec_results_.+_(?P<d>{SET_TAG})_top\d+\.txt)(?:\.gz)?$"
)
_TREC_DL_NAMES = (
    "topics.dlNN.txt or topics.dlNN-passage.txt, qrels.dlNN-passage.txt and "
    "retrieve_results_<RUN>_dlNN_top100.json[.gz] (Anserini / rank_llm names, .gz ok; "
    "a dev<N> tag in place of dlNN, topics .tsv and any top<K> depth are recognised too)"
)


def normalize_trec_dl_year(year: str | int) -> str:
    """``"dl21"`` from ``"dl21"``, ``"DL21"``, ``"21"``, ``"2021"``, ``2021`` or ``"dl2021"``;
    a ``dev<N>`` set tag (``"dev600"``) is returned lower-cased.

    Raises:
        ValidationError: neither a TREC DL year nor a ``dev<N>`` tag.
    """
    text = str(year).strip().lower()
    if re.fullmatch(r"dev\d+", text):
        return text
    m = re.fullmatch(r"(?:dl)?(?:20)?(\d\d)", text)
    if m is None:
        raise ValidationError(f"TREC DL year {year!r} is not one of the forms dl21, 21 or 2021 (or a set tag like dev600)")
    return f"dl{m.group(1)}"


def _year_of(name: str) -> str | None:
    m = _TREC_DL_FILE.match(name)
    return None if m is None else (m.group("a") or m.group("b") or m.group("c") or m.group("d"))


def run_name_of(path: str | Path) -> str:
    """``<RUN>`` of a rank_llm run file ``retrieve_results_<RUN>_<tag>_top<K>.json[.gz]``
    (``tag``: :data:`SET_TAG`), else the file's stem.

    Example:
        >>> run_name_of("retrieve_results_BM25_dev600_top20.json.gz"), run_name_of("my-run.json")
        ('BM25', 'my-run')
    """
    name = Path(path).name.removesuffix(".gz").removesuffix(".json")
    m = re.fullmatch(rf"retrieve_results_(.+)_(?:{SET_TAG})_top\d+", name)
    return m.group(1) if m else name


def detect_trec_dl_year(data_dir: str | Path) -> str:
    """The set tag of the files in ``data_dir``, read from their Anserini / rank_llm names:
    the TREC DL year (``"dl19"``, ``"dl20"``, ...) or a ``dev<N>`` tag (``"dev600"``).

    Raises:
        NotFoundError: no file of those names.
        ValidationError: files of several years (choose one with ``year``/``--year``).
    """
    d = Path(data_dir)
    years = sorted({y for p in d.iterdir() if p.is_file() and (y := _year_of(p.name))}) if d.is_dir() else []
    if not years:
        raise NotFoundError(
            f"no TREC DL files found in {d}: expected {_TREC_DL_NAMES}; "
            "or pass the files with --topics, --qrels and --run-file"
        )
    if len(years) > 1:
        raise ValidationError(f"{d} holds files of several TREC DL years ({', '.join(years)}); choose one with --year")
    return years[0]


def _runs_in(d: Path, prefix: str, tag: str, ext: str) -> dict[str, Path]:
    """``{RUN: path}`` of ``<prefix><RUN>_<tag>_top<K>.<ext>[.gz]`` in ``d``; of several files of
    one run, the deepest ``K``, then the one not gzipped."""
    pattern = re.compile(rf"^{re.escape(prefix)}(.+)_{re.escape(tag)}_top(\d+)\.{ext}(\.gz)?$")
    found: dict[str, tuple[int, bool, Path]] = {}
    for p in sorted(d.iterdir()):
        m = pattern.match(p.name)
        if m and p.is_file():
            key = (int(m.group(2)), m.group(3) is None, p)
            if m.group(1) not in found or key[:2] > found[m.group(1)][:2]:
                found[m.group(1)] = key
    return {run: key[2] for run, key in found.items()}


def trec_dl_paths(
    data_dir: str | Path | None,
    run_name: str = "BM25",
    *,
    year: str | int | None = None,
    topics: str | Path | None = None,
    qrels: str | Path | None = None,
    run_file: str | Path | None = None,
) -> TrecDLPaths:
    """Locate the TREC DL files of run ``run_name`` (e.g. ``"BM25"``) of one track year.

    In ``data_dir`` the names of Anserini and rank_llm are recognised, for any year ``dlNN``:
    topics ``topics.dlNN-passage.txt`` (2019) or ``topics.dlNN.txt`` (2020 on), qrels
    ``qrels.dlNN-passage.txt`` (or ``qrels.dlNN.txt``), the run with passage texts
    ``retrieve_results_<RUN>_dlNN_top100.json`` and (optional) the TREC run
    ``trec_results_<RUN>_dlNN_top100.txt``, each also ``.gz``. The same names with a
    ``dev<N>`` tag for ``dlNN``, topics ending ``.tsv`` and runs of any depth ``top<K>``
    are recognised too (``topics.dev600.tsv``, ``qrels.dev600.txt``,
    ``retrieve_results_BM25_dev600_top20.json.gz``); of one run at several depths the
    deepest is taken. Explicit ``topics``, ``qrels`` and ``run_file`` paths take precedence
    (any names; ``data_dir`` may then be ``None`` when all three are given).

    Args:
        data_dir: The folder of the files, or ``None``.
        run_name: First-stage run of ``retrieve_results_<RUN>_...`` (unused with ``run_file``).
        year: ``"dl21"``, ``"21"``, ``"2021"`` or a tag such as ``"dev600"``; default:
            detected from the names of the files in ``data_dir`` (:func:`detect_trec_dl_year`),
            or of the explicit files.
        topics, qrels, run_file: Explicit paths of the topics, qrels and run JSON.

    Raises:
        NotFoundError: a folder or required file is missing; the message lists the available runs.
        ValidationError: no folder and not all three explicit paths; several years in the
            folder and no ``year``; a malformed ``year``.
    """
    d = Path(data_dir) if data_dir is not None else None
    if d is None and None in (topics, qrels, run_file):
        raise ValidationError("give the TREC DL folder (--data), or all of --topics, --qrels and --run-file")
    if d is not None and not d.is_dir():
        raise NotFoundError(f"TREC DL folder not found: {d}")
    explicit = [Path(p) for p in (topics, qrels, run_file) if p is not None]
    for p in explicit:
        _require_file(p, "TREC DL file")
    if year is not None:
        y: str | None = normalize_trec_dl_year(year)
    elif d is not None and len(explicit) < 3:
        y = detect_trec_dl_year(d)
    else:
        y = next((yy for p in explicit if (yy := _year_of(p.name))), None)

    def pick(*stems: str) -> Path | None:
        for stem in stems:
            for cand in (d / stem, d / f"{stem}.gz"):  # type: ignore[operator]
                if cand.is_file():
                    return cand
        return None

    topics_path = Path(topics) if topics is not None else pick(
        f"topics.{y}-passage.txt", f"topics.{y}.txt", f"topics.{y}.tsv")
    qrels_path = Path(qrels) if qrels is not None else pick(f"qrels.{y}-passage.txt", f"qrels.{y}.txt")
    if topics_path is None or qrels_path is None:
        missing = " and ".join(w for w, p in (("topics", topics_path), ("qrels", qrels_path)) if p is None)
        raise NotFoundError(
            f"TREC DL {missing} for {y} not found in {d}: expected topics.{y}.txt, topics.{y}-passage.txt or "
            f"topics.{y}.tsv and qrels.{y}-passage.txt or qrels.{y}.txt (.gz ok); or pass them with --topics/--qrels"
        )
    if run_file is not None:
        return TrecDLPaths(topics_path, qrels_path, Path(run_file), None, y)
    runs = _runs_in(d, "retrieve_results_", str(y), "json")  # type: ignore[arg-type]
    if run_name not in runs:
        raise NotFoundError(
            f"run {run_name!r} not found in {d} for {y}; available runs: {sorted(runs) or 'none'} "
            "(or pass a run JSON with --run-file)"
        )
    trec_run = _runs_in(d, "trec_results_", str(y), "txt").get(run_name)  # type: ignore[arg-type]
    return TrecDLPaths(topics_path, qrels_path, runs[run_name], trec_run, y)


# ------------------------------------------------------------------------------ NovelEval
@dataclass(frozen=True)
class NovelEvalPaths:
    """Files of a NovelEval folder (RankGPT's layout): ``queries.tsv`` (``qid<TAB>question``),
    ``corpus.tsv`` (``docid<TAB>passage``, doc ids ``<qid>-<n>``) and ``qrels.txt`` (TREC qrels)."""

    queries: Path
    corpus: Path
    qrels: Path


def noveleval_paths(data_dir: str | Path) -> NovelEvalPaths | None:
    """The NovelEval files of ``data_dir``, or ``None`` when it lacks any of ``queries.tsv``,
    ``corpus.tsv`` and ``qrels.txt`` (each also ``.gz``)."""
    d = Path(data_dir)
    found = []
    for name in ("queries.tsv", "corpus.tsv", "qrels.txt"):
        path = next((p for p in (d / name, d / f"{name}.gz") if p.is_file()), None)
        if path is None:
            return None
        found.append(path)
    return NovelEvalPaths(*found)


def _tsv_rows(path: Path, what: str, item: str) -> Iterator[tuple[int, str, str]]:
    """``(line, id, text)`` of a two-column TSV whose fields are quoted as CSV does (a field
    holding a tab, a quote or a line break is in double quotes, its quotes doubled; pandas'
    ``to_csv(sep="\\t")``). Blank lines are skipped.

    Raises:
        NotFoundError: missing file.
        ValidationError: not UTF-8, broken quoting, a row without two fields, an id with
            whitespace or control characters, or text with unpaired surrogates (``path:line:``).
    """
    _require_file(path, f"TSV {what} file")
    text = "".join(line for _, line in _iter_lines(path))
    reader = csv.reader(io.StringIO(text, newline=""), delimiter="\t", strict=True)
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise ValidationError(f"{path}:{reader.line_num}: {exc}; expected 'id<TAB>text' quoted as CSV") from None
        if not row or not any(field.strip() for field in row):
            continue
        if len(row) != 2:
            raise ValidationError(f"{path}:{reader.line_num}: expected 'id<TAB>text', got {len(row)} fields")
        rid = check_id(row[0].strip(), f"{path}:{reader.line_num}: {item}")
        yield reader.line_num, rid, check_text(row[1], f"{path}:{reader.line_num}: {item} {rid!r}")


def load_tsv_queries(path: str | Path) -> dict[str, Query]:
    """Queries of a CSV-quoted ``qid<TAB>text`` file (NovelEval's ``queries.tsv``), in file
    order, texts stripped.

    Raises:
        NotFoundError, ValidationError: as :func:`load_tsv_corpus`.
    """
    return {qid: Query(qid, text.strip()) for _, qid, text in _tsv_rows(Path(path), "queries", "query")}


def load_tsv_corpus(path: str | Path) -> dict[str, Document]:
    """Passages of a CSV-quoted ``docid<TAB>text`` file (NovelEval's ``corpus.tsv``), in file
    order; no titles. A quoted field is unquoted (NovelEval's passage ``14-17`` holds tabs,
    80 passages hold quotes), as RankGPT's own ``data.json`` has them.

    Returns:
        ``{doc_id: Document}``; a repeated id keeps its first text.

    Raises:
        NotFoundError: missing file.
        ValidationError: not UTF-8, broken quoting, a row without two fields, an id with
            whitespace or control characters, or text with unpaired surrogates (``path:line:``).
    """
    docs: dict[str, Document] = {}
    for _, did, text in _tsv_rows(Path(path), "corpus", "document"):
        docs.setdefault(did, Document(doc_id=did, text=text))
    return docs

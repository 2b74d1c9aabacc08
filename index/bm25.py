"""BM25 over ``title + " " + text`` with bm25s (the ``bm25/`` folder of an index directory).

Scoring: bm25s ``method="lucene"`` with ``k1 = 0.9``, ``b = 0.4``, the parameters of
pyserini's BEIR "flat" baselines (docs/design/algorithms.md section 5)::

    score(q, d) = sum over query tokens t of  idf(t) * tf(t, d) / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl))
    idf(t)      = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))

A query token that occurs twice counts twice (as in a Lucene ``BooleanQuery``).

Tokenisation (the same :class:`Analyzer` for documents and queries; its settings, with
its version :data:`ANALYZER_VERSION`, are saved in ``bm25/analyzer.json`` and in the index's
``params.json``):

1. Unicode folding (:func:`heedrank.textrules.fold_text`, NFKC_Casefold): zero-width
   characters, soft hyphens and other default-ignorable code points removed, NFKC (NFD
   accents compose; full-width letters and ligatures such as "ﬁ" become plain letters),
   case folding (``str.casefold``; "Straße" matches "strasse"). Text that is the same to a
   reader gives the same tokens whatever its bytes. Analyzer version 1 (indexes built before
   it) only lower-cased (``str.lower``);
2. split with the regex ``(?u)\\b\\w+\\b``: runs of Unicode word characters, single
   characters included, as Lucene's standard tokenizer keeps them (the "d" of "vitamin d").
   bm25s's default ``\\w\\w+`` drops them and loses 0.27 nDCG@10 on NFCorpus test
   (31.77 vs 32.04; pyserini: 32.2). Punctuation separates tokens;
3. drop English stop words: bm25s's ``"english"`` list, the 33 words of Lucene's
   ``EnglishAnalyzer`` default set (a, an, and, are, as, at, be, but, by, for, if, in,
   into, is, it, no, not, of, on, or, such, that, the, their, then, there, these, they,
   this, to, was, will, with);
4. stem with PyStemmer's Snowball ``"english"`` (Porter2) stemmer.

This is close to, not identical with, Lucene's ``EnglishAnalyzer`` (standard tokenizer,
possessive filter, Porter stemmer) behind an ICU ``nfkc_cf`` normaliser. Query tokens absent
from the index vocabulary are ignored. NFCorpus test BM25 nDCG@10 is 32.04 with either
version (32.040 with version 1, 32.039 with version 2; ``tests/retriever/test_nfcorpus_bm25.py``).

Analyzer versions: an index keeps the analyzer it was built with (queries are analysed the
same way, so its tokens always match). An index of version 1 still opens and answers as it
did, with a warning naming the command that upgrades it (``heedrank index compact``, which
rebuilds BM25 with the current analyzer, or a new ``heedrank index build``); a version this
heedrank does not know (a newer one's) is refused with
:class:`~heedrank.errors.IndexMismatchError`.

Only documents that contain at least one query token (score > 0) are returned, as in
Lucene: a query with no known token gets no hits, and ``k`` larger than the number of
matching documents returns fewer hits (never padding, never an error). Ties at the
``k``-th score are all returned so that the caller can break them by doc id.

Other variants: ``method`` may be any bm25s method (``"robertson"``, ``"atire"``,
``"bm25l"``, ``"bm25+"``); the shipped default stays ``"lucene"``. bm25s's
``"robertson"`` omits the constant ``(k1 + 1)`` factor of the textbook formula and floors
negative IDFs (``df > N / 2``) at 0; rank-bm25's ``BM25Okapi`` keeps the factor and
replaces negative IDFs by ``epsilon * mean IDF`` (0.25 by default). With
``epsilon = 0`` the two agree to float32 precision up to that factor, and ``"bm25+"``
equals ``BM25Plus`` with the same ``delta`` (``tests/index/test_bm25_parity.py``).

Updates: bm25s cannot add or remove documents in place. Rows map to vids through
``row_vids``; deleted rows are masked out (:meth:`BM25Index.mark_deleted`), and documents
added since the build are served from a :class:`BM25Delta` merged at query time. Delta
documents are scored with the main index's statistics (``N``, ``df``, ``avgdl`` as of
the build; ``df`` of terms new to the delta from the delta), so their scores compare with
the main index's; a rebuild (``Index.compact``) folds the delta in and refreshes the
statistics.

``bm25s`` and ``Stemmer`` are imported when an index is built or loaded.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from heedrank.errors import IndexMismatchError, NotFoundError, ValidationError, require
from heedrank.textrules import fold_text

logger = logging.getLogger(__name__)

ANALYZER_FILE = "analyzer.json"
STATS_FILE = "stats.json"
VIDS_FILE = "vids.npy"
UPDATABLE_METHODS = ("lucene", "robertson", "atire")
ANALYZER_VERSION = 2
"""Version of the analysis :class:`Analyzer` applies (written into new indexes): 1 =
``str.lower`` only, 2 = Unicode NFKC_Casefold (:func:`heedrank.textrules.fold_text`)."""
KNOWN_ANALYZER_VERSIONS = (1, 2)


@dataclass(frozen=True)
class BM25Params:
    """BM25 scoring and tokenisation settings (saved with the index).

    Attributes:
        k1: Term-frequency saturation.
        b: Length normalisation.
        method: bm25s scoring variant (``"lucene"``; also ``"robertson"``, ``"atire"``,
            ``"bm25l"``, ``"bm25+"``).
        delta: The ``delta`` of ``"bm25l"`` / ``"bm25+"`` (unused by the others).
        lower: Lower-case before splitting.
        token_pattern: Regex whose matches are the tokens.
        stopwords: bm25s stop-word list name (``"english"``: Lucene's 33 words), or
            ``None`` for none.
        stemmer: PyStemmer algorithm (``"english"`` = Snowball Porter2), or ``None``.
        analyzer_version: :data:`ANALYZER_VERSION` for new indexes; 1 for those built before
            versions were recorded (their ``analyzer.json`` has none).
    """

    k1: float = 0.9
    b: float = 0.4
    method: str = "lucene"
    delta: float = 0.5
    lower: bool = True
    token_pattern: str = r"(?u)\b\w+\b"
    stopwords: str | None = "english"
    stemmer: str | None = "english"
    analyzer_version: int = ANALYZER_VERSION

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BM25Params:
        """Params saved by :meth:`to_dict`; without ``analyzer_version`` (indexes built
        before it was recorded) the analyzer is version 1."""
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{"analyzer_version": 1, **{k: v for k, v in data.items() if k in known}})


class Analyzer:
    """Text -> tokens, per :class:`BM25Params` (see the module docstring).

    Thread-safe: the PyStemmer object (not thread-safe itself) is guarded by a lock, and
    stems are memoised.

    Raises:
        IndexMismatchError: ``params.analyzer_version`` is not one this heedrank knows.
    """

    def __init__(self, params: BM25Params = BM25Params()) -> None:
        if params.analyzer_version not in KNOWN_ANALYZER_VERSIONS:
            raise IndexMismatchError(
                f"BM25 analyzer version {params.analyzer_version!r} is unknown to this heedrank (it knows "
                f"{list(KNOWN_ANALYZER_VERSIONS)}): the index was built by another heedrank version; use that "
                "one, or rebuild the index with `heedrank index build --corpus DATA --out INDEX --overwrite`"
            )
        self.params = params
        self._split = re.compile(params.token_pattern).findall
        if params.stopwords:
            from bm25s.tokenization import _infer_stopwords

            self.stopwords: frozenset[str] = frozenset(_infer_stopwords(params.stopwords))
        else:
            self.stopwords = frozenset()
        self._stemmer = None
        if params.stemmer:
            Stemmer = require("Stemmer", "index")
            self._stemmer = Stemmer.Stemmer(params.stemmer)
        self._stems: dict[str, str] = {}
        self._lock = threading.Lock()

    def __call__(self, texts: Iterable[str]) -> list[list[str]]:
        """Tokens of each text, in order (duplicates kept)."""
        out: list[list[str]] = []
        fold = self.params.analyzer_version >= 2
        for text in texts:
            if fold:
                text = fold_text(text, casefold=self.params.lower)
            elif self.params.lower:
                text = text.lower()
            words = [w for w in self._split(text) if w not in self.stopwords]
            out.append(self._stem(words) if self._stemmer is not None else words)
        return out

    def _stem(self, words: list[str]) -> list[str]:
        stems = self._stems
        missing = [w for w in dict.fromkeys(words) if w not in stems]
        if missing:
            with self._lock:
                new = self._stemmer.stemWords(missing)  # type: ignore[union-attr]
                stems.update(zip(missing, new))
        return [stems[w] for w in words]

    def describe(self) -> dict[str, Any]:
        p = self.params
        return {
            "analyzer_version": p.analyzer_version,
            "unicode": "NFKC_Casefold (default-ignorables removed, NFKC, casefold)" if p.analyzer_version >= 2
            else "none (str.lower only)",
            "lower": p.lower,
            "token_pattern": p.token_pattern,
            "stopwords": p.stopwords,
            "n_stopwords": len(self.stopwords),
            "stemmer": f"PyStemmer:{p.stemmer}" if p.stemmer else None,
            "field": 'title + " " + text',
        }


def topk_indices(scores: np.ndarray, k: int, *, positive_only: bool = True) -> np.ndarray:
    """Indices of the ``k`` best scores, plus every index tied with the ``k``-th score.

    Args:
        scores: float ``(n,)``.
        k: Wanted count; clamped to what exists.
        positive_only: Only consider entries with score > 0.

    Returns:
        int64 ``(m,)`` indices, unordered; ``m >= min(k, eligible)`` (ties included).
    """
    if k <= 0:
        return np.empty(0, dtype=np.int64)
    eligible = np.flatnonzero(scores > 0) if positive_only else np.arange(len(scores))
    if len(eligible) <= k:
        return eligible.astype(np.int64, copy=False)
    sub = scores[eligible]
    kth = np.partition(sub, len(sub) - k)[len(sub) - k]
    return eligible[sub >= kth].astype(np.int64, copy=False)


@dataclass
class BM25Builder:
    """Accumulates tokenised documents in ``vid`` order, then builds a :class:`BM25Index`.

    Memory: one Python list of int token ids per document until :meth:`build`.
    """

    params: BM25Params = field(default_factory=BM25Params)

    def __post_init__(self) -> None:
        self.analyzer = Analyzer(self.params)
        self.vocab: dict[str, int] = {}
        self.corpus_ids: list[list[int]] = []

    def add(self, texts: Sequence[str]) -> None:
        """Tokenise and append documents (their ``vid`` is their position)."""
        vocab = self.vocab
        for tokens in self.analyzer(texts):
            ids = []
            for tok in tokens:
                tid = vocab.get(tok)
                if tid is None:
                    tid = vocab[tok] = len(vocab)
                ids.append(tid)
            self.corpus_ids.append(ids)

    def __len__(self) -> int:
        return len(self.corpus_ids)

    def build(self, *, show_progress: bool = False, row_vids: np.ndarray | None = None) -> BM25Index:
        """Compute the BM25 matrix.

        Args:
            show_progress: bm25s progress bar.
            row_vids: int64 vid of each added document (default: 0, 1, 2, ...).

        Raises:
            ValidationError: empty corpus, or ``row_vids`` of the wrong length.
        """
        if not self.corpus_ids:
            raise ValidationError("cannot build a BM25 index over an empty corpus")
        bm25s = require("bm25s", "index")
        vocab = dict(self.vocab)
        if not vocab:  # every document is empty: keep one dummy token so bm25s has a column
            vocab[""] = 0
        n = len(self.corpus_ids)
        avgdl = sum(len(d) for d in self.corpus_ids) / n
        vids = np.arange(n, dtype=np.int64) if row_vids is None else np.asarray(row_vids, dtype=np.int64)
        if len(vids) != n:
            raise ValidationError(f"got {len(vids)} row vids for {n} documents")
        p = self.params
        model = bm25s.BM25(k1=p.k1, b=p.b, method=p.method, delta=p.delta)
        model.index((self.corpus_ids, vocab), create_empty_token=False, show_progress=show_progress)
        self.corpus_ids = []
        return BM25Index(model, self.analyzer, row_vids=vids, avgdl=avgdl)


class BM25Delta:
    """Documents added since the BM25 matrix was built, scored at query time.

    Holds per document its length and term counts, and per term its postings; scores use
    the main index's statistics (see the module docstring). Not thread-safe on its own:
    :class:`BM25Index` guards it.
    """

    def __init__(self) -> None:
        self.docs: dict[int, tuple[int, dict[str, int]]] = {}  # vid -> (length, {term: tf})
        self.postings: dict[str, dict[int, int]] = {}  # term -> {vid: tf}

    def add(self, vid: int, tokens: Sequence[str]) -> None:
        counts: dict[str, int] = {}
        for t in tokens:
            counts[t] = counts.get(t, 0) + 1
        self.remove(vid)
        self.docs[vid] = (len(tokens), counts)
        for t, tf in counts.items():
            self.postings.setdefault(t, {})[vid] = tf

    def remove(self, vid: int) -> bool:
        entry = self.docs.pop(vid, None)
        if entry is None:
            return False
        for t in entry[1]:
            post = self.postings.get(t)
            if post is not None:
                post.pop(vid, None)
                if not post:
                    del self.postings[t]
        return True

    def __len__(self) -> int:
        return len(self.docs)


class BM25Index:
    """A bm25s model with its analyzer, row -> vid map, deleted-row mask and delta.

    Build with :class:`BM25Builder`, persist with :meth:`save` / :meth:`load`. Searches
    and updates are thread-safe (updates take a lock; searches read a consistent
    snapshot of the mask and delta).

    Args:
        model: Fitted ``bm25s.BM25``.
        analyzer: The analyzer its tokens came from.
        row_vids: int64 vid of each row, strictly increasing (default ``0..n-1``).
        avgdl: Mean document length in tokens at build time (``None`` when unknown:
            then documents cannot be added).
    """

    def __init__(self, model: Any, analyzer: Analyzer, *, row_vids: np.ndarray | None = None,
                 avgdl: float | None = None) -> None:
        self.model = model
        self.analyzer = analyzer
        self.params = analyzer.params
        self._vocab: dict[str, int] = model.vocab_dict
        n = int(model.scores["num_docs"])
        self.row_vids = np.arange(n, dtype=np.int64) if row_vids is None else np.asarray(row_vids, dtype=np.int64)
        if len(self.row_vids) != n:
            raise NotFoundError(f"BM25 index has {n} rows but {len(self.row_vids)} row vids")
        self.avgdl = avgdl
        self._deleted = np.zeros(n, dtype=bool)
        self._n_deleted = 0
        self.delta = BM25Delta()
        self._lock = threading.Lock()
        self._df_cache: np.ndarray | None = None

    @property
    def num_docs(self) -> int:
        """Rows of the BM25 matrix (deleted rows included)."""
        return int(self.model.scores["num_docs"])

    @property
    def num_live(self) -> int:
        """Rows not deleted plus delta documents."""
        return self.num_docs - self._n_deleted + len(self.delta)

    @property
    def vocab_size(self) -> int:
        return len(self._vocab)

    def query_token_ids(self, text: str) -> list[int]:
        """Vocabulary ids of the query's tokens (unknown tokens dropped, repeats kept)."""
        vocab = self._vocab
        return [vocab[t] for t in self.analyzer([text])[0] if t in vocab]

    def scores(self, text: str) -> np.ndarray:
        """float32 ``(num_docs,)`` BM25 score of every row of the matrix (0 = no query
        token); deleted rows and delta documents are not accounted for here."""
        ids = self.query_token_ids(text)
        if not ids:
            return np.zeros(self.num_docs, dtype=np.float32)
        return np.asarray(self.model.get_scores_from_ids(ids), dtype=np.float32)

    # -- updates -----------------------------------------------------------------------
    def rows_of(self, vids: np.ndarray) -> np.ndarray:
        """Rows of the given vids that are in the matrix (absent vids dropped)."""
        vids = np.asarray(vids, dtype=np.int64).reshape(-1)
        pos = np.searchsorted(self.row_vids, vids)
        ok = pos < len(self.row_vids)
        ok[ok] = self.row_vids[pos[ok]] == vids[ok]
        return pos[ok]

    def mark_deleted(self, vids: Sequence[int] | np.ndarray) -> int:
        """Exclude documents from every search: matrix rows are masked, delta documents
        dropped. Unknown vids are ignored. Returns how many were excluded."""
        vids = np.asarray(vids, dtype=np.int64).reshape(-1)
        with self._lock:
            rows = self.rows_of(vids)
            rows = rows[~self._deleted[rows]]
            deleted = self._deleted.copy()  # searches keep reading the old mask
            deleted[rows] = True
            self._deleted = deleted
            self._n_deleted += len(rows)
            delta = self._copy_delta()
            n = sum(delta.remove(int(v)) for v in vids)
            self.delta = delta
        return len(rows) + n

    def add_documents(self, vids: Sequence[int], texts: Sequence[str]) -> None:
        """Add documents (their ``vid`` and indexed text) to the delta.

        Raises:
            ValidationError: the method cannot be updated (``bm25l``/``bm25+``) or the
                index lacks its build statistics (format-1 index: rebuild it).
        """
        if self.params.method not in UPDATABLE_METHODS:
            raise ValidationError(
                f"BM25 method {self.params.method!r} cannot take new documents; use one of {list(UPDATABLE_METHODS)}"
            )
        if self.avgdl is None:
            raise ValidationError("this BM25 index has no build statistics (format 1); rebuild it to add documents")
        tokens = self.analyzer(texts)
        with self._lock:
            delta = self._copy_delta()
            for vid, toks in zip(vids, tokens):
                delta.add(int(vid), toks)
            self.delta = delta

    def _copy_delta(self) -> BM25Delta:
        out = BM25Delta()
        out.docs = dict(self.delta.docs)
        out.postings = {t: dict(p) for t, p in self.delta.postings.items()}
        return out

    def _df(self) -> np.ndarray:
        if self._df_cache is None:
            self._df_cache = np.diff(np.asarray(self.model.scores["indptr"])).astype(np.int64)
        return self._df_cache

    def _delta_scores(self, delta: BM25Delta, text: str) -> dict[int, float]:
        """BM25 of the delta documents for one query (see the module docstring)."""
        if not len(delta):
            return {}
        from bm25s.scoring import _select_idf_scorer, _select_tfc_scorer

        p = self.params
        idf_fn, tfc_fn = _select_idf_scorer(p.method), _select_tfc_scorer(p.method)
        n_main, df_main = self.num_docs, self._df()
        avgdl = float(self.avgdl or 1.0)
        out: dict[int, float] = {}
        for t in self.analyzer([text])[0]:
            post = delta.postings.get(t)
            if not post:
                continue
            tid = self._vocab.get(t)
            if tid is not None and df_main[tid] > 0:
                idf = idf_fn(int(df_main[tid]), N=n_main)
            else:
                idf = idf_fn(len(post), N=n_main + len(delta))
            for vid, tf in post.items():
                dl = delta.docs[vid][0]
                out[vid] = out.get(vid, 0.0) + float(np.float32(idf) * tfc_fn(
                    tf_array=np.float32(tf), l_d=dl, l_avg=avgdl, k1=p.k1, b=p.b, delta=p.delta))
        return out

    # -- search ------------------------------------------------------------------------
    def search(
        self, texts: Sequence[str], k: int, *, allowed: np.ndarray | None = None
    ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Top-``k`` documents of each query among live (and ``allowed``) documents.

        Args:
            texts: Query texts.
            k: Hits wanted per query (clamped to the matching documents).
            allowed: Sorted int64 vids a hit must have (a metadata filter), or ``None``.

        Returns:
            Per query ``(vids int64 (m,), scores float32 (m,))`` sorted by descending
            score, only documents with score > 0; ``m`` may exceed ``k`` by the documents
            tied with the ``k``-th score (cut them after breaking ties by doc id).
        """
        deleted, n_deleted, delta = self._deleted, self._n_deleted, self.delta  # snapshot
        keep: np.ndarray | None = None
        if allowed is not None:
            keep = np.zeros(self.num_docs, dtype=bool)
            keep[self.rows_of(np.asarray(allowed, dtype=np.int64))] = True
            if n_deleted:
                keep &= ~deleted
        elif n_deleted:
            keep = ~deleted
        allowed_delta = None
        if allowed is not None and len(delta):
            dv = np.fromiter(delta.docs, dtype=np.int64, count=len(delta.docs))
            allowed_delta = set(dv[np.isin(dv, allowed)].tolist())
        out = []
        for text in texts:
            s = self.scores(text)
            if keep is not None:
                s = np.where(keep, s, np.float32(0))
            idx = topk_indices(s, k)
            vids, scores = self.row_vids[idx], s[idx]
            extra = self._delta_scores(delta, text)
            if extra:
                items = [(v, sc) for v, sc in extra.items() if sc > 0 and (allowed_delta is None or v in allowed_delta)]
                if items:
                    vids = np.concatenate([vids, np.array([v for v, _ in items], dtype=np.int64)])
                    scores = np.concatenate([scores, np.array([sc for _, sc in items], dtype=np.float32)])
                    top = topk_indices(scores, k)
                    vids, scores = vids[top], scores[top]
            order = np.argsort(-scores, kind="stable")
            out.append((vids[order].astype(np.int64, copy=False), scores[order].astype(np.float32, copy=False)))
        return out

    # -- persistence -------------------------------------------------------------------
    def save(self, folder: str | Path) -> None:
        """Write the bm25s arrays, vocabulary, ``analyzer.json``, ``stats.json`` and
        ``vids.npy`` into ``folder`` (the delta and deletions are not written: they are
        re-derived from the document store)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.model.save(str(folder), show_progress=False)
        (folder / ANALYZER_FILE).write_text(json.dumps(self.params.to_dict(), indent=2))
        (folder / STATS_FILE).write_text(json.dumps({"num_docs": self.num_docs, "avgdl": self.avgdl}, indent=2))
        np.save(folder / VIDS_FILE, self.row_vids)

    @classmethod
    def load(cls, folder: str | Path, *, mmap: bool = True) -> BM25Index:
        """Load from ``folder`` (arrays memory-mapped by default). A folder without
        ``vids.npy`` (format 1) has rows = vids ``0..n-1`` and no statistics.

        Raises:
            NotFoundError: missing or unreadable files.
            IndexMismatchError: an analyzer version this heedrank does not know.
        """
        folder = Path(folder)
        if not (folder / ANALYZER_FILE).is_file() or not (folder / "params.index.json").is_file():
            raise NotFoundError(f"no BM25 index in {folder}")
        bm25s = require("bm25s", "index")
        try:
            params = BM25Params.from_dict(json.loads((folder / ANALYZER_FILE).read_text()))
            model = bm25s.BM25.load(str(folder), mmap=mmap, show_progress=False)
            row_vids = np.load(folder / VIDS_FILE) if (folder / VIDS_FILE).is_file() else None
            stats = json.loads((folder / STATS_FILE).read_text()) if (folder / STATS_FILE).is_file() else {}
        except (OSError, ValueError, KeyError) as exc:
            raise NotFoundError(f"BM25 index in {folder} is unreadable ({exc})") from exc
        return cls(model, Analyzer(params), row_vids=row_vids, avgdl=stats.get("avgdl"))

    def describe(self) -> dict[str, Any]:
        return {
            "k1": self.params.k1,
            "b": self.params.b,
            "method": self.params.method,
            "num_docs": self.num_docs,
            "vocab_size": self.vocab_size,
            "avgdl": self.avgdl,
            "tokenization": self.analyzer.describe(),
        }

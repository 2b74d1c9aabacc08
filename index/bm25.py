"""BM25 over ``title + " " + text`` with bm25s (the ``bm25/`` folder of an index directory).

Scoring: bm25s ``method="lucene"`` with ``k1 = 0.9``, ``b = 0.4``, the parameters of
pyserini's BEIR "flat" baselines (ALGORITHMS.md section 5)::

    score(q, d) = sum over query tokens t of  idf(t) * tf(t, d) / (tf(t, d) + k1 * (1 - b + b * |d| / avgdl))
    idf(t)      = ln(1 + (N - df(t) + 0.5) / (df(t) + 0.5))

A query token that occurs twice counts twice (as in a Lucene ``BooleanQuery``).

Tokenisation (the same :class:`Analyzer` for documents and queries; its settings are
saved in ``bm25/analyzer.json`` and in the index's ``params.json``):

1. lower-case (``str.lower``);
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
possessive filter, Porter stemmer). Query tokens absent from the index vocabulary are
ignored.

Only documents that contain at least one query token (score > 0) are returned, as in
Lucene: a query with no known token gets no hits, and ``k`` larger than the number of
matching documents returns fewer hits (never padding, never an error). Ties at the
``k``-th score are all returned so that the caller can break them by doc id.

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

from attnrank.errors import NotFoundError, ValidationError, require

logger = logging.getLogger(__name__)

ANALYZER_FILE = "analyzer.json"


@dataclass(frozen=True)
class BM25Params:
    """BM25 scoring and tokenisation settings (saved with the index).

    Attributes:
        k1: Term-frequency saturation.
        b: Length normalisation.
        method: bm25s scoring variant (``"lucene"``).
        lower: Lower-case before splitting.
        token_pattern: Regex whose matches are the tokens.
        stopwords: bm25s stop-word list name (``"english"``: Lucene's 33 words), or
            ``None`` for none.
        stemmer: PyStemmer algorithm (``"english"`` = Snowball Porter2), or ``None``.
    """

    k1: float = 0.9
    b: float = 0.4
    method: str = "lucene"
    lower: bool = True
    token_pattern: str = r"(?u)\b\w+\b"
    stopwords: str | None = "english"
    stemmer: str | None = "english"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> BM25Params:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})


class Analyzer:
    """Text -> tokens, per :class:`BM25Params` (see the module docstring).

    Thread-safe: the PyStemmer object (not thread-safe itself) is guarded by a lock, and
    stems are memoised.
    """

    def __init__(self, params: BM25Params = BM25Params()) -> None:
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
        for text in texts:
            if self.params.lower:
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

    def build(self, *, show_progress: bool = False) -> BM25Index:
        """Compute the BM25 matrix. Raises ValidationError on an empty corpus."""
        if not self.corpus_ids:
            raise ValidationError("cannot build a BM25 index over an empty corpus")
        bm25s = require("bm25s", "index")
        vocab = dict(self.vocab)
        if not vocab:  # every document is empty: keep one dummy token so bm25s has a column
            vocab[""] = 0
        model = bm25s.BM25(k1=self.params.k1, b=self.params.b, method=self.params.method)
        model.index((self.corpus_ids, vocab), create_empty_token=False, show_progress=show_progress)
        self.corpus_ids = []
        return BM25Index(model, self.analyzer)


class BM25Index:
    """A bm25s model with its analyzer; rows are ``vid`` (corpus positions).

    Build with :class:`BM25Builder`, persist with :meth:`save` / :meth:`load`.
    """

    def __init__(self, model: Any, analyzer: Analyzer) -> None:
        self.model = model
        self.analyzer = analyzer
        self.params = analyzer.params
        self._vocab: dict[str, int] = model.vocab_dict

    @property
    def num_docs(self) -> int:
        return int(self.model.scores["num_docs"])

    @property
    def vocab_size(self) -> int:
        return len(self._vocab)

    def query_token_ids(self, text: str) -> list[int]:
        """Vocabulary ids of the query's tokens (unknown tokens dropped, repeats kept)."""
        vocab = self._vocab
        return [vocab[t] for t in self.analyzer([text])[0] if t in vocab]

    def scores(self, text: str) -> np.ndarray:
        """float32 ``(num_docs,)`` BM25 score of every document (0 = no query token)."""
        ids = self.query_token_ids(text)
        if not ids:
            return np.zeros(self.num_docs, dtype=np.float32)
        return np.asarray(self.model.get_scores_from_ids(ids), dtype=np.float32)

    def search(self, texts: Sequence[str], k: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """Top-``k`` documents of each query.

        Args:
            texts: Query texts.
            k: Hits wanted per query (clamped to the matching documents).

        Returns:
            Per query ``(vids int64 (m,), scores float32 (m,))`` sorted by descending
            score, only documents with score > 0; ``m`` may exceed ``k`` by the documents
            tied with the ``k``-th score (cut them after breaking ties by doc id).
        """
        out = []
        for text in texts:
            s = self.scores(text)
            idx = topk_indices(s, k)
            order = np.argsort(-s[idx], kind="stable")
            idx = idx[order]
            out.append((idx, s[idx]))
        return out

    # -- persistence -------------------------------------------------------------------
    def save(self, folder: str | Path) -> None:
        """Write the bm25s arrays, vocabulary and ``analyzer.json`` into ``folder``."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.model.save(str(folder), show_progress=False)
        (folder / ANALYZER_FILE).write_text(json.dumps(self.params.to_dict(), indent=2))

    @classmethod
    def load(cls, folder: str | Path, *, mmap: bool = True) -> BM25Index:
        """Load from ``folder`` (arrays memory-mapped by default).

        Raises:
            NotFoundError: missing or unreadable files.
        """
        folder = Path(folder)
        if not (folder / ANALYZER_FILE).is_file() or not (folder / "params.index.json").is_file():
            raise NotFoundError(f"no BM25 index in {folder}")
        bm25s = require("bm25s", "index")
        try:
            params = BM25Params.from_dict(json.loads((folder / ANALYZER_FILE).read_text()))
            model = bm25s.BM25.load(str(folder), mmap=mmap, show_progress=False)
        except (OSError, ValueError, KeyError) as exc:
            raise NotFoundError(f"BM25 index in {folder} is unreadable ({exc})") from exc
        return cls(model, Analyzer(params))

    def describe(self) -> dict[str, Any]:
        return {
            "k1": self.params.k1,
            "b": self.params.b,
            "method": self.params.method,
            "num_docs": self.num_docs,
            "vocab_size": self.vocab_size,
            "tokenization": self.analyzer.describe(),
        }

"""SQLite document store (``docs.sqlite`` of an index directory).

Schema (one table)::

    docs(doc_id TEXT PRIMARY KEY, vid INTEGER UNIQUE NOT NULL,
         title TEXT, text TEXT, metadata TEXT)   -- metadata: JSON object

``vid`` is the document's position in the corpus (0, 1, 2, ... in insertion order). It
is the row id shared by every index of the directory: the BM25 matrix row and the faiss
label of a document are its ``vid``.

The database runs in WAL mode. Each thread reads through its own connection, so reads
from several threads (the API's worker pool) run concurrently; writes are serialised by a
lock.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from attnrank.errors import NotFoundError, ValidationError
from attnrank.types import Document

logger = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS docs (
    doc_id   TEXT PRIMARY KEY,
    vid      INTEGER NOT NULL UNIQUE,
    title    TEXT NOT NULL DEFAULT '',
    text     TEXT NOT NULL DEFAULT '',
    metadata TEXT NOT NULL DEFAULT '{}'
) WITHOUT ROWID;
"""
_CHUNK = 500  # ids per IN (...) query, below SQLite's host-parameter limit


def _row_to_doc(row: tuple[str, str, str, str]) -> Document:
    doc_id, title, text, meta = row
    return Document(doc_id=doc_id, text=text, title=title, metadata=json.loads(meta) if meta else {})


class SQLiteDocStore:
    """Documents by id in one SQLite file; implements :class:`attnrank.protocols.DocStore`.

    Args:
        path: Database file; created (with its folder) when ``create`` is true.
        create: Create the file and schema if missing. When false, a missing file raises.

    Raises:
        NotFoundError: ``create`` is false and ``path`` does not exist or holds no
            ``docs`` table.

    Example:
        >>> store = SQLiteDocStore(tmp / "docs.sqlite", create=True)
        >>> store.add_many([Document("d1", "text", "Title", {"year": 2020})])
        1
        >>> store.get_many(["d1", "nope"])["d1"].metadata["year"]
        2020
    """

    def __init__(self, path: str | Path, *, create: bool = False) -> None:
        self.path = Path(path)
        if not create and not self.path.is_file():
            raise NotFoundError(f"document store not found: {self.path}")
        if create:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._guard = threading.Lock()
        self._write_lock = threading.Lock()
        self._closed = False
        conn = self._conn()
        if create:
            with self._write_lock:
                conn.execute("PRAGMA journal_mode=WAL")
                conn.executescript(_SCHEMA)
                conn.commit()
        else:
            try:
                conn.execute("SELECT 1 FROM docs LIMIT 1").fetchall()
            except sqlite3.DatabaseError as exc:
                raise NotFoundError(f"{self.path} is not an attnrank document store ({exc})") from exc

    # -- connections -------------------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        if self._closed:
            raise ValidationError(f"document store {self.path} is closed")
        conn = getattr(self._local, "conn", None)
        if conn is None:
            # check_same_thread=False only so that close() may close every thread's
            # connection; each connection is otherwise used by its own thread only.
            conn = sqlite3.connect(self.path, check_same_thread=False, timeout=30.0)
            conn.execute("PRAGMA busy_timeout=30000")
            self._local.conn = conn
            with self._guard:
                self._all.append(conn)
        return conn

    def close(self) -> None:
        """Close every thread's connection. Further use raises ValidationError."""
        with self._guard:
            self._closed = True
            for conn in self._all:
                try:
                    conn.close()
                except sqlite3.Error:  # pragma: no cover - best effort
                    pass
            self._all.clear()

    def __enter__(self) -> SQLiteDocStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing -----------------------------------------------------------------------
    def add_many(self, docs: Iterable[Document]) -> int:
        """Append documents; each gets the next ``vid`` (insertion position).

        Args:
            docs: Documents with ids not yet in the store.

        Returns:
            Number of documents added.

        Raises:
            ValidationError: a doc id already in the store (or repeated in ``docs``); the
                whole call is rolled back.
        """
        conn = self._conn()
        with self._write_lock:
            start = conn.execute("SELECT COALESCE(MAX(vid) + 1, 0) FROM docs").fetchone()[0]
            rows = (
                (d.doc_id, start + i, d.title, d.text, json.dumps(dict(d.metadata), ensure_ascii=False, default=str))
                for i, d in enumerate(docs)
            )
            try:
                with conn:
                    cur = conn.executemany(
                        "INSERT INTO docs (doc_id, vid, title, text, metadata) VALUES (?, ?, ?, ?, ?)", rows
                    )
            except sqlite3.IntegrityError as exc:
                raise ValidationError(f"duplicate document id while adding to {self.path}: {exc}") from exc
            return max(cur.rowcount, 0)

    # -- reading -----------------------------------------------------------------------
    def get_many(self, doc_ids: Sequence[str]) -> dict[str, Document]:
        """The documents that exist among ``doc_ids``, in request order (missing ids absent)."""
        wanted = list(dict.fromkeys(doc_ids))
        found: dict[str, Document] = {}
        conn = self._conn()
        for i in range(0, len(wanted), _CHUNK):
            chunk = wanted[i : i + _CHUNK]
            marks = ",".join("?" * len(chunk))
            for row in conn.execute(
                f"SELECT doc_id, title, text, metadata FROM docs WHERE doc_id IN ({marks})", chunk
            ):
                found[row[0]] = _row_to_doc(row)
        return {d: found[d] for d in wanted if d in found}

    def get(self, doc_id: str) -> Document:
        """One document. Raises NotFoundError if absent."""
        doc = self.get_many([doc_id]).get(doc_id)
        if doc is None:
            raise NotFoundError(f"document {doc_id!r} not found")
        return doc

    def vids_of(self, doc_ids: Sequence[str]) -> dict[str, int]:
        """``{doc_id: vid}`` for the ids that exist."""
        wanted = list(dict.fromkeys(doc_ids))
        out: dict[str, int] = {}
        conn = self._conn()
        for i in range(0, len(wanted), _CHUNK):
            chunk = wanted[i : i + _CHUNK]
            marks = ",".join("?" * len(chunk))
            out.update(conn.execute(f"SELECT doc_id, vid FROM docs WHERE doc_id IN ({marks})", chunk).fetchall())
        return out

    def doc_ids(self) -> list[str]:
        """Every doc id ordered by ``vid`` (so ``doc_ids()[vid]`` is the id of row ``vid``)."""
        rows = self._conn().execute("SELECT doc_id FROM docs ORDER BY vid").fetchall()
        return [r[0] for r in rows]

    def iter_documents(self, batch_size: int = 1000) -> Iterator[Document]:
        """All documents in ``vid`` order, read ``batch_size`` rows at a time."""
        conn = self._conn()
        last = -1
        while True:
            rows = conn.execute(
                "SELECT vid, doc_id, title, text, metadata FROM docs WHERE vid > ? ORDER BY vid LIMIT ?",
                (last, batch_size),
            ).fetchall()
            if not rows:
                return
            for row in rows:
                yield _row_to_doc(row[1:])
            last = rows[-1][0]

    def __iter__(self) -> Iterator[Document]:
        return self.iter_documents()

    def __contains__(self, doc_id: object) -> bool:
        if not isinstance(doc_id, str):
            return False
        return self._conn().execute("SELECT 1 FROM docs WHERE doc_id = ?", (doc_id,)).fetchone() is not None

    def __len__(self) -> int:
        return int(self._conn().execute("SELECT COUNT(*) FROM docs").fetchone()[0])

    def __repr__(self) -> str:
        return f"SQLiteDocStore({str(self.path)!r})"

"""SQLite document store (``docs.sqlite`` of an index directory), the source of truth of
an index: the vector and BM25 files are derived from it and caught up from it on open.

Schema::

    docs(doc_id TEXT PRIMARY KEY, vid INTEGER UNIQUE NOT NULL,
         title TEXT, text TEXT, metadata TEXT)   -- metadata: JSON object
    state(key TEXT PRIMARY KEY, value INTEGER)   -- next_vid
    vectors(vid INTEGER PRIMARY KEY, vec BLOB)   -- float32 (p, d) vectors of documents
                                                 -- added after the vector file was written

``vid`` identifies one *version* of a document: an int64 that only grows (``next_vid``)
and is never reused, also after deletes. A bulk build gives the corpus positions 0, 1,
2, ...; :meth:`SQLiteDocStore.upsert` gives a replaced document a new vid. It is the row
id shared by every index of the directory: the faiss label of a document is its ``vid``
(or ``vid << bits | passage``), and the BM25 rows map to vids.

The database runs in WAL mode with ``synchronous=FULL``: a write that returned is on disk.
Each thread reads through its own connection, so reads from several threads (the API's
worker pool) run concurrently; writes are serialised by a lock. Metadata filters
(:mod:`heedrank.index.filters`) compile to SQL over ``docs.metadata`` (:meth:`filter_vids`).

Stores written before ``state`` and ``vectors`` existed (index format 1) are read as they
are; the tables are created on the first write.
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from heedrank.errors import NotFoundError, ValidationError
from heedrank.types import Document

logger = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS docs (
    doc_id   TEXT PRIMARY KEY,
    vid      INTEGER NOT NULL UNIQUE,
    title    TEXT NOT NULL DEFAULT '',
    text     TEXT NOT NULL DEFAULT '',
    metadata TEXT NOT NULL DEFAULT '{}'
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS state (
    key   TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS vectors (
    vid  INTEGER PRIMARY KEY,
    dim  INTEGER NOT NULL,
    vec  BLOB NOT NULL
);
"""
_CHUNK = 500  # ids per IN (...) query, below SQLite's host-parameter limit


def _in_chunks(conn: sqlite3.Connection, sql: str, values: Sequence[Any]) -> list[tuple]:
    """Run ``sql`` (with ``{marks}`` standing for the ``IN (...)`` placeholders) over
    ``values`` in chunks of at most ``_CHUNK`` bound parameters; all rows returned."""
    rows: list[tuple] = []
    for i in range(0, len(values), _CHUNK):
        chunk = list(values[i : i + _CHUNK])
        rows.extend(conn.execute(sql.format(marks=",".join("?" * len(chunk))), chunk).fetchall())
    return rows


def _row_to_doc(row: tuple[str, str, str, str]) -> Document:
    doc_id, title, text, meta = row
    return Document(doc_id=doc_id, text=text, title=title, metadata=json.loads(meta) if meta else {})


def metadata_json(doc: Document) -> str:
    """The document's metadata as a JSON object string. Raises ValidationError when it
    holds values JSON cannot represent (NaN, infinity) or that are not JSON-serialisable."""
    try:
        return json.dumps(dict(doc.metadata), ensure_ascii=False, allow_nan=False, default=str)
    except ValueError as exc:
        raise ValidationError(f"metadata of document {doc.doc_id!r} is not valid JSON ({exc})") from None


def _check_unique(docs: Sequence[Document]) -> None:
    seen: set[str] = set()
    for d in docs:
        if not isinstance(d.doc_id, str) or not d.doc_id:
            raise ValidationError(f"document ids must be non-empty strings, got {d.doc_id!r}")
        if d.doc_id in seen:
            raise ValidationError(f"document id {d.doc_id!r} occurs twice in one call")
        seen.add(d.doc_id)


class SQLiteDocStore:
    """Documents by id in one SQLite file; implements :class:`heedrank.protocols.WritableDocStore`.

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
                self._schema_ok = True
        else:
            try:
                conn.execute("SELECT 1 FROM docs LIMIT 1").fetchall()
            except sqlite3.DatabaseError as exc:
                raise NotFoundError(f"{self.path} is not an heedrank document store ({exc})") from exc

    # -- connections -------------------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        if self._closed:
            raise ValidationError(f"document store {self.path} is closed")
        conn = getattr(self._local, "conn", None)
        if conn is None:
            # check_same_thread=False only so that close() may close every thread's
            # connection; each connection is otherwise used by its own thread only.
            conn = sqlite3.connect(self.path, check_same_thread=False, timeout=30.0)
            try:
                conn.execute("PRAGMA busy_timeout=30000")
                conn.execute("PRAGMA synchronous=FULL")  # a returned commit survives a crash
            except sqlite3.DatabaseError as exc:
                conn.close()
                raise NotFoundError(f"{self.path} is not an heedrank document store ({exc})") from exc
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
    def _ensure_schema(self, conn: sqlite3.Connection) -> None:
        if not getattr(self, "_schema_ok", False):
            conn.executescript(_SCHEMA)
            self._schema_ok = True

    def _next_vid(self, conn: sqlite3.Connection) -> int:
        row = conn.execute("SELECT value FROM state WHERE key = 'next_vid'").fetchone()
        top = conn.execute("SELECT COALESCE(MAX(vid) + 1, 0) FROM docs").fetchone()[0]
        return max(int(row[0]) if row else 0, int(top))

    def add_many(self, docs: Iterable[Document]) -> int:
        """Append new documents (bulk build); each gets the next ``vid``.

        Args:
            docs: Documents with ids not yet in the store.

        Returns:
            Number of documents added.

        Raises:
            ValidationError: a doc id already in the store (or repeated in ``docs``), or
                metadata that is not valid JSON; the whole call is rolled back.
        """
        conn = self._conn()
        with self._write_lock:
            self._ensure_schema(conn)
            start = self._next_vid(conn)
            batch = list(docs)
            rows = [(d.doc_id, start + i, d.title, d.text, metadata_json(d)) for i, d in enumerate(batch)]
            try:
                with conn:
                    cur = conn.executemany(
                        "INSERT INTO docs (doc_id, vid, title, text, metadata) VALUES (?, ?, ?, ?, ?)", rows
                    )
                    conn.execute(
                        "INSERT INTO state (key, value) VALUES ('next_vid', ?) "
                        "ON CONFLICT(key) DO UPDATE SET value = excluded.value", (start + len(rows),)
                    )
            except sqlite3.IntegrityError as exc:
                raise ValidationError(f"duplicate document id while adding to {self.path}: {exc}") from exc
            return max(cur.rowcount, 0)

    def upsert(
        self, docs: Sequence[Document], vectors: Sequence[np.ndarray | None] | None = None
    ) -> list[tuple[str, int, int | None]]:
        """Add or replace documents in one durable transaction.

        Every document gets a new ``vid`` (``next_vid``, ``next_vid + 1``, ...); a
        replaced document's old vid is gone from ``docs``. ``vectors[i]`` (float32
        ``(p, d)``, or ``None``) is stored with document ``i`` so that a vector file
        written before this call can be caught up on open.

        Returns:
            ``(doc_id, new_vid, old_vid or None)`` per document, in order.

        Raises:
            ValidationError: a repeated or empty doc id in ``docs``, invalid metadata;
                nothing is written then.
        """
        docs = list(docs)
        _check_unique(docs)
        if vectors is not None and len(vectors) != len(docs):
            raise ValidationError(f"got {len(docs)} documents but {len(vectors)} vector arrays")
        metas = [metadata_json(d) for d in docs]
        conn = self._conn()
        out: list[tuple[str, int, int | None]] = []
        with self._write_lock:
            self._ensure_schema(conn)
            with conn:
                start = self._next_vid(conn)
                old = self._vids_in(conn, [d.doc_id for d in docs])
                for i, (d, meta) in enumerate(zip(docs, metas)):
                    vid = start + i
                    conn.execute(
                        "INSERT INTO docs (doc_id, vid, title, text, metadata) VALUES (?, ?, ?, ?, ?) "
                        "ON CONFLICT(doc_id) DO UPDATE SET vid = excluded.vid, title = excluded.title, "
                        "text = excluded.text, metadata = excluded.metadata",
                        (d.doc_id, vid, d.title, d.text, meta),
                    )
                    prev = old.get(d.doc_id)
                    if prev is not None:
                        conn.execute("DELETE FROM vectors WHERE vid = ?", (prev,))
                    vec = None if vectors is None else vectors[i]
                    if vec is not None:
                        arr = np.ascontiguousarray(vec, dtype=np.float32)
                        arr = arr.reshape(-1, arr.shape[-1])
                        conn.execute("INSERT INTO vectors (vid, dim, vec) VALUES (?, ?, ?)",
                                     (vid, arr.shape[1], arr.tobytes()))
                    out.append((d.doc_id, vid, prev))
                conn.execute(
                    "INSERT INTO state (key, value) VALUES ('next_vid', ?) "
                    "ON CONFLICT(key) DO UPDATE SET value = excluded.value", (start + len(docs),)
                )
        return out

    def delete(self, doc_ids: Sequence[str]) -> list[tuple[str, int]]:
        """Delete documents in one durable transaction; unknown ids are ignored.

        Returns:
            ``(doc_id, vid)`` of each deleted document.
        """
        wanted = list(dict.fromkeys(doc_ids))
        conn = self._conn()
        with self._write_lock:
            self._ensure_schema(conn)
            with conn:
                found = self._vids_in(conn, wanted)
                _in_chunks(conn, "DELETE FROM docs WHERE doc_id IN ({marks})", wanted)
                _in_chunks(conn, "DELETE FROM vectors WHERE vid IN ({marks})", list(found.values()))
        return [(d, found[d]) for d in wanted if d in found]

    def _vids_in(self, conn: sqlite3.Connection, doc_ids: Sequence[str]) -> dict[str, int]:
        return dict(_in_chunks(conn, "SELECT doc_id, vid FROM docs WHERE doc_id IN ({marks})", list(doc_ids)))

    # -- vectors of recent additions ---------------------------------------------------
    def pending_vectors(self, vids: Sequence[int] | np.ndarray) -> dict[int, np.ndarray]:
        """Stored float32 ``(p, d)`` vectors of ``vids`` that have them (see :meth:`upsert`)."""
        conn = self._conn()
        out: dict[int, np.ndarray] = {}
        wanted = [int(v) for v in vids]
        try:
            for vid, dim, blob in _in_chunks(conn, "SELECT vid, dim, vec FROM vectors WHERE vid IN ({marks})", wanted):
                out[int(vid)] = np.frombuffer(blob, dtype=np.float32).reshape(-1, int(dim))
        except sqlite3.OperationalError:  # a format-1 store has no vectors table
            return {}
        return out

    def discard_vectors(self, max_vid: int) -> int:
        """Forget stored vectors of vids ``<= max_vid`` (now in the vector file). Returns the count."""
        conn = self._conn()
        with self._write_lock:
            try:
                with conn:
                    return conn.execute("DELETE FROM vectors WHERE vid <= ?", (int(max_vid),)).rowcount
            except sqlite3.OperationalError:
                return 0

    @property
    def next_vid(self) -> int:
        """The vid the next added document version gets."""
        conn = self._conn()
        try:
            return self._next_vid(conn)
        except sqlite3.OperationalError:  # format 1: no state table
            return int(conn.execute("SELECT COALESCE(MAX(vid) + 1, 0) FROM docs").fetchone()[0])

    # -- reading -----------------------------------------------------------------------
    def get_many(self, doc_ids: Sequence[str]) -> dict[str, Document]:
        """The documents that exist among ``doc_ids``, in request order (missing ids absent)."""
        wanted = list(dict.fromkeys(doc_ids))
        found = {
            row[0]: _row_to_doc(row)
            for row in _in_chunks(self._conn(), "SELECT doc_id, title, text, metadata FROM docs WHERE doc_id IN ({marks})", wanted)
        }
        return {d: found[d] for d in wanted if d in found}

    def get(self, doc_id: str) -> Document:
        """One document. Raises NotFoundError if absent."""
        doc = self.get_many([doc_id]).get(doc_id)
        if doc is None:
            raise NotFoundError(f"document {doc_id!r} not found")
        return doc

    def vids_of(self, doc_ids: Sequence[str]) -> dict[str, int]:
        """``{doc_id: vid}`` for the ids that exist."""
        return self._vids_in(self._conn(), list(dict.fromkeys(doc_ids)))

    def filter_vids(self, flt: Any = None) -> np.ndarray:
        """Sorted int64 vids of the documents matching a metadata filter.

        Args:
            flt: Parsed :class:`heedrank.index.filters.BoolFilter` (used as it is), JSON
                filter (mapping; parsed here), or ``None`` (every document).

        Raises:
            FilterError: an invalid JSON filter (message names the offending clause).
        """
        from heedrank.index.filters import as_filter, compile_sql

        sql, params = compile_sql(as_filter(flt))
        rows = self._conn().execute(f"SELECT vid FROM docs WHERE {sql} ORDER BY vid", params).fetchall()
        return np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows))

    def vid_doc_pairs(self) -> tuple[np.ndarray, list[str]]:
        """``(vids int64 (n,), doc_ids)`` of every document, ordered by vid."""
        rows = self._conn().execute("SELECT vid, doc_id FROM docs ORDER BY vid").fetchall()
        return np.fromiter((r[0] for r in rows), dtype=np.int64, count=len(rows)), [r[1] for r in rows]

    def get_by_vids(self, vids: Sequence[int] | np.ndarray) -> list[tuple[int, Document]]:
        """``(vid, Document)`` of the vids that exist, in vid order."""
        wanted = sorted({int(v) for v in vids})
        rows = _in_chunks(self._conn(), "SELECT vid, doc_id, title, text, metadata FROM docs WHERE vid IN ({marks})", wanted)
        return sorted(((int(row[0]), _row_to_doc(row[1:])) for row in rows), key=lambda x: x[0])

    def doc_ids(self) -> list[str]:
        """Every doc id ordered by ``vid`` (for a store never updated, ``doc_ids()[vid]``
        is the id of row ``vid``)."""
        rows = self._conn().execute("SELECT doc_id FROM docs ORDER BY vid").fetchall()
        return [r[0] for r in rows]

    def iter_documents(self, batch_size: int = 1000) -> Iterator[Document]:
        """All documents in ``vid`` order, read ``batch_size`` rows at a time."""
        for _, doc in self.iter_with_vids(batch_size):
            yield doc

    def iter_with_vids(self, batch_size: int = 1000) -> Iterator[tuple[int, Document]]:
        """``(vid, Document)`` of all documents in ``vid`` order, ``batch_size`` rows at a time."""
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
                yield int(row[0]), _row_to_doc(row[1:])
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

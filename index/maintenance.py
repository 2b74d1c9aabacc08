"""Maintenance of an :class:`heedrank.index.store.Index`: keeping its derived parts (the BM25
matrix with its delta, the vector index) in line with its document store, the source of
truth, and writing them.

* :func:`reconcile` is the one recovery path. Given the live vids, it masks the BM25 rows
  and deletes the vectors of documents that are no longer live, and adds the live
  documents missing from either (BM25: to the delta, from the store's text; vectors: from
  a given source). It serves both
* :func:`catch_up`, at open (after a crash, or after updates since the files were last
  written; missing vectors come from the copies the store kept, else are re-encoded), and
* :func:`compact`, which rebuilds BM25 (and an HNSW graph holding tombstones) without the
  lock, writes them, then under the write lock reconciles the rebuilt parts with what
  changed meanwhile (missing vectors copied from the serving index) and swaps them in.
* :func:`flush` writes the vector file when it lags behind memory, then lets the store
  forget the vector copies the file now holds.
* :func:`write_parts` / :func:`recover_swapped_dir`: a rebuilt BM25 folder is swapped in
  by two renames; a crash between them is finished or undone on the next open.

These functions are the Index's own: they take its locks and set its fields. Callers use
the Index's methods (:meth:`~heedrank.index.store.Index.compact`,
:meth:`~heedrank.index.store.Index.flush`, ...), which delegate here.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from heedrank.errors import ValidationError
from heedrank.files import write_atomic
from heedrank.protocols import WritableDocStore

if TYPE_CHECKING:
    from heedrank.index.store import Index

logger = logging.getLogger(__name__)

BATCH = 2000
"""Documents read from the store per query while catching up or compacting."""

VectorSource = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]
"""Vectors of documents by vid: ``source(vids) -> (labels int64 (m,), vectors float32 (m, dim))``
in label order (``vid << bits | passage``; see :mod:`heedrank.index.passages`)."""


@dataclass(frozen=True)
class Reconciled:
    """What :func:`reconcile` changed.

    Attributes:
        bm25_deleted: BM25 rows masked and delta documents dropped (documents not live).
        bm25_added: Live documents added to the BM25 delta.
        vectors_deleted: Vectors deleted (flat, IVF) or tombstoned (HNSW).
        vectors_added: Vectors added (one per passage with chunking).
        dense: The vector index afterwards (a rebuilt one when the missing labels did not
            come after the stored ones), or ``None`` without vectors.
    """

    bm25_deleted: int = 0
    bm25_added: int = 0
    vectors_deleted: int = 0
    vectors_added: int = 0
    dense: Any = None

    @property
    def changes(self) -> int:
        """Everything deleted and added."""
        return self.bm25_deleted + self.bm25_added + self.vectors_deleted + self.vectors_added

    def vectors_changed_file(self) -> bool:
        """Whether the vector file no longer matches the vector index (HNSW tombstones are
        not saved, they are re-derived from the store on every open)."""
        if self.dense is None:
            return False
        return bool(self.vectors_added or (self.vectors_deleted and self.dense.kind != "hnsw"))


def reconcile(
    bm25: Any,
    dense: Any,
    live: np.ndarray,
    docstore: WritableDocStore,
    vectors: VectorSource | None,
    *,
    group_bits: int,
) -> Reconciled:
    """Bring a BM25 index and a vector index in line with the live documents.

    BM25 rows (and delta documents) of vids not in ``live`` are masked; live vids in
    neither the matrix nor the delta are added to the delta with their text from
    ``docstore``. Vectors whose vid is not live are deleted; live vids without vectors get
    theirs from ``vectors`` and are added (when their labels do not all come after the
    stored ones, the vector index is rebuilt from the kept and the new vectors).

    Modifies ``bm25`` and ``dense`` in place (callers pass parts no search reads, or hold
    the index's write lock).

    Args:
        bm25: :class:`heedrank.index.bm25.BM25Index`.
        dense: :class:`heedrank.index.dense.DenseIndex`, or ``None``.
        live: int64 vids of the live documents.
        docstore: The store the texts of documents missing from BM25 are read from.
        vectors: Source of missing vectors (``None``: none are added).
        group_bits: Label bits of the passage number.

    Returns:
        The counts, and the vector index to use from now on.
    """
    live = np.asarray(live, dtype=np.int64)
    in_delta = np.fromiter(bm25.delta.docs, dtype=np.int64, count=len(bm25.delta.docs))
    have = np.concatenate([np.asarray(bm25.row_vids, dtype=np.int64), in_delta])
    dead = have[~np.isin(have, live)]
    bm25_deleted = bm25.mark_deleted(dead) if len(dead) else 0
    fresh = live[~np.isin(live, have)]
    bm25_added = 0
    for start in range(0, len(fresh), BATCH):
        docs = docstore.get_by_vids(fresh[start : start + BATCH])
        bm25.add_documents([v for v, _ in docs], [d.content for _, d in docs])
        bm25_added += len(docs)
    if dense is None:
        return Reconciled(bm25_deleted, bm25_added)

    labels = np.asarray(dense.labels()).copy()
    vids = labels >> group_bits
    gone = labels[~np.isin(vids, live)]
    vectors_deleted = dense.delete(gone) if len(gone) else 0
    missing = live[~np.isin(live, vids)]
    vectors_added = 0
    if len(missing) and vectors is not None:
        new_labels, new_vecs = vectors(missing)
        if len(new_labels):
            if len(labels) and new_labels[0] <= labels[-1]:
                # out of order (should not happen): rebuild the vector index from scratch
                from heedrank.index.dense import DenseIndex

                keep = labels[np.isin(vids, live)]
                all_labels = np.concatenate([keep, new_labels])
                order = np.argsort(all_labels)
                stacked = np.concatenate([dense.vectors(keep), new_vecs])[order]
                dense = DenseIndex.build(stacked, all_labels[order], dense.params, dim=dense.dim)
            else:
                dense.add(new_vecs, new_labels)
            vectors_added = len(new_labels)
    return Reconciled(bm25_deleted, bm25_added, vectors_deleted, vectors_added, dense)


# --------------------------------------------------------------------------- start-up
def stored_vectors(index: Index) -> VectorSource:
    """The vectors of documents as the store has them: the copies kept with recent
    additions, else encoded from the stored text (logged: it needs the encoder)."""

    def source(vids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        stored = index.docstore.pending_vectors(vids)
        need = [int(v) for v in vids if int(v) not in stored]
        if need:
            logger.warning("re-encoding %d documents whose vectors were not stored", len(need))
            docs = index.docstore.get_by_vids(need)
            for (vid, _), vec in zip(docs, index.encode_documents([d for _, d in docs])):
                stored[vid] = vec
        return index.label_rows(vids, [stored[int(v)] for v in vids])

    return source


def catch_up(index: Index) -> Reconciled:
    """Bring an opened index's BM25 and vectors in line with its document store (after a
    crash, or updates since the files were last written). Called by
    :meth:`~heedrank.index.store.Index.open` before the index serves."""
    live, ids = index.docstore.vid_doc_pairs()
    index.set_doc_ids(live, ids)
    done = reconcile(index.bm25, index.dense, live, index.docstore, stored_vectors(index), group_bits=index.group_bits)
    index.dense = done.dense
    if done.vectors_changed_file():
        index.vectors_dirty = True
    if done.changes:
        logger.info(
            "index %s caught up with its document store: BM25 %d deleted / %d added, vectors %d deleted / %d added",
            index.path, done.bm25_deleted, done.bm25_added, done.vectors_deleted, done.vectors_added,
        )
    return done


# --------------------------------------------------------------------------- state
def counts(index: Index) -> dict[str, Any]:
    """BM25 delta, masked BM25 rows and tombstones (the caller holds a lock)."""
    out = {
        "bm25_delta": len(index.bm25.delta),
        "bm25_deleted_rows": index.bm25.num_docs - (index.bm25.num_live - len(index.bm25.delta)),
    }
    if index.dense is not None:
        out["tombstones"] = len(index.dense.tombstones)
    return out


def stats(index: Index) -> dict[str, Any]:
    """See :meth:`heedrank.index.store.Index.stats`."""
    with index.rw.read():
        out: dict[str, Any] = {"num_docs": len(index.docstore), "bm25_rows": index.bm25.num_docs, **counts(index)}
        if index.dense is not None:
            out.update(vectors=len(index.dense), index_type=index.dense.kind,
                       vectors_unsaved=index.vectors_dirty and index.path is not None)
    return out


def needs_compaction(index: Index, fraction: float = 0.1) -> bool:
    """See :meth:`heedrank.index.store.Index.needs_compaction`."""
    s = stats(index)
    limit = max(1, int(fraction * max(1, s["num_docs"])))
    return (s["bm25_delta"] > limit or s["bm25_deleted_rows"] > limit
            or s.get("tombstones", 0) > limit * index.max_group)


# --------------------------------------------------------------------------- writing
def flush(index: Index) -> bool:
    """See :meth:`heedrank.index.store.Index.flush`."""
    if index.path is None or index.dense is None or not index.writable:
        return False
    from heedrank.index.dense import VECTORS_FILE

    with index.maintenance_lock:
        with index.rw.read():
            if not index.vectors_dirty:
                return False
            labels = index.dense.labels()
            top = int(labels[-1]) >> index.group_bits if len(labels) else -1
            index.dense.save(index.path / VECTORS_FILE)
            index.vectors_dirty = False
        index.docstore.discard_vectors(top)
    return True


def copied_from(dense: Any, group_bits: int) -> VectorSource:
    """The vectors of documents as a vector index holds them (all their passages)."""

    def source(vids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        labels = np.asarray(dense.labels()).copy()
        wanted = labels[np.isin(labels >> group_bits, vids)]
        return wanted, dense.vectors(wanted)

    return source


def compact(index: Index) -> dict[str, Any]:
    """See :meth:`heedrank.index.store.Index.compact`."""
    from dataclasses import replace

    from heedrank.index.bm25 import ANALYZER_VERSION, BM25Builder

    index.check_writable()
    t0 = time.perf_counter()
    with index.maintenance_lock:
        with index.rw.read():
            snapshot = index.live_vids()
            before = counts(index)
        # the current analyzer: compacting upgrades an index built with an older one
        builder = BM25Builder(replace(index.bm25.params, analyzer_version=ANALYZER_VERSION))
        rows: list[int] = []
        for start in range(0, len(snapshot), BATCH):
            got = index.docstore.get_by_vids(snapshot[start : start + BATCH])
            builder.add([d.content for _, d in got])
            rows.extend(v for v, _ in got)
        if not rows:
            raise ValidationError("cannot compact an index without documents")
        bm25 = builder.build(row_vids=np.asarray(rows, dtype=np.int64))
        dense = index.dense
        if dense is not None and dense.kind == "hnsw" and dense.tombstones:
            dense = dense.rebuilt()
        if index.path is not None:
            write_parts(index.path, bm25, dense if dense is not index.dense else None)
        with index.rw.write():
            live = index.live_vids()
            serving = index.dense
            source = copied_from(serving, index.group_bits) if serving is not None else None
            done = reconcile(bm25, dense, live, index.docstore, source, group_bits=index.group_bits)
            index.bm25 = bm25
            index.dense = done.dense
            if done.vectors_changed_file():
                index.vectors_dirty = True
            index.clear_filter_cache()
            index.params["num_docs"] = len(live)
            index.params["bm25"] = bm25.describe()
            index.params["compacted"] = datetime.now(UTC).isoformat(timespec="seconds")
        if index.path is not None:
            write_json(index.path / "params.json", index.params)
    summary = {
        "num_docs": len(live),
        "bm25_rows": bm25.num_docs,
        "bm25_delta_folded": before["bm25_delta"],
        "bm25_rows_dropped": before["bm25_deleted_rows"],
        "tombstones_dropped": before.get("tombstones", 0),
        "replayed": int(done.changes),
        "seconds": round(time.perf_counter() - t0, 3),
    }
    if index.path is not None:
        flush(index)
    logger.info("compacted index %s: %s", index.path or "in-memory", summary)
    return summary


def compact_async(index: Index) -> Future:
    """See :meth:`heedrank.index.store.Index.compact_async`."""
    future: Future = Future()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(index.compact())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
            future.set_exception(exc)

    threading.Thread(target=run, name="heedrank-compact", daemon=True).start()
    return future


def write_parts(root: Path, bm25: Any, dense: Any) -> None:
    """Write a rebuilt BM25 folder (swapped in by two renames, see
    :func:`recover_swapped_dir`) and, when given, the vector file (atomic)."""
    from heedrank.index.builder import BM25_DIR
    from heedrank.index.dense import VECTORS_FILE

    new = root / f".{BM25_DIR}.new"
    old = root / f".{BM25_DIR}.old"
    shutil.rmtree(new, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)
    bm25.save(new)
    os.rename(root / BM25_DIR, old)
    os.rename(new, root / BM25_DIR)
    shutil.rmtree(old, ignore_errors=True)
    if dense is not None:
        dense.save(root / VECTORS_FILE)


def recover_swapped_dir(root: Path, name: str) -> None:
    """Finish or undo a folder swap interrupted by a crash (see :func:`write_parts`)."""
    target, new, old = root / name, root / f".{name}.new", root / f".{name}.old"
    if target.exists():
        return
    if new.is_dir() and (new / "vids.npy").is_file():
        os.rename(new, target)
    elif old.is_dir():
        os.rename(old, target)


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Replace a JSON file (indent 2, a final newline) atomically and durably
    (:func:`heedrank.files.write_atomic`: fsynced, renamed, directory fsynced).

    Raises:
        OSError: the file could not be written (``path`` is unchanged).
    """
    write_atomic(path, (json.dumps(data, indent=2) + "\n").encode())

"""Build an index directory from a BEIR corpus (``heedrank index build``).

Layout of the directory (written to a temporary sibling and renamed into place at the
end, so a failed build never leaves a half-written index behind)::

    docs.sqlite     documents (SQLiteDocStore); vid = corpus position at build time
    bm25/           bm25s arrays + vocabulary + analyzer.json + stats.json + vids.npy
    vectors.faiss   flat / HNSW / IVF faiss index, labels = vid      (absent with dense=False)
                    (or vid << bits | passage with passage chunking)
    params.json     how it was built (see build_index)

Format 2 (this version) adds ``bm25/stats.json`` and ``bm25/vids.npy``, the store's
``state`` and ``vectors`` tables, the HNSW and IVF index types and passage chunking; it
supports updates (:class:`heedrank.index.store.Index`). Format-1 directories are read-only.

The corpus is streamed in batches (Arrow memory map -> documents -> SQLite, BM25 tokens,
embeddings), so only the BM25 token lists and the vectors grow with the corpus.

Resumable: the dense encoding (nearly all of a build's time on CPU) is checkpointed per chunk of
documents into a hidden folder beside ``out`` (:class:`VectorCheckpoint`, named by a fingerprint
of the corpus file, the encoder and the passage split). A build killed at any point (``kill -9``,
Ctrl-C) and run again with the same arguments reads the chunks already encoded and encodes only
the rest; the document store and BM25 are rebuilt (seconds per 100k documents). The folder is
removed when the build succeeds or fails on its input.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import logging
import platform
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from heedrank.data import find_beir_corpus, iter_beir_documents, load_beir_corpus
from heedrank.errors import NotFoundError, ValidationError
from heedrank.files import file_sha256
from heedrank.progress import Progress, library_bars
from heedrank.textrules import json_problem
from heedrank.types import Document

logger = logging.getLogger(__name__)

FORMAT_VERSION = 2
"""Version of the index directory layout written here."""
READABLE_VERSIONS = (1, 2)
"""Versions :class:`heedrank.index.store.Index` opens (format 1: read-only)."""
PARAMS_FILE = "params.json"
DOCS_FILE = "docs.sqlite"
BM25_DIR = "bm25"
_READ_BATCH = 1000




def library_versions() -> dict[str, str | None]:
    """Installed versions of the libraries an index depends on (``None`` = not installed)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for dist in ("heedrank", "bm25s", "PyStemmer", "faiss-cpu", "faiss-gpu", "sentence-transformers",
                 "transformers", "torch", "datasets", "numpy"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = None
    if out.get("faiss-gpu") is None:
        out.pop("faiss-gpu")
    return out


def load_metadata_file(path: Path) -> dict[str, dict[str, Any]]:
    """``{doc_id: fields}`` from a JSONL of ``{"doc_id": ..., ...fields}`` lines.

    Later lines for the same doc id update earlier ones.

    Raises:
        NotFoundError: missing file.
        ValidationError: a line that is not a JSON object with a ``doc_id``, or with a
            string that is not valid Unicode (an unpaired surrogate).
    """
    if not path.is_file():
        raise NotFoundError(f"metadata file not found: {path}")
    out: dict[str, dict[str, Any]] = {}
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise ValidationError(f"{path}:{lineno}: not valid UTF-8 ({exc.reason}); save the file as UTF-8") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValidationError(f"{path}:{lineno}: not JSON ({exc})") from None
            if not isinstance(row, dict) or "doc_id" not in row:
                raise ValidationError(f"{path}:{lineno}: expected an object with a 'doc_id' field")
            if found := json_problem(row):  # the text rule of heedrank.textrules, as for the corpus
                where, problem = found
                raise ValidationError(f"{path}:{lineno}: metadata{' field ' + where if where else ''} {problem}")
            doc_id = str(row.pop("doc_id"))
            out.setdefault(doc_id, {}).update(row)
    return out


def _batched(items: Iterable[Document], size: int) -> Iterator[list[Document]]:
    it = iter(items)
    while batch := list(islice(it, size)):
        yield batch


class VectorCheckpoint:
    """The dense vectors of a build's finished chunks, one ``.npz`` per chunk (``vectors`` float32
    ``(p, dim)``, ``labels`` int64 ``(p,)``), each written to a temporary name and renamed, so a
    chunk file is whole or absent.

    Args:
        folder: ``.<index name>.vectors-<fingerprint>`` beside the index directory.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)

    @classmethod
    def for_build(cls, out: Path, corpus_sha256: str, encoder: Any, passages: Any, chunk: int) -> VectorCheckpoint:
        """The checkpoint of building ``out`` from the corpus file of ``corpus_sha256`` with ``encoder`` (its
        ``describe()``), ``passages`` and ``chunk`` documents per chunk: the same arguments
        name the same folder."""
        key = json.dumps({"corpus": corpus_sha256, "encoder": encoder.describe(),
                          "passages": passages.to_dict() if passages is not None else None, "chunk": chunk},
                         sort_keys=True, default=str)
        digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:16]
        return cls(out.parent / f".{out.name}.vectors-{digest}")

    def _path(self, k: int) -> Path:
        return self.folder / f"{k:07d}.npz"

    def done(self) -> int:
        """Chunks already encoded."""
        return sum(1 for _ in self.folder.glob("*.npz"))

    def load(self, k: int) -> tuple[np.ndarray, np.ndarray] | None:
        """Chunk ``k``'s ``(vectors, labels)``, or ``None`` when it was not finished."""
        path = self._path(k)
        if not path.is_file():
            return None
        with np.load(path) as z:
            return z["vectors"], z["labels"]

    def save(self, k: int, vectors: np.ndarray, labels: np.ndarray) -> None:
        part = self.folder / f"{k:07d}.partial.npz"
        with open(part, "wb") as f:
            np.savez(f, vectors=vectors, labels=labels)
            f.flush()
            os.fsync(f.fileno())
        os.replace(part, self._path(k))

    def parts(self, chunks: int, rows: int = 65_536) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """``(vectors, labels)`` of chunks ``0 .. chunks - 1`` in order, consecutive chunks joined
        into parts of about ``rows`` vectors (fewer, larger adds to faiss).

        Raises:
            NotFoundError: a chunk is missing (the folder was changed during the build).
        """
        vecs: list[np.ndarray] = []
        labels: list[np.ndarray] = []
        held = 0
        for k in range(chunks):
            got = self.load(k)
            if got is None:
                raise NotFoundError(f"chunk {k} of the build's vectors is missing from {self.folder}: build again")
            vecs.append(got[0])
            labels.append(got[1])
            held += len(got[1])
            if held >= rows or k == chunks - 1:
                yield np.concatenate(vecs), np.concatenate(labels)
                vecs, labels, held = [], [], 0

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def missing(self, chunks: int) -> list[int]:
        """The chunk numbers below ``chunks`` not encoded yet, in order."""
        return [k for k in range(chunks) if not self._path(k).is_file()]


def encoder_identity(encoder: Any) -> dict[str, Any]:
    """What must be equal for two encoders to give the same vectors: ``describe()`` without
    the local ``path`` (another machine installs the model elsewhere)."""
    return {k: v for k, v in encoder.describe().items() if k != "path"}


@dataclass(frozen=True)
class VectorJob:
    """The dense chunks of a build left to encode, as an engine reads them
    (:meth:`heedrank.engine.Engine.encode_vectors`; the Ray engine encodes them on an actor
    pool, each actor writing its chunks into the build's :class:`VectorCheckpoint`, which the
    build then reads back as on a resume).

    Attributes:
        corpus_file: The BEIR corpus file.
        chunk: Documents per chunk (chunk ``k`` holds documents ``k * chunk`` to ``(k + 1) * chunk - 1``).
        todo: Chunk numbers not encoded yet.
        folder: The checkpoint folder (it must be on a filesystem every worker sees at the same path).
        make_encoder: Builds the encoder in a worker (shipped by value: a module-level
            function or a :func:`functools.partial` of one, or a picklable encoder's factory).
        identity: The driver encoder's :func:`encoder_identity`; a worker's must equal it.
        passages: :class:`heedrank.index.passages.PassageParams` or ``None``.
        bits: Passage bits of the vector labels (:func:`heedrank.index.passages.labels_for`).
    """

    corpus_file: Path
    chunk: int
    todo: tuple[int, ...]
    folder: Path
    make_encoder: Callable[[], Any]
    identity: Mapping[str, Any]
    passages: Any = None
    bits: int = 0

    def chunks(self) -> Iterator[tuple[int, list[Document]]]:
        """``(k, documents)`` of every chunk in :attr:`todo`, read from the corpus in one pass."""
        wanted = set(self.todo)
        for k, batch in enumerate(_batched(iter_beir_documents(self.corpus_file, batch_size=_READ_BATCH), self.chunk)):
            if k in wanted:
                yield k, batch

    def encode(self, encoder: Any, k: int, docs: Sequence[Document]) -> int:
        """Encode chunk ``k`` (its ``docs``) with ``encoder`` and save it in the checkpoint;
        returns the vectors written (more than documents with passages)."""
        from heedrank.index.passages import encode_documents, labels_for

        vecs = encode_documents(encoder, docs, self.passages)
        start = k * self.chunk
        labels = np.concatenate([labels_for(start + i, len(v), self.bits) for i, v in enumerate(vecs)])
        VectorCheckpoint(self.folder).save(k, np.concatenate(vecs), labels)
        return int(len(labels))


def _given_encoder(encoder: Any) -> Any:
    """A worker's copy of an encoder object passed to :func:`build_index` (shipped by value)."""
    return encoder


def _check_target(out: Path, overwrite: bool) -> None:
    if out.exists() and not out.is_dir():
        raise ValidationError(f"index path {out} exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ValidationError(f"index directory {out} exists and is not empty; pass overwrite=True (--overwrite)")


def build_index(
    corpus: str | Path,
    out: str | Path,
    *,
    embedder: str | None = None,
    metadata: str | Path | None = None,
    dense: bool = True,
    batch_size: int = 64,
    overwrite: bool = False,
    show_progress: bool = True,
    dense_params: Any = None,
    passages: Any = None,
    query_prefix: str | None = None,
    document_prefix: str | None = None,
    bm25_params: Any = None,
    planner: Any = None,
    encoder: Any = None,
    embedder_runtime: str = "auto",
    engine: Any = None,
) -> dict[str, Any]:
    """Build an index directory over a BEIR corpus.

    Every document is indexed as :attr:`Document.content` (``title + " " + text``) for
    both BM25 and dense vectors.

    Args:
        corpus: BEIR-layout folder or ``corpus.jsonl[.gz]`` file.
        out: Index directory to write.
        embedder: sentence-transformers model directory; ``None`` = packaged
            all-MiniLM-L6-v2. Ignored when ``dense`` is false.
        metadata: JSONL of ``{"doc_id": ..., ...fields}`` merged into each document's
            metadata (file fields win over corpus fields).
        dense: Also encode documents into ``vectors.faiss``.
        batch_size: Encoder batch size (texts per forward pass).
        overwrite: Replace an existing non-empty ``out``.
        show_progress: tqdm bar over documents; log lines every ~10% instead when stderr is not a TTY.
            ``False`` also keeps the bars of ``datasets`` and ``transformers`` off while the
            corpus and the embedder load (:func:`heedrank.progress.library_bars`).
        dense_params: :class:`heedrank.index.dense.DenseParams` (index type flat / hnsw / ivf and
            its parameters); default: ``auto`` (flat up to 100,000 vectors, else IVF:
            :meth:`heedrank.index.dense.DenseParams.for_size`).
        passages: :class:`heedrank.index.passages.PassageParams` to encode long documents as
            passages scored by their maximum (MaxP); default: one vector per document
            (the encoder truncates).
        query_prefix: Prepended to queries; ``None`` = the model's known instruction
            (:func:`heedrank.index.encoder.default_prefixes`), empty for MiniLM.
        document_prefix: Prepended to documents; ``None`` as for ``query_prefix``.
        bm25_params: :class:`heedrank.index.bm25.BM25Params` (default: Lucene, k1 0.9, b 0.4).
        planner: :class:`heedrank.index.planner.PlannerParams` of filtered vector search.
        encoder: An :class:`heedrank.protocols.Encoder` to use instead of loading
            ``embedder`` (e.g. :class:`heedrank.index.hashing.HashingEncoder` in tests); open the
            index with the same encoder (``Index.open(path, encoder=...)``).
        embedder_runtime: ``"auto"`` (ONNX Runtime for a BERT-family embedder when
            ``onnxruntime`` is installed, else PyTorch), ``"torch"``, ``"onnx"``
            (:mod:`heedrank.index.onnx_runtime`: the same vectors, faster) or ``"bf16"``
            (bfloat16 autocast where the CPU has AMX: about 3x faster, cosine 1.0000); recorded in
            ``dense.embedder.runtime``, and queries are encoded with it.
        engine: A :class:`heedrank.engine.Engine` that encodes the dense chunks before the
            build reads the corpus (:class:`VectorJob`; the Ray engine on an actor pool, each
            actor loading the embedder once); ``None`` or the local engine: encoded here as the
            build reads. The vectors and the index are the same either way.

    Returns:
        The content of ``params.json``: ``format_version``, ``created`` (UTC ISO 8601),
        ``build_seconds``, ``corpus`` (path, file, sha256), ``metadata_file``,
        ``num_docs``, ``bm25`` (k1, b, method, tokenisation, vocabulary size), ``dense``
        (``None`` or index type and ``params``, dimension, metric, ``embedder`` = encoder
        describe() incl. weights sha256 and prefixes, ``passages``, ``planner``),
        ``versions`` (library versions), ``build_stages`` (seconds in ``read``, ``docstore``,
        ``bm25``, ``encode`` (reading finished chunks back on a resumed build), ``faiss``).

    Raises:
        ValidationError: ``out`` exists and is non-empty without ``overwrite``; empty
            corpus; duplicate doc ids; malformed metadata file.
        NotFoundError: corpus or metadata file missing.
        ModelLoadError: the embedder cannot be found or loaded.
    """
    from heedrank.index.bm25 import BM25Builder, BM25Params
    from heedrank.index.dense import VECTORS_FILE, DenseIndex, DenseParams
    from heedrank.index.docstore import SQLiteDocStore
    from heedrank.index.passages import encode_documents, labels_for
    from heedrank.index.planner import PlannerParams

    dense_params = dense_params or DenseParams(index_type="auto")  # flat up to FLAT_MAX vectors, else IVF
    planner = planner or PlannerParams()

    t0 = time.perf_counter()
    out = Path(out).expanduser().absolute()
    corpus = Path(corpus).expanduser().absolute()
    _check_target(out, overwrite)
    corpus_file = find_beir_corpus(corpus)
    extra = load_metadata_file(Path(metadata)) if metadata is not None else {}

    given_encoder = encoder
    if not dense:
        encoder = None
    elif encoder is None:
        encoder = _load_encoder(embedder, batch_size, query_prefix, document_prefix, embedder_runtime)

    with library_bars("datasets", show=show_progress):  # its "Generating train split" bar (the Arrow copy)
        total = len(load_beir_corpus(corpus_file))
    if total == 0:
        raise ValidationError(f"corpus {corpus_file} has no documents")
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_dead_builds(out)
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    (tmp / _OWNER_FILE).write_text(str(os.getpid()))
    chunk = max(_READ_BATCH, batch_size * 8)
    corpus_sha = file_sha256(corpus_file)  # once: the checkpoint's name and params.json
    with library_bars(show=show_progress):  # describe() loads the embedder (its weights bar)
        checkpoint = VectorCheckpoint.for_build(out, corpus_sha, encoder, passages, chunk) if encoder is not None else None
    if checkpoint is not None and checkpoint.done():
        logger.info("resuming: the vectors of %d chunks of %d documents are already encoded (%s)", checkpoint.done(),
                    chunk, checkpoint.folder)
    if engine is not None and not engine.in_process and checkpoint is not None:
        factory = (functools.partial(_load_encoder, embedder, batch_size, query_prefix, document_prefix,
                                     embedder_runtime) if given_encoder is None else functools.partial(_given_encoder, encoder))
        job = VectorJob(corpus_file, chunk, tuple(checkpoint.missing(-(-total // chunk))), checkpoint.folder, factory,
                        encoder_identity(encoder), passages, passages.bits if passages is not None else 0)
        if job.todo:
            with Progress(total=len(job.todo) * chunk, desc=f"encode documents {engine.label}".strip(), unit="doc",
                          show_progress=show_progress, log=logger) as bar:
                engine.encode_vectors(job, progress=bar.update)
    logger.info("building index of %d documents from %s into %s", total, corpus_file, out)
    stages = dict.fromkeys(("read", "docstore", "bm25", "encode", "faiss"), 0.0)
    try:
        store = SQLiteDocStore(tmp / DOCS_FILE, create=True)
        bm25_builder = BM25Builder(bm25_params or BM25Params())
        bits = passages.bits if passages is not None else 0
        chunks = n_vectors = 0  # the checkpoint's chunks and the vectors they hold
        n = 0
        matched = 0
        with Progress(total=total, desc="index documents", unit="doc", show_progress=show_progress, log=logger) as bar:
            tick = time.perf_counter()
            for k, batch in enumerate(_batched(iter_beir_documents(corpus_file, batch_size=_READ_BATCH), chunk)):
                if extra:
                    batch, hits = _with_metadata(batch, extra)
                    matched += hits
                tick = _lap(stages, "read", tick)
                store.add_many(batch)
                tick = _lap(stages, "docstore", tick)
                bm25_builder.add([d.content for d in batch])
                tick = _lap(stages, "bm25", tick)
                if encoder is not None and checkpoint is not None:
                    got = checkpoint.load(k)
                    if got is None:
                        vecs = encode_documents(encoder, batch, passages)
                        got = (np.concatenate(vecs), np.concatenate([labels_for(n + i, len(v), bits)
                                                                     for i, v in enumerate(vecs)]))
                        checkpoint.save(k, *got)
                    chunks, n_vectors = k + 1, n_vectors + len(got[1])
                    del got
                    tick = _lap(stages, "encode", tick)
                n += len(batch)
                bar.update(len(batch))
        if extra and matched < len(extra):
            logger.warning("%d metadata rows name doc ids that are not in the corpus", len(extra) - matched)

        tick = time.perf_counter()
        bm25 = bm25_builder.build(show_progress=False)
        del bm25_builder  # its token lists
        bm25.save(tmp / BM25_DIR)
        tick = _lap(stages, "bm25", tick)
        vectors = None
        if encoder is not None and checkpoint is not None:
            # read back from the checkpoint part by part: the vectors are never held whole
            # beside the index they go into (at 1M, 384-d float32: 1.5 GB)
            vectors = DenseIndex.build_streamed(functools.partial(checkpoint.parts, chunks), n_vectors, dense_params,
                                                dim=encoder.dim)
            vectors.save(tmp / VECTORS_FILE)
            tick = _lap(stages, "faiss", tick)
            logger.info("%s vector index of %d vectors built in %.1f s", vectors.kind, len(vectors), stages["faiss"])
        store.close()

        params = _index_params(corpus, corpus_file, corpus_sha, metadata, matched, n, bm25, vectors, encoder, passages,
                               planner)
        params["build_seconds"] = round(time.perf_counter() - t0, 3)
        params["build_stages"] = {k: round(v, 3) for k, v in stages.items()}
        (tmp / PARAMS_FILE).write_text(json.dumps(params, indent=2) + "\n")
        (tmp / _OWNER_FILE).unlink()  # the folder becomes the index
        _replace_dir(tmp, out, overwrite)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if checkpoint is not None and isinstance(exc, Exception):  # a failure of the input: it would recur
            checkpoint.remove()
        raise
    if checkpoint is not None:
        checkpoint.remove()
    logger.info("index of %d documents written to %s in %.1f s", n, out, params["build_seconds"])
    return params


def _lap(stages: dict[str, float], stage: str, since: float) -> float:
    """Add the seconds since ``since`` to ``stages[stage]``; returns now."""
    now = time.perf_counter()
    stages[stage] += now - since
    return now


_OWNER_FILE = "build.pid"
"""In a build's temporary folder: the building process's id, so that a later build can tell a
folder left by a killed build (removed) from one a live build is writing (kept)."""


def _remove_dead_builds(out: Path) -> None:
    """Remove the temporary folders ``.<out name>.tmp-*`` beside ``out`` that builds killed before
    they finished left behind (their process is gone; one without an owner file predates it). The
    encoded vectors of a killed build are not in them but in its checkpoint, which is kept."""
    for folder in out.parent.glob(f".{out.name}.tmp-*"):
        try:
            pid = int((folder / _OWNER_FILE).read_text())
            os.kill(pid, 0)  # raises when no such process
            continue
        except ProcessLookupError:
            pass
        except PermissionError:
            continue  # alive, another user's
        except (OSError, ValueError):  # no owner file: a build from before owner files, or one just starting
            try:
                if time.time() - folder.stat().st_mtime < 600:
                    continue
            except OSError:
                continue
        logger.info("removing %s, left by a build that did not finish", folder)
        shutil.rmtree(folder, ignore_errors=True)


def _load_encoder(embedder: str | None, batch_size: int, query_prefix: str | None,
                  document_prefix: str | None, runtime: str) -> Any:
    """The sentence-transformers encoder of ``embedder`` (``None``: the packaged MiniLM) on
    ``runtime``, with the model's known prefixes unless given
    (:func:`heedrank.index.encoder.default_prefixes`)."""
    from heedrank.index.encoder import SentenceTransformerEncoder, default_prefixes

    qp, dp = default_prefixes(embedder)
    return SentenceTransformerEncoder(
        embedder, batch_size=batch_size,
        query_prefix=qp if query_prefix is None else query_prefix,
        document_prefix=dp if document_prefix is None else document_prefix,
        runtime=runtime,
    )


def _with_metadata(batch: Sequence[Document], extra: Mapping[str, Mapping[str, Any]]) -> tuple[list[Document], int]:
    """``batch`` with each document's metadata file fields merged over its corpus fields, and
    how many documents had some."""
    merged, matched = [], 0
    for doc in batch:
        fields = extra.get(doc.doc_id)
        if fields:
            matched += 1
            doc = Document(doc.doc_id, doc.text, doc.title, {**doc.metadata, **fields})
        merged.append(doc)
    return merged, matched


def _index_params(corpus: Path, corpus_file: Path, corpus_sha: str, metadata: str | Path | None, matched: int, n: int,
                  bm25: Any, vectors: Any, encoder: Any, passages: Any, planner: Any) -> dict[str, Any]:
    """``params.json`` of a built index (:func:`build_index`, "Returns"), ``build_seconds`` unset."""
    from heedrank.index.dense import VECTORS_FILE

    params: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "build_seconds": None,
        "corpus": {"path": str(corpus), "file": str(corpus_file), "sha256": corpus_sha},
        "metadata_file": (
            {"path": str(Path(metadata).absolute()), "sha256": file_sha256(Path(metadata)), "matched_docs": matched}
            if metadata is not None else None
        ),
        "num_docs": n,
        "bm25": bm25.describe(),
        "dense": (
            {
                "index_type": vectors.describe()["index_type"],
                "params": vectors.params.to_dict(),
                "dim": vectors.dim,
                "num_vectors": len(vectors),
                "metric": "inner_product",
                "file": VECTORS_FILE,
                "embedder": encoder.describe(),
                "passages": passages.to_dict() if passages is not None else None,
                "planner": planner.to_dict(),
            }
            if vectors is not None and encoder is not None else None
        ),
        "versions": library_versions(),
    }
    return params


def _replace_dir(tmp: Path, out: Path, overwrite: bool) -> None:
    """Move ``tmp`` to ``out``; an existing ``out`` is moved aside first, then deleted."""
    _check_target(out, overwrite)  # something may have appeared during the build
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{uuid.uuid4().hex[:8]}"
        out.rename(old)
    tmp.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def read_params(path: str | Path) -> Mapping[str, Any]:
    """``params.json`` of an index directory. Raises NotFoundError when missing or unreadable."""
    file = Path(path) / PARAMS_FILE
    hint = f"; build one with `heedrank index build --corpus DATA --out {path}`"
    if not file.is_file():
        raise NotFoundError(f"no index at {path} (missing {PARAMS_FILE}){hint}")
    try:
        params = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise NotFoundError(f"index at {path} is corrupt ({PARAMS_FILE}: {exc}){hint}") from exc
    if not isinstance(params, dict):
        raise NotFoundError(f"index at {path} is corrupt ({PARAMS_FILE} is not an object){hint}")
    return params

"""Persistent document KV store for BlockRank (issue #13).

With ``query_in_instruction=false`` a BlockRank candidate block depends only on the fixed
instruction (block 0) and the document itself (ALGORITHMS.md section 3), so its keys and
values for layers ``0..l*`` can be computed once per document at index time and reused by
every query. This module is the *storage* for them; the LM code that fills it calls
:meth:`KVStore.put_many` / :func:`build_missing` with numpy arrays.

Per document the payload is ``keys`` and ``values``, each ``(n_layers, kv_heads, T, head_dim)``
with ``n_layers = l* + 1`` and ``1 <= T <= max_doc_tokens`` (``T`` varies per document).

On-disk layout of a store directory (conventionally ``<index dir>/kv``)::

    header.json              KVHeader: what the keys/values were computed with (written once)
    MANIFEST.json            committed state: shard list, tombstones, next shard id
                             (replaced atomically: tmp file + fsync + os.replace + dir fsync)
    shard-000000.bin         append-once payloads, each entry 64-byte aligned
    shard-000000.idx.json    per-shard index: [doc_id, offset, length, T, crc32] per entry
    LOCK                     flock'ed by the one writable opener (cross-process writer lock)
    parts/part-00000/ ...    only during a distributed build: each Ray actor's own store,
                             adopted into this one by the driver (:meth:`KVStore.adopt`)

A shard is *committed* only once the manifest lists it (with its size and the crc32 of its
index file); anything else (a writer killed mid-shard, a full disk) is an orphan that
readers never look at and a writable open deletes. A later shard overrides an earlier one
for the same ``doc_id``; a tombstone ``{doc_id: s}`` hides that document in shards ``< s``.

Entry payload (``length`` bytes, crc32 over exactly these bytes):

* ``float16``: keys fp16 ``(L, H, T, D)`` then values fp16 ``(L, H, T, D)``:
  ``4 * L*H*T*D`` bytes.
* ``int8``: key scales fp32 ``(L, H, D)`` (per channel, over the block's tokens), value
  scales fp32 ``(L, H, T)`` (per token, over channels), keys int8 ``(L, H, T, D)``, values
  int8 ``(L, H, T, D)``: ``2 * L*H*T*D + 4 * L*H*(D + T)`` bytes. Symmetric rounding to
  ``[-127, 127]``; the error per element is at most ``scale / 2``.

At SmolLM2-135M's shape (l* = 15 so L = 16, H = 3, D = 64) a 96-token block takes
1,179,648 bytes in fp16 and 620,544 bytes in int8 (0.53x).

Integrity: every read from disk verifies the entry's crc32 (zlib.crc32, ~6 GB/s on one
core: ~0.2 ms for a 1.2 MB entry, small next to decoding it to float32; LRU hits skip it).
A bad entry (checksum, truncated file, wrong length) is logged, dropped from the in-memory
index and reported as missing, so :func:`build_missing` recomputes it; it is never
returned. Reads memory-map each shard (``numpy.memmap``), lazily, and keep it mapped.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Self

import numpy as np
from attnrank.index.rwlock import RWLock

from attnrank.errors import KVStoreError, KVStoreMismatchError, ValidationError
from attnrank.lru import ByteLRU, CacheStats

if TYPE_CHECKING:
    from attnrank.config import RerankerConfig
    from attnrank.engine import Engine

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "DEFAULT_TEXT_CACHE_BYTES",
    "ENV_CACHE_BYTES",
    "ENV_TEXT_CACHE_BYTES",
    "FORMAT_VERSION",
    "BuildReport",
    "ByteLRU",
    "CacheStats",
    "CompactReport",
    "KVHeader",
    "KVStore",
    "KVStoreStats",
    "BlockBuildPlan",
    "TextKVCache",
    "build_index_blocks",
    "build_missing",
    "build_part",
    "dequantize_int8",
    "index_block_texts",
    "open_index_store",
    "plan_build",
    "prune_blocks",
    "quantize_int8",
]

FORMAT_VERSION = 1
DTYPES = ("float16", "int8")
HEADER_FILE = "header.json"
MANIFEST_FILE = "MANIFEST.json"
LOCK_FILE = "LOCK"
PARTS_DIR = "parts"  # part stores of a distributed build, adopted by the driver
ENV_CACHE_BYTES = "ATTNRANK_KV_CACHE_BYTES"
ENV_TEXT_CACHE_BYTES = "ATTNRANK_TEXT_KV_CACHE_BYTES"
DEFAULT_CACHE_BYTES = 512 * 2**20
DEFAULT_TEXT_CACHE_BYTES = 64 * 2**20
DEFAULT_SHARD_MAX_BYTES = 256 * 2**20  # compaction target
_ALIGN = 64  # entry alignment inside a shard, bytes
_WRITE_CHUNK = 8 * 2**20  # bytes per os.write call
_SHARD_FILE = re.compile(r"^shard-(\d+)\.(bin|idx\.json)$")


# --------------------------------------------------------------------------- header


@dataclass(frozen=True)
class KVHeader:
    """What a store's keys/values were computed with; a store only serves an identical header.

    Attributes:
        model_hash: Hash of the LM's weights file(s) (e.g. sha256 hex).
        prompt_template_version: Version of the BlockRank prompt template (block format).
        instruction_hash: Hash of block 0's token ids (the fixed instruction: every document
            block attends to it and starts at position ``L0 = len(instruction)``).
        layer: Scoring layer ``l*``; layers ``0..layer`` are stored.
        kv_heads: Key/value heads per layer (SmolLM2-135M: 3).
        head_dim: Channels per head (SmolLM2-135M: 64).
        max_doc_tokens: Block length: the most tokens ``T`` one document may have.
        dtype: ``"float16"`` (exact for fp16 models) or ``"int8"`` (quantised, ~0.53x).
        adapter_hash: Hash of a fine-tuned adapter (LoRA / BlockRank head), or ``None``.
        format_version: On-disk format version (:data:`FORMAT_VERSION`).

    Raises:
        ValidationError: an invalid field.
    """

    model_hash: str
    prompt_template_version: str
    instruction_hash: str
    layer: int
    kv_heads: int
    head_dim: int
    max_doc_tokens: int
    dtype: str = "float16"
    adapter_hash: str | None = None
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        for name in ("model_hash", "prompt_template_version", "instruction_hash"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValidationError(f"KVHeader.{name} must be a non-empty string, got {value!r}")
        if self.adapter_hash is not None and (not isinstance(self.adapter_hash, str) or not self.adapter_hash):
            raise ValidationError(f"KVHeader.adapter_hash must be a non-empty string or None, got {self.adapter_hash!r}")
        for name in ("layer", "kv_heads", "head_dim", "max_doc_tokens", "format_version"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (0 if name == "layer" else 1):
                raise ValidationError(f"KVHeader.{name} must be an int >= {0 if name == 'layer' else 1}, got {value!r}")
        if self.dtype not in DTYPES:
            raise ValidationError(f"KVHeader.dtype must be one of {DTYPES}, got {self.dtype!r}")

    @property
    def n_layers(self) -> int:
        """Stored layers: ``layer + 1``."""
        return self.layer + 1

    def to_dict(self) -> dict[str, Any]:
        """JSON form, ``n_layers`` included."""
        d = asdict(self)
        d["n_layers"] = self.n_layers
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> KVHeader:
        """Inverse of :meth:`to_dict`.

        Raises:
            KVStoreError: unknown or missing fields, or ``n_layers != layer + 1``.
        """
        d = dict(data)
        n_layers = d.pop("n_layers", None)
        try:
            header = cls(**d)
        except TypeError as exc:
            raise KVStoreError(f"invalid KV store header {dict(data)!r}: {exc}") from exc
        except ValidationError as exc:
            raise KVStoreError(f"invalid KV store header: {exc}") from exc
        if n_layers is not None and n_layers != header.n_layers:
            raise KVStoreError(f"invalid KV store header: n_layers={n_layers} but layer={header.layer}")
        return header

    def fingerprint(self) -> str:
        """sha256 hex of the canonical JSON of :meth:`to_dict` (64 characters)."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode("utf-8")).hexdigest()

    def doc_shape(self, tokens: int) -> tuple[int, int, int, int]:
        """``(n_layers, kv_heads, tokens, head_dim)``: the shape of one document's keys (or values)."""
        return (self.n_layers, self.kv_heads, tokens, self.head_dim)

    def entry_nbytes(self, tokens: int) -> int:
        """Payload bytes of one document of ``tokens`` tokens (keys + values + scales; no
        alignment padding, no index entry)."""
        n = self.n_layers * self.kv_heads * tokens * self.head_dim
        if self.dtype == "float16":
            return 4 * n
        return 2 * n + 4 * self.n_layers * self.kv_heads * (self.head_dim + tokens)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 24 else text[:20] + "...'"


def _mismatch(path: Path, stored: KVHeader, expected: KVHeader) -> KVStoreMismatchError:
    a, b = stored.to_dict(), expected.to_dict()
    fields = tuple(sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k)))
    diffs = "; ".join(f"{k}: stored {_short(a.get(k))}, expected {_short(b.get(k))}" for k in fields)
    return KVStoreMismatchError(
        f"the document KV store at {path} was built with other parameters ({diffs}); it is not "
        f"served, as its keys/values belong to another model, adapter, prompt, layer or dtype. "
        f"Rebuild it with `attnrank index kv build --index {path.parent} --layer {expected.layer} "
        f"--dtype {expected.dtype}` and the reranker's --model and --max-doc-tokens (block length "
        f"{expected.max_doc_tokens} tokens with its markers), or delete {path}; or serve the reranker "
        f"with the store's parameters (layer {stored.layer}, dtype {stored.dtype}).",
        fields, a,
    )


# --------------------------------------------------------------------------- codec


def quantize_int8(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Symmetric int8 quantisation of one document block.

    Args:
        keys: float ``(L, H, T, D)``.
        values: float ``(L, H, T, D)``.

    Returns:
        ``(key_scale, value_scale, key_q, value_q)``: float32 ``(L, H, D)`` (per key channel,
        ``max_T |k| / 127``), float32 ``(L, H, T)`` (per value token, ``max_D |v| / 127``), int8
        ``(L, H, T, D)`` twice. An all-zero channel/token gets scale 1 (its codes are 0).
        ``|x - q * scale| <= scale / 2`` per element (up to float32 rounding).
    """
    k = np.asarray(keys, dtype=np.float32)
    v = np.asarray(values, dtype=np.float32)
    ks = np.abs(k).max(axis=2) / np.float32(127.0)
    vs = np.abs(v).max(axis=3) / np.float32(127.0)
    ks[ks == 0] = 1.0
    vs[vs == 0] = 1.0
    kq = np.clip(np.rint(k / ks[:, :, None, :]), -127, 127).astype(np.int8)
    vq = np.clip(np.rint(v / vs[:, :, :, None]), -127, 127).astype(np.int8)
    return ks.astype(np.float32), vs.astype(np.float32), kq, vq


def dequantize_int8(key_scale: np.ndarray, value_scale: np.ndarray, key_q: np.ndarray, value_q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Inverse of :func:`quantize_int8`: float32 ``(L, H, T, D)`` keys and values."""
    k = key_q.astype(np.float32)
    k *= key_scale[:, :, None, :]
    v = value_q.astype(np.float32)
    v *= value_scale[:, :, :, None]
    return k, v


def _shape_text(header: KVHeader) -> str:
    return f"({header.n_layers}, {header.kv_heads}, T, {header.head_dim})"


def _encode(header: KVHeader, doc_id: str, keys: Any, values: Any) -> tuple[int, list[np.ndarray]]:
    """Validate one document and return ``(T, payload parts)`` (contiguous arrays, in order).

    Raises:
        ValidationError: wrong shape, non-float or non-finite values, or values beyond fp16 range.
    """
    k, v = np.asarray(keys), np.asarray(values)
    if k.ndim != 4 or k.shape != v.shape:
        raise ValidationError(
            f"document {doc_id!r}: keys of shape {k.shape} and values of shape {v.shape}; both must "
            f"be (n_layers, kv_heads, T, head_dim) = {_shape_text(header)}"
        )
    T = int(k.shape[2])
    if k.shape != header.doc_shape(T) or not 1 <= T <= header.max_doc_tokens:
        raise ValidationError(
            f"document {doc_id!r}: keys/values of shape {k.shape}, expected {_shape_text(header)} "
            f"with 1 <= T <= max_doc_tokens={header.max_doc_tokens}"
        )
    if not (np.issubdtype(k.dtype, np.floating) and np.issubdtype(v.dtype, np.floating)):
        raise ValidationError(f"document {doc_id!r}: keys/values must be floating point, got {k.dtype}/{v.dtype}")
    if header.dtype == "float16":
        with np.errstate(over="ignore", invalid="ignore"):  # checked just below
            parts = [np.ascontiguousarray(k, dtype=np.float16), np.ascontiguousarray(v, dtype=np.float16)]
    else:
        if not (np.isfinite(k).all() and np.isfinite(v).all()):
            raise ValidationError(f"document {doc_id!r}: keys/values contain NaN or inf")
        parts = list(quantize_int8(k, v))
    if header.dtype == "float16" and not (np.isfinite(parts[0]).all() and np.isfinite(parts[1]).all()):
        raise ValidationError(f"document {doc_id!r}: keys/values contain NaN/inf or exceed the float16 range")
    return T, parts


_F16_TABLE: np.ndarray | None = None


def _f16_table() -> np.ndarray:
    """float32 ``(65536,)``: the value of every float16 bit pattern (256 KiB, built once)."""
    global _F16_TABLE
    if _F16_TABLE is None:
        with np.errstate(invalid="ignore"):
            _F16_TABLE = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    return _F16_TABLE


def _decode(header: KVHeader, buf: np.ndarray, tokens: int, out: str = "float32") -> tuple[np.ndarray, np.ndarray]:
    """``out`` (float32 or float16) ``(L, H, T, D)`` keys and values from a uint8 payload view (copies)."""
    L, H, D, T = header.n_layers, header.kv_heads, header.head_dim, tokens
    n = L * H * T * D
    if header.dtype == "float16":
        if out == "float16":
            half = buf[: 4 * n].view(np.float16)
            return half[:n].reshape(L, H, T, D).copy(), half[n:].reshape(L, H, T, D).copy()
        # a 65,536-entry table lookup is bit-identical to numpy's fp16 -> fp32 cast and
        # ~2.6x faster (0.33 vs 0.88 ms for one SmolLM2 block on this machine)
        bits = buf[: 4 * n].view(np.uint16)
        lut = _f16_table()
        return np.take(lut, bits[:n]).reshape(L, H, T, D), np.take(lut, bits[n:]).reshape(L, H, T, D)
    o = 0
    ks = buf[o : o + 4 * L * H * D].view(np.float32).reshape(L, H, D)
    o += 4 * L * H * D
    vs = buf[o : o + 4 * L * H * T].view(np.float32).reshape(L, H, T)
    o += 4 * L * H * T
    kq = buf[o : o + n].view(np.int8).reshape(L, H, T, D)
    vq = buf[o + n : o + 2 * n].view(np.int8).reshape(L, H, T, D)
    k, v = dequantize_int8(ks, vs, kq, vq)
    return (k, v) if out == "float32" else (k.astype(out), v.astype(out))


# --------------------------------------------------------------------------- LRU


def _env_bytes(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        value = int(raw.strip().replace("_", ""))
    except ValueError:
        raise ValidationError(f"{name}={raw!r} must be a whole number of bytes (e.g. {default})") from None
    if value < 0:
        raise ValidationError(f"{name}={raw!r} must be >= 0 bytes")
    return value


def _readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


# --------------------------------------------------------------------------- file helpers


def _write(fd: int, data: Any) -> None:
    """Write all of ``data`` (a bytes-like object) to ``fd``. Tests monkeypatch this."""
    mv = memoryview(data).cast("B")
    while len(mv):
        n = os.write(fd, mv[:_WRITE_CHUNK])
        mv = mv[n:]


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_file(path: Path, data: bytes) -> None:
    """Create ``path`` (must not exist), write, fsync."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        _write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, data: bytes) -> None:
    """tmp file + fsync + ``os.replace`` + directory fsync. Leaves ``path`` unchanged (and no
    tmp file) when it raises before the replace."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        _write_file(tmp, data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:
        _fsync_dir(path.parent)
    except OSError as exc:  # pragma: no cover - the rename happened; only its durability is unsure
        logger.warning("could not fsync %s after replacing %s: %s", path.parent, path.name, exc)


def _unlink_quiet(*paths: Path) -> None:
    for p in paths:
        try:
            p.unlink(missing_ok=True)
        except OSError as exc:  # pragma: no cover - best effort cleanup
            logger.warning("could not remove %s: %s", p, exc)


def _io_error(what: str, path: Path, exc: OSError) -> KVStoreError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return KVStoreError(
            f"disk full while {what} in the KV store at {path} ({exc.strerror or exc}); nothing was "
            f"committed and the partial files were removed. Free disk space (or use dtype='int8', "
            f"~0.53x the bytes) and run the build again: finished shards are kept."
        )
    return KVStoreError(f"I/O error while {what} in the KV store at {path}: {exc}; nothing was committed.")


def _shard_names(shard_id: int) -> tuple[str, str]:
    return f"shard-{shard_id:06d}.bin", f"shard-{shard_id:06d}.idx.json"


# --------------------------------------------------------------------------- store


class _Loc(NamedTuple):
    shard: int
    offset: int
    length: int
    tokens: int
    crc: int


class _BadEntry(Exception):
    pass


@dataclass(frozen=True)
class KVStoreStats:
    """What :meth:`KVStore.stats` reports.

    Attributes:
        documents: Live documents.
        shards: Committed shards.
        bytes_on_disk: Bytes of every file in the store directory.
        live_bytes: Payload bytes of the live documents.
        tombstones: Deletions not yet compacted away.
        dropped_entries: Entries found corrupt or truncated since open (served as misses).
        cache: The RAM LRU's counters.
    """

    documents: int
    shards: int
    bytes_on_disk: int
    live_bytes: int
    tombstones: int
    dropped_entries: int
    cache: CacheStats


@dataclass(frozen=True)
class CompactReport:
    """What :meth:`KVStore.compact` did. Byte counts are whole-directory sizes."""

    documents: int
    shards_before: int
    shards_after: int
    bytes_before: int
    bytes_after: int
    dropped_entries: int
    seconds: float


@dataclass(frozen=True)
class BuildReport:
    """What :func:`build_missing` did.

    Attributes:
        requested: Distinct documents asked for.
        skipped: Already stored (not recomputed).
        computed: Computed and committed now.
        shards: Shards committed (one per batch).
        seconds: Wall time.
    """

    requested: int
    skipped: int
    computed: int
    shards: int
    seconds: float


class KVStore:
    """A persistent, append-only, checksummed store of BlockRank document keys/values.

    Open it with :meth:`create`, :meth:`open` or :meth:`open_or_create`. One process at a
    time may open a store writable (an ``flock`` on ``LOCK``); any number may open it
    ``readonly=True`` and pick up new commits with :meth:`refresh`. Within a process all
    methods are thread-safe: reads run concurrently, writers are serialised and only block
    readers for the in-memory swap after their files are durable.

    Args (of the constructors):
        cache_bytes: RAM LRU budget in bytes for decoded documents (default: env
            ``ATTNRANK_KV_CACHE_BYTES``, else 512 MiB; 0 disables it).
        out_dtype: What reads return: ``"float32"`` (default) or ``"float16"`` (half the RAM
            in the LRU, and for a float16 store a plain copy instead of a conversion: ~3x
            faster reads; what a fp16/bf16 model consumes anyway).
        readonly: Open without the writer lock; writes raise :class:`KVStoreError`.
    """

    def __init__(
        self, path: Path, header: KVHeader, *, readonly: bool, cache_bytes: int | None, lock_fd: int | None,
        out_dtype: str = "float32",
    ) -> None:
        if out_dtype not in ("float32", "float16"):
            if lock_fd is not None:
                os.close(lock_fd)
            raise ValidationError(f"out_dtype must be 'float32' or 'float16', got {out_dtype!r}")
        self.out_dtype = out_dtype
        self.path = path
        self.header = header
        self.readonly = readonly
        self._lock_fd = lock_fd
        self._cache = ByteLRU(_env_bytes(ENV_CACHE_BYTES, DEFAULT_CACHE_BYTES) if cache_bytes is None else int(cache_bytes))
        self._rw = RWLock()  # guards _index, _manifest, _maps swaps
        self._writer = threading.Lock()  # serialises put/delete/compact
        self._map_lock = threading.Lock()  # lazy memmap opens
        self._maps: dict[int, np.memmap] = {}
        self._index: dict[str, _Loc] = {}
        self._manifest: dict[str, Any] = {}
        self._next_shard = 0
        self._dropped = 0
        self._closed = False

    # ---- constructors

    @classmethod
    def create(
        cls, path: str | os.PathLike[str], header: KVHeader, *, cache_bytes: int | None = None, out_dtype: str = "float32"
    ) -> KVStore:
        """Create an empty store at ``path`` (a new or empty directory).

        Raises:
            KVStoreError: ``path`` exists and is not empty, or cannot be written.
        """
        path = Path(path).expanduser().absolute()
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise KVStoreError(f"cannot create a KV store at {path}: it exists and is not an empty directory; open it instead")
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _io_error("creating the directory", path, exc) from exc
        lock_fd = cls._acquire_lock(path)
        store = cls(path, header, readonly=False, cache_bytes=cache_bytes, lock_fd=lock_fd, out_dtype=out_dtype)
        try:
            _write_atomic(path / HEADER_FILE, (json.dumps(header.to_dict(), indent=2, sort_keys=True) + "\n").encode())
            store._manifest = store._new_manifest([], {})
            store._commit(store._manifest)
        except OSError as exc:
            store.close()
            raise _io_error("writing the header", path, exc) from exc
        logger.info("created KV store at %s (%s, layers 0..%d, block %d tokens)", path, header.dtype, header.layer, header.max_doc_tokens)
        return store

    @classmethod
    def open(
        cls, path: str | os.PathLike[str], expected_header: KVHeader, *, readonly: bool = False,
        cache_bytes: int | None = None, out_dtype: str = "float32",
    ) -> KVStore:
        """Open an existing store, checking it was built for ``expected_header``.

        A writable open also removes uncommitted files (shards of a writer that died, tmp files).

        Raises:
            KVStoreMismatchError: the stored header differs (the message names the fields and
                the rebuild command).
            KVStoreError: no store at ``path``, damaged header/manifest, or another process
                holds the writer lock.
        """
        path = Path(path).expanduser().absolute()
        header_file = path / HEADER_FILE
        if not header_file.is_file():
            raise KVStoreError(
                f"no document KV store at {path} (no {HEADER_FILE}); build one with "
                f"`attnrank index kv build --index {path.parent} ...`"
            )
        try:
            stored = KVHeader.from_dict(json.loads(header_file.read_text()))
        except (OSError, ValueError) as exc:
            raise KVStoreError(f"unreadable KV store header {header_file}: {exc}; delete {path} and rebuild it") from exc
        if stored != expected_header:
            raise _mismatch(path, stored, expected_header)
        lock_fd = None if readonly else cls._acquire_lock(path)
        store = cls(path, stored, readonly=readonly, cache_bytes=cache_bytes, lock_fd=lock_fd, out_dtype=out_dtype)
        try:
            store._load()
            if not readonly:
                store._remove_orphans()
        except BaseException:
            store.close()
            raise
        return store

    @classmethod
    def open_or_create(cls, path: str | os.PathLike[str], header: KVHeader, **kwargs: Any) -> KVStore:
        """:meth:`open` when ``path`` holds a store, else :meth:`create` (writable)."""
        p = Path(path).expanduser()
        if (p / HEADER_FILE).is_file():
            return cls.open(p, header, **kwargs)
        kwargs.pop("readonly", None)
        return cls.create(p, header, **kwargs)

    @staticmethod
    def _acquire_lock(path: Path) -> int:
        fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            raise KVStoreError(
                f"the KV store at {path} is open for writing by another process (or object); "
                f"open it with readonly=True, or wait for that writer to finish"
            ) from exc
        return fd

    def close(self) -> None:
        """Release the mmaps, the RAM cache and the writer lock. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with self._rw.write():
            self._maps.clear()
            self._index = {}
        self._cache.clear()
        if self._lock_fd is not None:
            try:
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            finally:
                os.close(self._lock_fd)
                self._lock_fd = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - depends on GC
        try:
            if self._lock_fd is not None:
                os.close(self._lock_fd)
        except (OSError, AttributeError):
            return

    # ---- manifest / load

    def _new_manifest(self, shards: list[dict[str, Any]], tombstones: dict[str, int]) -> dict[str, Any]:
        return {
            "format_version": FORMAT_VERSION,
            "header_fingerprint": self.header.fingerprint(),
            "next_shard": self._next_shard,
            "shards": shards,
            "tombstones": tombstones,
        }

    def _commit(self, manifest: dict[str, Any]) -> None:
        """Durably replace MANIFEST.json (the commit point). Raises OSError unchanged."""
        _write_atomic(self.path / MANIFEST_FILE, (json.dumps(manifest, separators=(",", ":")) + "\n").encode())

    def _read_manifest(self) -> dict[str, Any]:
        mpath = self.path / MANIFEST_FILE
        if not mpath.is_file():
            # create() died between writing header.json and the first manifest
            logger.warning("KV store %s has a header but no manifest: treating it as empty", self.path)
            return self._new_manifest([], {})
        try:
            manifest = json.loads(mpath.read_text())
        except (OSError, ValueError) as exc:
            raise KVStoreError(f"unreadable KV store manifest {mpath}: {exc}; delete {self.path} and rebuild it") from exc
        if manifest.get("header_fingerprint") != self.header.fingerprint():
            raise KVStoreError(f"KV store manifest {mpath} belongs to another header.json; delete {self.path} and rebuild it")
        if manifest.get("format_version") != FORMAT_VERSION:
            raise KVStoreError(f"KV store manifest {mpath} has format {manifest.get('format_version')}, expected {FORMAT_VERSION}")
        return manifest

    def _load(self) -> None:
        manifest = self._read_manifest()
        index: dict[str, _Loc] = {}
        tombstones: dict[str, int] = manifest["tombstones"]
        dropped = 0
        for meta in sorted(manifest["shards"], key=lambda m: m["id"]):
            sid = meta["id"]
            entries = self._read_shard_index(meta)
            if entries is None:  # whole shard unusable: its documents become misses
                for row in self._read_shard_index(meta, trust=True) or []:
                    index.pop(row[0], None)
                dropped += meta["entries"]
                continue
            try:
                size = (self.path / meta["bin"]).stat().st_size
            except OSError as exc:
                logger.warning("KV shard %s is missing (%s): its %d documents will be recomputed", meta["bin"], exc, len(entries))
                size = 0
            bad = 0
            for doc_id, offset, length, tokens, crc in entries:
                if tombstones.get(doc_id, -1) > sid:
                    continue
                if offset + length > size or length != self.header.entry_nbytes(tokens) or not 1 <= tokens <= self.header.max_doc_tokens:
                    index.pop(doc_id, None)  # never fall back to an older version
                    bad += 1
                    continue
                index[doc_id] = _Loc(sid, offset, length, tokens, crc)
            if bad:
                dropped += bad
                logger.warning(
                    "KV shard %s is truncated or damaged (%d of %d bytes): %d entries dropped, they will be recomputed",
                    meta["bin"], size, meta["bin_bytes"], bad,
                )
        with self._rw.write():
            self._manifest = manifest
            self._next_shard = max(self._next_shard, int(manifest["next_shard"]))
            self._index = index
            self._maps.clear()
            self._dropped += dropped
        self._cache.clear()

    def _read_shard_index(self, meta: Mapping[str, Any], *, trust: bool = False) -> list[list[Any]] | None:
        ipath = self.path / meta["idx"]
        try:
            raw = ipath.read_bytes()
        except OSError as exc:
            if not trust:
                logger.warning("KV shard index %s unreadable (%s): its documents will be recomputed", ipath, exc)
            return None
        if not trust and (len(raw) != meta["idx_bytes"] or zlib.crc32(raw) != meta["idx_crc32"]):
            logger.warning("KV shard index %s is corrupt (size/crc32 mismatch): its documents will be recomputed", ipath)
            return None
        try:
            return json.loads(raw)["entries"]
        except (ValueError, KeyError, TypeError):
            return None

    def _remove_orphans(self) -> None:
        committed = {name for m in self._manifest["shards"] for name in (m["bin"], m["idx"])}
        for entry in os.scandir(self.path):
            name = entry.name
            orphan = (_SHARD_FILE.match(name) and name not in committed) or (name.startswith(".") and ".tmp-" in name)
            if orphan:
                logger.warning("removing uncommitted KV store file %s (a writer stopped before committing it)", entry.path)
                _unlink_quiet(Path(entry.path))

    def refresh(self) -> None:
        """Reload the committed manifest (for ``readonly`` openers; another process writes)."""
        with self._writer:
            self._load()

    # ---- reads

    def _map(self, shard: int) -> np.memmap:
        mm = self._maps.get(shard)
        if mm is not None:
            return mm
        with self._map_lock:
            mm = self._maps.get(shard)
            if mm is None:
                meta = next(m for m in self._manifest["shards"] if m["id"] == shard)
                try:
                    mm = np.memmap(self.path / meta["bin"], dtype=np.uint8, mode="r")
                except (OSError, ValueError) as exc:
                    raise _BadEntry(f"cannot map shard {meta['bin']}: {exc}") from exc
                self._maps[shard] = mm
            return mm

    def _read_entry(self, loc: _Loc) -> np.ndarray:
        """A uint8 view of a verified payload. Raises _BadEntry."""
        mm = self._map(loc.shard)
        end = loc.offset + loc.length
        if end > len(mm):
            raise _BadEntry(f"entry ends at byte {end} past the mapped shard ({len(mm)} bytes)")
        # The file may have shrunk since it was mapped; touching pages past EOF would SIGBUS.
        try:
            size = os.stat(str(mm.filename)).st_size
        except OSError:
            size = len(mm)  # unlinked (e.g. compacted by another process): the mapping stays valid
        if end > size:
            raise _BadEntry(f"shard truncated to {size} bytes, entry ends at byte {end}")
        buf = mm[loc.offset : end]
        if zlib.crc32(buf.data) != loc.crc:
            raise _BadEntry("crc32 mismatch")
        return buf

    def get_many(self, doc_ids: Iterable[str]) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], list[str]]:
        """Keys/values of the stored documents among ``doc_ids``.

        Returns:
            ``(found, missing)``: ``found`` maps doc_id to read-only ``(keys, values)``, each
            ``(n_layers, kv_heads, T_doc, head_dim)`` float32 (float16 with ``out_dtype``), in
            request order; ``missing`` lists
            the others (never stored, deleted, or found corrupt now: these are dropped from the
            index with a warning so that a rebuild recomputes them), in request order.
            Duplicate ids are answered once.
        """
        ids = list(dict.fromkeys(doc_ids))
        got: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        need: list[str] = []
        for d in ids:
            kv = self._cache.get(d)
            if kv is None:
                need.append(d)
            else:
                got[d] = kv
        bad: list[tuple[str, _Loc, str]] = []
        if need:
            with self._rw.read():
                for d in need:
                    loc = self._index.get(d)
                    if loc is None:
                        continue
                    try:
                        k, v = _decode(self.header, self._read_entry(loc), loc.tokens, self.out_dtype)
                    except _BadEntry as exc:
                        bad.append((d, loc, str(exc)))
                        continue
                    kv = (_readonly(k), _readonly(v))
                    got[d] = kv
                    # under the read lock: no commit can invalidate d between read and insert
                    self._cache.put(d, kv, k.nbytes + v.nbytes)
        if bad:
            self._drop(bad)
        found = {d: got[d] for d in ids if d in got}
        return found, [d for d in ids if d not in got]

    def get(self, doc_id: str) -> tuple[np.ndarray, np.ndarray] | None:
        """One document's ``(keys, values)`` (see :meth:`get_many`), or ``None``."""
        found, _ = self.get_many([doc_id])
        return found.get(doc_id)

    def _drop(self, bad: Sequence[tuple[str, _Loc, str]]) -> None:
        with self._rw.write():
            for d, loc, why in bad:
                if self._index.get(d) == loc:
                    del self._index[d]
                    self._dropped += 1
                    meta = next((m for m in self._manifest["shards"] if m["id"] == loc.shard), {"bin": loc.shard})
                    logger.warning(
                        "KV store %s: entry %r in %s is corrupt (%s); treated as missing, it will be recomputed",
                        self.path, d, meta["bin"], why,
                    )

    def verify(self, doc_ids: Iterable[str] | None = None, *, show_progress: bool = False) -> list[str]:
        """Check the crc32 of stored documents (all by default) and drop the bad ones.

        Cost: reads every checked byte once (~6 GB/s crc32 plus the disk). Returns the dropped ids.
        """
        from tqdm.auto import tqdm

        with self._rw.read():
            targets = list(self._index.items()) if doc_ids is None else [(d, self._index[d]) for d in dict.fromkeys(doc_ids) if d in self._index]
        bad: list[tuple[str, _Loc, str]] = []
        with tqdm(total=len(targets), desc="verify kv", unit="doc", disable=not show_progress) as bar:
            for d, loc in targets:
                with self._rw.read():
                    if self._index.get(d) == loc:
                        try:
                            self._read_entry(loc)
                        except _BadEntry as exc:
                            bad.append((d, loc, str(exc)))
                bar.update(1)
        if bad:
            self._drop(bad)
        return [d for d, _, _ in bad]

    def contains(self, doc_id: str) -> bool:
        """Whether ``doc_id`` is stored (its checksum is checked on read, not here)."""
        with self._rw.read():
            return doc_id in self._index

    __contains__ = contains

    def __len__(self) -> int:
        with self._rw.read():
            return len(self._index)

    def doc_ids(self) -> list[str]:
        """Live document ids, in no particular order."""
        with self._rw.read():
            return list(self._index)

    def tokens(self, doc_id: str) -> int | None:
        """``T_doc`` of a stored document, or ``None``."""
        with self._rw.read():
            loc = self._index.get(doc_id)
        return None if loc is None else loc.tokens

    # ---- writes

    def _check_writable(self) -> None:
        if self._closed:
            raise KVStoreError(f"the KV store at {self.path} is closed")
        if self.readonly:
            raise KVStoreError(f"the KV store at {self.path} was opened readonly")

    def _write_shard(self, items: Iterable[tuple[str, int, Sequence[Any]]], expected: int, *, progress: Any = None) -> tuple[dict[str, Any], dict[str, _Loc]]:
        """Write one shard from ``(doc_id, T, payload parts)`` and make it durable (not committed).

        Returns:
            ``(manifest entry, {doc_id: location})``.

        Raises:
            OSError: after removing the partial files.
        """
        sid = self._next_shard
        self._next_shard += 1
        bin_name, idx_name = _shard_names(sid)
        bpath, ipath = self.path / bin_name, self.path / idx_name
        locs: dict[str, _Loc] = {}
        rows: list[list[Any]] = []
        try:
            fd = os.open(bpath, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                offset = 0
                for doc_id, tokens, parts in items:
                    crc, length = 0, 0
                    for part in parts:
                        crc = zlib.crc32(part, crc)
                        _write(fd, part)
                        length += part.nbytes if isinstance(part, np.ndarray) else len(part)
                    pad = -length % _ALIGN
                    if pad:
                        _write(fd, b"\0" * pad)
                    locs[doc_id] = _Loc(sid, offset, length, tokens, crc)
                    rows.append([doc_id, offset, length, tokens, crc])
                    offset += length + pad
                    if progress is not None:
                        progress.update(1)
                os.fsync(fd)
            finally:
                os.close(fd)
            if len(rows) != expected:  # pragma: no cover - internal invariant
                raise KVStoreError(f"internal error: wrote {len(rows)} entries, expected {expected}")
            idx = (json.dumps({"format_version": FORMAT_VERSION, "shard": sid, "header_fingerprint": self.header.fingerprint(), "entries": rows}, separators=(",", ":")) + "\n").encode()
            _write_file(ipath, idx)
            _fsync_dir(self.path)
        except BaseException:
            _unlink_quiet(bpath, ipath)
            raise
        meta = {
            "id": sid, "bin": bin_name, "idx": idx_name, "bin_bytes": offset, "idx_bytes": len(idx),
            "idx_crc32": zlib.crc32(idx), "entries": len(rows),
        }
        return meta, locs

    def put_many(self, items: Mapping[str, tuple[Any, Any]]) -> int:
        """Store documents as ONE new shard, committed atomically (all or none).

        Args:
            items: ``{doc_id: (keys, values)}``, each float ``(n_layers, kv_heads, T, head_dim)``
                (float16/float32/...; converted to the store's dtype). A stored id is replaced.

        Returns:
            Documents written.

        Raises:
            ValidationError: a bad id or array (nothing written).
            KVStoreError: disk full or another I/O error (nothing committed, partial files
                removed), or a readonly/closed store.
        """
        self._check_writable()
        encoded: list[tuple[str, int, list[np.ndarray]]] = []
        for doc_id, (keys, values) in items.items():
            if not isinstance(doc_id, str) or not doc_id:
                raise ValidationError(f"document ids must be non-empty strings, got {doc_id!r}")
            T, parts = _encode(self.header, doc_id, keys, values)
            encoded.append((doc_id, T, parts))
        if not encoded:
            return 0
        with self._writer:
            self._check_writable()
            bin_path = ""
            try:
                meta, locs = self._write_shard(iter(encoded), len(encoded))
                bin_path = meta["bin"]
                tomb = {d: s for d, s in self._manifest["tombstones"].items() if d not in locs}
                manifest = self._new_manifest(self._manifest["shards"] + [meta], tomb)
                try:
                    self._commit(manifest)
                except BaseException:
                    _unlink_quiet(self.path / meta["bin"], self.path / meta["idx"])
                    raise
            except OSError as exc:
                raise _io_error(f"writing shard {bin_path or 'of ' + str(len(encoded)) + ' documents'}", self.path, exc) from exc
            with self._rw.write():
                self._manifest = manifest
                self._index.update(locs)
                for d in locs:
                    self._cache.pop(d)
        logger.debug("KV store %s: committed %s (%d documents, %d bytes)", self.path, meta["bin"], meta["entries"], meta["bin_bytes"])
        return len(encoded)

    def adopt(self, source: str | os.PathLike[str], *, verify: bool = False, remove: bool = True) -> int:
        """Commit the blocks of another store directory built for the same header (a Ray
        actor's part of a distributed build, :meth:`attnrank.engine.ray.RayEngine.build_blocks`)
        into this store, in ONE manifest commit, without rewriting their bytes.

        Only what ``source``'s own manifest commits is taken (its shards are fsynced before it
        lists them, and their index files are size- and crc32-checked on open), so a shard a
        writer left half-written is never adopted; every entry keeps its crc32, checked on
        each read. Each adopted shard's ``.bin`` is hard-linked (copied where the filesystem
        has no hard links) under a new shard id, with a new index file listing only its
        adopted entries. Blocks this store already holds are skipped, so adopting a source
        twice (a crash after the commit, before ``source`` was removed) adds nothing.

        Crash safety: before the commit the new files are orphans (removed at the next
        writable open) and ``source`` is intact, so a rerun adopts it again; after it,
        ``source`` is redundant.

        Args:
            source: A store directory (its ``header.json`` must equal this store's header).
            verify: crc32-check every entry of ``source`` first (reads all its bytes once);
                a bad entry is not adopted (it will be recomputed).
            remove: Delete ``source`` after the commit.

        Returns:
            Blocks adopted.

        Raises:
            KVStoreMismatchError: ``source`` was built for another header.
            KVStoreError: ``source`` is missing, damaged or written by another process (nothing
                adopted), a disk or I/O error (nothing committed), or this store is
                readonly/closed.
        """
        import shutil

        self._check_writable()
        src_path = Path(source).expanduser().absolute()
        with self._writer:
            self._check_writable()
            src = KVStore.open(src_path, self.header, cache_bytes=0)  # writable: its lock, its orphans removed
            new_metas: list[dict[str, Any]] = []
            locs: dict[str, _Loc] = {}
            try:
                if verify:
                    src.verify()
                with src._rw.read():
                    entries = list(src._index.items())
                    src_metas = {m["id"]: m for m in src._manifest["shards"]}
                with self._rw.read():
                    by_shard: dict[int, list[tuple[str, _Loc]]] = {}
                    for d, loc in entries:
                        if d not in self._index:
                            by_shard.setdefault(loc.shard, []).append((d, loc))
                try:
                    for sid in sorted(by_shard):
                        meta, shard_locs = self._link_shard(src.path / src_metas[sid]["bin"], by_shard[sid])
                        new_metas.append(meta)
                        locs.update(shard_locs)
                    if new_metas:
                        tomb = {d: s for d, s in self._manifest["tombstones"].items() if d not in locs}
                        manifest = self._new_manifest(self._manifest["shards"] + new_metas, tomb)
                        self._commit(manifest)
                except BaseException as exc:  # nothing committed: drop the new files
                    _unlink_quiet(*(self.path / m[k] for m in new_metas for k in ("bin", "idx")))
                    if isinstance(exc, OSError):
                        raise _io_error(f"adopting {src_path}", self.path, exc) from exc
                    raise
                if new_metas:
                    with self._rw.write():
                        self._manifest = manifest
                        self._index.update(locs)
                        for d in locs:
                            self._cache.pop(d)
            finally:
                src.close()
        if remove:
            shutil.rmtree(src_path, ignore_errors=True)
        logger.info("KV store %s: adopted %d blocks in %d shards from %s", self.path, len(locs), len(new_metas), src_path)
        return len(locs)

    def _link_shard(self, bin_src: Path, rows: Sequence[tuple[str, _Loc]]) -> tuple[dict[str, Any], dict[str, _Loc]]:
        """Hard-link (or copy) ``bin_src`` in as a new shard, write its index for ``rows`` and
        make both durable (not committed). Raises OSError after removing what it wrote."""
        import shutil

        sid = self._next_shard
        self._next_shard += 1
        bin_name, idx_name = _shard_names(sid)
        bpath, ipath = self.path / bin_name, self.path / idx_name
        ordered = sorted(rows, key=lambda r: r[1].offset)
        try:
            try:
                os.link(bin_src, bpath)
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP):
                    raise
                shutil.copyfile(bin_src, bpath)
                fd = os.open(bpath, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            size = bpath.stat().st_size
            table = [[d, loc.offset, loc.length, loc.tokens, loc.crc] for d, loc in ordered]
            idx = (json.dumps({"format_version": FORMAT_VERSION, "shard": sid, "header_fingerprint": self.header.fingerprint(),
                               "entries": table}, separators=(",", ":")) + "\n").encode()
            _write_file(ipath, idx)
            _fsync_dir(self.path)
        except BaseException:
            _unlink_quiet(bpath, ipath)
            raise
        meta = {"id": sid, "bin": bin_name, "idx": idx_name, "bin_bytes": size, "idx_bytes": len(idx),
                "idx_crc32": zlib.crc32(idx), "entries": len(table)}
        return meta, {d: loc._replace(shard=sid) for d, loc in ordered}

    def parts_dir(self) -> Path:
        """``<store>/parts``: where the actors of a distributed build write their own stores
        (``part-00000``, ...) before :meth:`adopt_parts` commits them into this one."""
        return self.path / PARTS_DIR

    def adopt_parts(self, *, verify: bool = False, show_progress: bool = False) -> int:
        """:meth:`adopt` every part store under :meth:`parts_dir` (what an interrupted
        distributed build left: what its actors committed is kept, the rest recomputed) and
        remove them. A part with no header (its writer died while creating it) is removed; a
        part another process still writes (an actor of a build being torn down) is left for
        a later build, with a warning.

        Returns:
            Blocks adopted.

        Raises:
            See :meth:`adopt`.
        """
        import shutil

        from tqdm.auto import tqdm

        root = self.parts_dir()
        if not root.is_dir():
            return 0
        parts = sorted(p for p in root.iterdir() if p.is_dir())
        adopted = 0
        for part in tqdm(parts, desc="adopt kv parts", unit="part", disable=not show_progress or not parts):
            try:
                os.close(self._acquire_lock(part))  # released at once: adopt() takes it again
            except (KVStoreError, OSError) as exc:
                logger.warning("KV store part %s is not adopted now (%s); a later build adopts it", part, exc)
                continue
            if (part / HEADER_FILE).is_file():
                adopted += self.adopt(part, verify=verify)
            else:
                shutil.rmtree(part, ignore_errors=True)
        if adopted:
            logger.info("KV store %s: adopted %d blocks from %d parts of an earlier distributed build", self.path,
                        adopted, len(parts))
        return adopted

    def delete(self, doc_ids: Iterable[str]) -> int:
        """Delete documents (tombstones, committed atomically; bytes come back on :meth:`compact`).

        Returns:
            Documents that were stored and are now deleted.

        Raises:
            KVStoreError: I/O error (nothing deleted) or a readonly/closed store.
        """
        self._check_writable()
        with self._writer:
            with self._rw.read():
                live = [d for d in dict.fromkeys(doc_ids) if d in self._index]
            if not live:
                return 0
            tomb = dict(self._manifest["tombstones"])
            for d in live:
                tomb[d] = self._next_shard
            manifest = self._new_manifest(list(self._manifest["shards"]), tomb)
            try:
                self._commit(manifest)
            except OSError as exc:
                raise _io_error("committing a deletion", self.path, exc) from exc
            with self._rw.write():
                self._manifest = manifest
                for d in live:
                    self._index.pop(d, None)
                    self._cache.pop(d)
        return len(live)

    def compact(self, *, shard_max_bytes: int = DEFAULT_SHARD_MAX_BYTES, show_progress: bool = False) -> CompactReport:
        """Rewrite the live documents into new shards of about ``shard_max_bytes`` bytes,
        commit a manifest listing only those (tombstones cleared), then remove the old shards.

        A crash before the commit leaves the old store intact (the new files are orphans);
        after it, the old files are orphans. Corrupt entries met on the way are dropped.

        Raises:
            KVStoreError: disk full / I/O error (the store is unchanged) or readonly/closed.
        """
        from tqdm.auto import tqdm

        self._check_writable()
        t0 = time.perf_counter()
        with self._writer:
            bytes_before = self._dir_bytes()
            old_shards = list(self._manifest["shards"])
            with self._rw.read():
                live = sorted(self._index.items(), key=lambda kv: (kv[1].shard, kv[1].offset))
            # plan new shards by payload bytes
            groups: list[list[tuple[str, _Loc]]] = [[]]
            size = 0
            for d, loc in live:
                if groups[-1] and size + loc.length > shard_max_bytes:
                    groups.append([])
                    size = 0
                groups[-1].append((d, loc))
                size += loc.length + (-loc.length % _ALIGN)
            groups = [g for g in groups if g]
            bad: list[tuple[str, _Loc, str]] = []
            new_metas: list[dict[str, Any]] = []
            new_locs: dict[str, _Loc] = {}

            def payloads(group: list[tuple[str, _Loc]]) -> Iterator[tuple[str, int, Sequence[Any]]]:
                for d, loc in group:
                    try:
                        buf = self._read_entry(loc)  # old shards stay mapped: only this writer closes them
                    except _BadEntry as exc:
                        bad.append((d, loc, str(exc)))
                        bar.update(1)
                        continue
                    yield d, loc.tokens, [buf]

            try:
                with tqdm(total=len(live), desc="compact kv", unit="doc", disable=not show_progress) as bar:
                    for group in groups:
                        ready = list(payloads(group))  # mmap views of verified entries: cheap
                        if ready:
                            meta, locs = self._write_shard(iter(ready), len(ready), progress=bar)
                            new_metas.append(meta)
                            new_locs.update(locs)
                manifest = self._new_manifest(new_metas, {})
                self._commit(manifest)
            except BaseException as exc:  # nothing committed: remove the new shards
                _unlink_quiet(*(self.path / m[k] for m in new_metas for k in ("bin", "idx")))
                if isinstance(exc, OSError):
                    raise _io_error("compacting", self.path, exc) from exc
                raise
            with self._rw.write():
                self._manifest = manifest
                # documents deleted or re-put meanwhile cannot happen (writer lock held);
                # entries dropped as corrupt by readers meanwhile stay dropped
                self._index = {d: loc for d, loc in new_locs.items() if d in self._index}
                self._maps.clear()
                self._dropped += len(bad)
            for d, _loc, why in bad:
                logger.warning("KV store %s: entry %r is corrupt (%s); dropped by compaction", self.path, d, why)
            for m in old_shards:
                _unlink_quiet(self.path / m["bin"], self.path / m["idx"])
            try:
                _fsync_dir(self.path)
            except OSError:  # pragma: no cover
                pass
            report = CompactReport(
                documents=len(new_locs), shards_before=len(old_shards), shards_after=len(new_metas),
                bytes_before=bytes_before, bytes_after=self._dir_bytes(), dropped_entries=len(bad),
                seconds=time.perf_counter() - t0,
            )
        logger.info(
            "compacted KV store %s: %d -> %d shards, %d -> %d bytes", self.path,
            report.shards_before, report.shards_after, report.bytes_before, report.bytes_after,
        )
        return report

    # ---- stats

    def _dir_bytes(self) -> int:
        total = 0
        for entry in os.scandir(self.path):
            if entry.is_file(follow_symlinks=False):
                total += entry.stat(follow_symlinks=False).st_size
        return total

    def stats(self) -> KVStoreStats:
        """Documents, shards, bytes on disk (whole directory), live payload bytes, cache counters."""
        with self._rw.read():
            documents = len(self._index)
            live = sum(loc.length for loc in self._index.values())
            shards = len(self._manifest.get("shards", []))
            tombstones = len(self._manifest.get("tombstones", {}))
            dropped = self._dropped
        return KVStoreStats(documents, shards, self._dir_bytes(), live, tombstones, dropped, self._cache.stats())

    def cache_stats(self) -> CacheStats:
        """The RAM LRU's counters (hits, misses, evictions, bytes) for /metrics."""
        return self._cache.stats()


# --------------------------------------------------------------------------- build helper


def build_missing(
    store: KVStore,
    doc_ids: Iterable[str],
    compute_fn: Callable[[list[str]], Mapping[str, tuple[Any, Any]]],
    *,
    batch_size: int = 32,
    show_progress: bool = False,
    verify_existing: bool = False,
) -> BuildReport:
    """Resumable build: compute and store the documents of ``doc_ids`` not stored yet.

    Each batch is committed as its own shard, so after a crash (even ``kill -9``) a rerun
    skips every finished batch and recomputes only the rest.

    Args:
        store: A writable store.
        doc_ids: Documents wanted (duplicates ignored).
        compute_fn: ``compute_fn([doc_id, ...]) -> {doc_id: (keys, values)}`` for exactly
            those ids; arrays float ``(n_layers, kv_heads, T, head_dim)``.
        batch_size: Documents per call and per shard (at SmolLM2's shape, 32 fp16 documents of
            96 tokens make a ~38 MB shard).
        show_progress: tqdm bar (docs/s, ETA).
        verify_existing: crc32-check the already stored documents first and recompute bad ones
            (reads them all once).

    Returns:
        A :class:`BuildReport`.

    Raises:
        KVStoreError: ``compute_fn`` left out requested ids, or the store cannot be written.
        Whatever ``compute_fn`` raises (the batches committed before it stay).
    """
    from tqdm.auto import tqdm

    _check_batch_size(batch_size)
    t0 = time.perf_counter()
    ids = list(dict.fromkeys(doc_ids))
    todo = _missing(store, ids, verify_existing=verify_existing, show_progress=show_progress)
    skipped = len(ids) - len(todo)
    with tqdm(total=len(todo), desc="kv build", unit="doc", disable=not show_progress, dynamic_ncols=True) as bar:
        bar.set_postfix(skipped=skipped)
        shards = put_batches(store, todo, compute_fn, batch_size=batch_size, progress=bar.update)
    return BuildReport(len(ids), skipped, len(todo), shards, time.perf_counter() - t0)


def _check_batch_size(batch_size: int) -> None:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValidationError(f"batch_size must be an integer >= 1, got {batch_size!r}")


def _missing(store: KVStore, ids: list[str], *, verify_existing: bool, show_progress: bool) -> list[str]:
    """The ids of ``ids`` (distinct) not stored yet, after an optional crc32 check of the
    stored ones (:meth:`KVStore.verify`: bad entries are dropped, so they count as missing)."""
    if verify_existing:
        store.verify(ids, show_progress=show_progress)
    todo = [d for d in ids if not store.contains(d)]
    if len(ids) > len(todo):
        logger.info("kv build: %d of %d documents already stored, computing %d", len(ids) - len(todo), len(ids),
                    len(todo))
    return todo


def put_batches(
    store: KVStore,
    todo: Sequence[str],
    compute_fn: Callable[[list[str]], Mapping[str, tuple[Any, Any]]],
    *,
    batch_size: int,
    progress: Callable[[int], Any] | None = None,
) -> int:
    """Compute ``todo`` in batches of ``batch_size`` and commit each batch as one shard
    (:meth:`KVStore.put_many`); ``progress(n)`` after each. Returns the shards committed.

    Raises:
        KVStoreError: ``compute_fn`` left out requested ids, or the store cannot be written.
        Whatever ``compute_fn`` raises (the batches committed before it stay).
    """
    shards = 0
    for b in range(0, len(todo), batch_size):
        batch = list(todo[b : b + batch_size])
        out = compute_fn(list(batch))
        absent = [d for d in batch if d not in out]
        if absent:
            raise KVStoreError(f"compute_fn returned no keys/values for {len(absent)} requested documents, e.g. {absent[:3]}")
        extra = len(out) - len(batch)
        if extra:
            logger.warning("kv build: compute_fn returned %d documents that were not asked for; ignored", extra)
        store.put_many({d: out[d] for d in batch})
        shards += 1
        if progress is not None:
            progress(len(batch))
    return shards


def build_part(
    store_dir: str | Path,
    header: KVHeader,
    keys: Sequence[str],
    compute_fn: Callable[[list[str]], Mapping[str, tuple[Any, Any]]],
    *,
    batch_size: int = 32,
) -> dict[str, Any]:
    """One part of a distributed document KV store build (``attnrank index kv build
    --engine ray``, :meth:`attnrank.engine.ray.RayEngine.build_blocks`): compute and store
    one part's blocks in a store of its own.

    Opens (or creates) the KV store at ``store_dir`` for ``header`` and runs
    :func:`build_missing` over ``keys`` with ``compute_fn`` (the BlockRank block encoder:
    ``compute_fn([key, ...]) -> {key: (keys, values)}``). It is resumable (a rerun skips what
    was committed). A store has one writer, so each part writes its own directory
    (``<kv>/parts/part-00000``, ...; :meth:`BlockBuildPlan.part_dirs`); each actor runs this
    per part, and the driver adopts the part into the index's store (:meth:`KVStore.adopt`).

    Returns:
        The :class:`BuildReport` as a dict, with ``store``.

    Raises:
        KVStoreError, KVStoreMismatchError: from the store (another header, a held lock).
    """
    store = KVStore.open_or_create(store_dir, header)
    try:
        report = build_missing(store, list(keys), compute_fn, batch_size=batch_size)
    finally:
        store.close()
    return {**asdict(report), "store": str(Path(store_dir))}


# --------------------------------------------------------------------------- text cache


class TextKVCache:
    """In-memory LRU of document keys/values for ad-hoc ``/rerank`` documents (no collection id).

    Keyed by ``sha256(header fingerprint, document text)``, so entries computed for another
    model/adapter/layer/prompt never match. Values are stored as given (read-only copies).

    Args:
        header: The :class:`KVHeader` the keys/values are computed with (shapes are checked
            against it), or a fingerprint string (no shape check).
        max_bytes: Budget in bytes (default: env ``ATTNRANK_TEXT_KV_CACHE_BYTES``, else 64 MiB).
    """

    def __init__(self, header: KVHeader | str, max_bytes: int | None = None) -> None:
        self.header = header if isinstance(header, KVHeader) else None
        self.fingerprint = header.fingerprint() if isinstance(header, KVHeader) else str(header)
        self._lru = ByteLRU(_env_bytes(ENV_TEXT_CACHE_BYTES, DEFAULT_TEXT_CACHE_BYTES) if max_bytes is None else int(max_bytes))

    def key(self, text: str) -> str:
        """sha256 hex of (header fingerprint, text)."""
        h = hashlib.sha256(self.fingerprint.encode("utf-8"))
        h.update(b"\0")
        h.update(text.encode("utf-8"))
        return h.hexdigest()

    def get(self, text: str) -> tuple[np.ndarray, np.ndarray] | None:
        """``(keys, values)`` put for ``text``, or ``None`` (counts a hit or miss)."""
        return self._lru.get(self.key(text))

    def put(self, text: str, keys: Any, values: Any) -> bool:
        """Cache one document's ``(keys, values)`` (each ``(n_layers, kv_heads, T, head_dim)``).

        Returns:
            Whether it was cached (``False`` when larger than the whole budget).

        Raises:
            ValidationError: shapes that do not fit the header.
        """
        k, v = np.array(keys, copy=True), np.array(values, copy=True)
        if self.header is not None:
            ok = k.ndim == 4 and k.shape == v.shape and k.shape == self.header.doc_shape(k.shape[2]) and 1 <= k.shape[2] <= self.header.max_doc_tokens
            if not ok:
                raise ValidationError(
                    f"keys of shape {k.shape} / values of shape {v.shape} do not fit "
                    f"{_shape_text(self.header)} (1 <= T <= {self.header.max_doc_tokens})"
                )
        return self._lru.put(self.key(text), (_readonly(k), _readonly(v)), k.nbytes + v.nbytes)

    def clear(self) -> None:
        self._lru.clear()

    def __len__(self) -> int:
        return len(self._lru)

    def stats(self) -> CacheStats:
        return self._lru.stats()


def index_block_texts(index: Any, encoder: Any, *, show_progress: bool = False) -> dict[str, str]:
    """The block key of every live document of ``index`` and one text per key.

    Args:
        index: :class:`attnrank.index.store.Index`.
        encoder: A cached-mode reranker offering ``block_keys(texts)`` (tokenisation only).
        show_progress: tqdm bar over the documents.

    Returns:
        ``{block key: document text}`` in document order; documents whose blocks have the
        same tokens share one key (the first text is kept).
    """
    texts: dict[str, str] = {}
    docs = index.docstore.iter_documents()
    if show_progress:
        from tqdm.auto import tqdm

        docs = tqdm(docs, total=len(index.docstore), desc="tokenise", unit="doc")
    chunk: list[str] = []

    def flush() -> None:
        for key, text in zip(encoder.block_keys(chunk), chunk):
            texts.setdefault(key, text)
        chunk.clear()

    for doc in docs:
        chunk.append(doc.content)
        if len(chunk) >= 1000:
            flush()
    flush()
    return texts


def prune_blocks(store: KVStore, keep: Iterable[str], *, show_progress: bool = False) -> int:
    """Delete the blocks of ``store`` not in ``keep`` (deleted or replaced documents) and
    compact the store when any were deleted. Returns the blocks deleted.

    Raises:
        KVStoreError: the store cannot be written.
    """
    wanted = set(keep)
    stale = [k for k in store.doc_ids() if k not in wanted]
    if stale:
        store.delete(stale)
        store.compact(show_progress=show_progress)
    logger.info("kv build: pruned %d blocks of deleted or replaced documents", len(stale))
    return len(stale)


@dataclass
class BlockBuildPlan:
    """What a build of an index's document KV store has left to do (:func:`plan_build`),
    the same for either engine: the engine encodes :attr:`todo` (:meth:`encode_here` in this
    process, or parts on Ray: :meth:`part_dirs`, :meth:`adopt`).

    Attributes:
        store: The index's store, writable (its lock keeps other builders out); parts an
            interrupted distributed build left are already adopted.
        encoder: The cached-mode reranker the plan was made with (its header; tokenisation;
            the LM that :meth:`encode_here` runs).
        texts: ``{block key: text}`` of every live document, in document order; documents
            whose blocks have the same tokens share one key.
        todo: The keys of :attr:`texts` not stored yet, in order.
        started: ``time.perf_counter()`` when planning began (:meth:`report` counts from it).
    """

    store: KVStore
    encoder: Any
    texts: dict[str, str]
    todo: list[str]
    started: float

    @property
    def skipped(self) -> int:
        """Blocks stored before this build (adopted leftover parts included)."""
        return len(self.texts) - len(self.todo)

    @property
    def header(self) -> dict[str, Any]:
        """The encoder's store header (what every encoded block must match)."""
        return dict(self.encoder.block_store_header())

    def encode_here(self, *, batch_size: int, progress: Callable[[int], Any] | None = None) -> int:
        """Encode :attr:`todo` with :attr:`encoder` in this process, one committed shard per
        batch (:func:`put_batches`); returns the shards committed."""
        texts, encoder = self.texts, self.encoder

        def compute(keys: list[str]) -> dict[str, tuple[Any, Any]]:
            return {k: (kk, vv) for k, kk, vv in encoder.encode_block_arrays([texts[k] for k in keys])}

        return put_batches(self.store, self.todo, compute, batch_size=batch_size, progress=progress)

    def part_dirs(self, n: int) -> list[Path]:
        """``n`` part store directories under :meth:`KVStore.parts_dir` for a distributed
        build (not created), numbered after every part already there: a part left behind by
        an earlier run (still locked by a dying actor) never has its name reused."""
        parts_dir = self.store.parts_dir()
        parts_dir.mkdir(exist_ok=True)
        first = 1 + max((int(p.name[5:]) for p in parts_dir.glob("part-*") if p.name[5:].isdigit()), default=-1)
        return [parts_dir / f"part-{first + i:05d}" for i in range(n)]

    def adopt(self, part: str | Path) -> None:
        """Commit a finished part store into :attr:`store` (:meth:`KVStore.adopt`: one atomic
        manifest commit, hard links, the part removed after it)."""
        self.store.adopt(part)

    def report(self, shards: int) -> BuildReport:
        """The build's :class:`BuildReport` (``seconds`` since planning began)."""
        return BuildReport(len(self.texts), self.skipped, len(self.todo), shards, time.perf_counter() - self.started)


def plan_build(index: Any, encoder: Any, *, verify_existing: bool = False, show_progress: bool = False) -> BlockBuildPlan:
    """Plan the build of ``index``'s document KV store (the one planner of both engines):
    open the store writable for ``encoder``'s header, adopt the parts an interrupted
    distributed build left (:meth:`KVStore.adopt_parts`), key every live document's block
    (:func:`index_block_texts`), crc32-check the stored blocks with ``verify_existing``, and
    leave out the committed ones.

    Raises:
        ValidationError: the encoder is not in cached mode, or the index is in memory.
        KVStoreMismatchError: the index's store was built for another configuration.
        KVStoreError: another process writes the store.
    """
    started = time.perf_counter()
    store = open_index_store(index, encoder)
    store.adopt_parts(verify=verify_existing, show_progress=show_progress)
    texts = index_block_texts(index, encoder, show_progress=show_progress)
    todo = _missing(store, list(texts), verify_existing=verify_existing, show_progress=show_progress)
    return BlockBuildPlan(store, encoder, texts, todo, started)


def build_index_blocks(
    index: Any, encoder: Any, *, engine: Engine | None = None, config: RerankerConfig | None = None,
    batch_size: int = 32, show_progress: bool = False, verify_existing: bool = False, prune: bool = False,
) -> tuple[KVStore, BuildReport]:
    """Fill an index's document KV store (``attnrank index kv build``) with every live
    document's block, resumably: :func:`plan_build`, then the engine encodes what is missing
    (one committed shard per batch; a rerun after ``kill -9`` skips finished shards; a
    corrupt entry is recomputed, never read), then the optional prune. Parts left by an
    interrupted distributed build (``--engine ray``) are adopted first, so either engine
    resumes the other's build.

    Args:
        index: :class:`attnrank.index.store.Index` opened from a directory (with the Ray
            engine: a directory every Ray node sees at the same path, e.g. a shared
            filesystem; always true of a local Ray).
        encoder: A cached-mode reranker (:class:`attnrank.protocols.BlockCachingReranker`
            that also offers ``block_keys(texts)`` and ``encode_block_arrays(texts)``, e.g.
            BlockRank with ``query_in_instruction=false``). With an engine that encodes
            elsewhere it only gives the header and tokenises.
        engine: Where the blocks are encoded (:class:`attnrank.engine.Engine`); default:
            this process, with ``encoder``.
        config: The encoder's :class:`~attnrank.config.RerankerConfig`: an engine that encodes
            elsewhere builds its encoders from it (the Ray engine needs it).
        batch_size: Blocks per LM batch and per shard.
        show_progress: tqdm bars (tokenising; blocks committed).
        verify_existing: crc32-check stored blocks first (and adopted parts), recompute bad ones.
        prune: Afterwards delete the blocks no live document has any more (deleted or
            replaced documents) and compact the store, reclaiming their bytes.

    Returns:
        ``(store, report)``; blocks are keyed by the hash of their token ids, so documents
        with the same text share one block. ``report.skipped`` counts blocks stored before
        this build (adopted leftover parts included), ``report.seconds`` the whole build.

    Raises:
        ValidationError: the encoder is not in cached mode, the index is in memory, or bad sizes.
        KVStoreMismatchError: the index's store (or a Ray worker's reranker) is for another configuration.
        KVStoreError: a full disk, another writer, or Ray workers that cannot see the index directory.
        Whatever the engine raises (e.g. RayExecutionError; what was committed stays, rerun to resume).
    """
    from tqdm.auto import tqdm

    _check_batch_size(batch_size)
    plan = plan_build(index, encoder, verify_existing=verify_existing, show_progress=show_progress)
    label = f" ({engine.label})" if engine is not None and engine.label else ""
    with tqdm(total=len(plan.todo), desc=f"kv build{label}", unit="block", disable=not show_progress,
              dynamic_ncols=True) as bar:
        bar.set_postfix(skipped=plan.skipped)
        if engine is None:
            shards = plan.encode_here(batch_size=batch_size, progress=bar.update)
        else:
            shards = engine.build_blocks(plan, config, batch_size=batch_size, progress=bar.update)
    report = plan.report(shards)
    if prune:
        prune_blocks(plan.store, plan.texts, show_progress=show_progress)
    return plan.store, report


def open_index_store(index: Any, encoder: Any) -> KVStore:
    """The writable document KV store of ``index`` for ``encoder``'s header (created when absent).

    Raises:
        ValidationError: the encoder is not in cached mode, or the index is in memory.
        KVStoreMismatchError: the index's store was built for another configuration.
        KVStoreError: another process writes the store.
    """
    header = encoder.block_store_header()
    if header is None:
        raise ValidationError("the reranker is not in cached mode: build blocks with query_in_instruction=false")
    store = index.block_store(header)
    if store is None:
        raise ValidationError("an in-memory index keeps no document KV store; build the index into a directory")
    return store

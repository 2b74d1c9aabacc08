"""The block contract between the reranker and the index (cached BlockRank's document blocks).

Cached BlockRank computes each candidate document's *block* (its keys and values for layers
``0..l*``, float arrays ``(n_layers, kv_heads, T, head_dim)``) independently of the query, so
the index can keep them in a document KV store (:class:`heedrank.index.kv.KVStore`,
``<index>/kv``) and the reranker reads them instead of recomputing. ``reranker/`` and
``index/`` may not import each other, so what they both speak lives here, in the core:

* :data:`BlockKey`: a block's key (the hash of its token ids), a type of its own so that a
  document id is never passed where a block key is expected. Documents with the same text
  share one block.
* :class:`KVHeader`: what a store's blocks were computed with (model, prompt, instruction,
  ``l*``, shape, dtype, adapter); a store serves only an identical header, and
  :meth:`KVHeader.diff` / :func:`header_diff` name the fields that differ.
* The protocols :class:`BlockStore`, :class:`BlockCachingReranker` and :class:`BlockStoreOwner`.
* :func:`block_store_for`: the store an index keeps for a reranker, with :func:`store_hint`
  naming the reranker options that read a mismatched store as it was built.
* :class:`BlockSync`: the upkeep of an index's store after documents are added or deleted
  (the API's ``POST``/``DELETE /documents``) and its check at the service's start-up.
* :class:`BlockFiller`: the service's background fill of a store while no request is served.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, NewType, Protocol, runtime_checkable

from heedrank.errors import HeedrankError, KVStoreError, KVStoreMismatchError, ValidationError

if TYPE_CHECKING:  # type-only: no runtime edge to the protocols module, which re-exports this one's
    from heedrank.protocols import RerankResult
    from heedrank.types import Document, Query

logger = logging.getLogger(__name__)

__all__ = [
    "KV_DTYPES",
    "KV_FORMAT_VERSION",
    "BlockCachingReranker",
    "BlockFiller",
    "BlockKey",
    "BlockStore",
    "BlockStoreOwner",
    "BlockSync",
    "KVHeader",
    "as_header",
    "block_store_for",
    "header_diff",
    "store_hint",
]

BlockKey = NewType("BlockKey", str)
"""Key of one document block in a :class:`BlockStore`: the hash of the block's token ids
(hex; ``heedrank.reranker.doccache.block_key``). Not a document id: documents whose blocks
have the same tokens share one key."""

KV_FORMAT_VERSION = 1
"""On-disk format version of a document KV store (``header.json``, ``MANIFEST.json``, shards;
:mod:`heedrank.index.kv.format`)."""

KV_DTYPES = ("float16", "int8")
"""How a store may keep keys and values; each has its codec in :mod:`heedrank.index.kv.codec`
(the reranker's ``kv_dtype`` option)."""


def header_diff(stored: Mapping[str, Any], expected: Mapping[str, Any]) -> tuple[str, ...]:
    """Names of the fields of ``expected`` whose value in ``stored`` differs (a field ``stored``
    lacks differs unless ``expected``'s is ``None``), sorted. Works on :meth:`KVHeader.to_dict`
    forms and on the partial dicts of errors and plugins alike."""
    return tuple(sorted(k for k in expected if stored.get(k) != expected.get(k)))


@dataclass(frozen=True)
class KVHeader:
    """What a store's keys/values were computed with; a store only serves an identical header.

    A reranker in cached mode says what it needs with :meth:`BlockCachingReranker.block_store_header`
    and the index opens (or creates) its store for that header. ``header.json`` holds
    :meth:`to_dict`, and :meth:`from_dict` reads it back.

    Attributes:
        model_hash: Hash of the LM's weights file(s) (e.g. sha256 hex).
        prompt_template_version: Version of the BlockRank prompt template (block format).
        instruction_hash: Hash of block 0's token ids (the fixed instruction: every document
            block attends to it and starts at position ``L0 = len(instruction)``).
        layer: Scoring layer ``l*``; layers ``0..layer`` are stored.
        kv_heads: Key/value heads per layer (SmolLM2-135M: 3).
        head_dim: Channels per head (SmolLM2-135M: 64).
        max_doc_tokens: Block length: the most tokens ``T`` one document may have.
        dtype: ``"float16"`` (exact for fp16 models) or ``"int8"`` (quantised, ~0.53x); see
            :data:`KV_DTYPES`.
        adapter_hash: Hash of a fine-tuned adapter (LoRA / BlockRank head), or ``None``.
        format_version: On-disk format version (:data:`KV_FORMAT_VERSION`).

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
    format_version: int = KV_FORMAT_VERSION

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
        if self.dtype not in KV_DTYPES:
            raise ValidationError(f"KVHeader.dtype must be one of {KV_DTYPES}, got {self.dtype!r}")

    # -- derived ----------------------------------------------------------------------------
    @property
    def n_layers(self) -> int:
        """Stored layers: ``layer + 1``."""
        return self.layer + 1

    def to_dict(self) -> dict[str, Any]:
        """JSON form (``header.json``): every field, ``n_layers`` included."""
        d = asdict(self)
        d["n_layers"] = self.n_layers
        return d

    @classmethod
    def from_dict(cls, data: KVHeader | Mapping[str, Any]) -> KVHeader:
        """Inverse of :meth:`to_dict` (``n_layers`` optional; a :class:`KVHeader` is returned as
        is).

        Raises:
            KVStoreError: unknown or missing fields (the message says to rebuild the store), or
                ``n_layers != layer + 1``.
        """
        if isinstance(data, KVHeader):
            return data
        d = dict(data)
        n_layers = d.pop("n_layers", None)
        try:
            header = cls(**d)
        except TypeError as exc:
            raise KVStoreError(f"invalid KV store header {dict(data)!r}: {exc}; delete the store and rebuild it "
                               "with `heedrank index kv build`") from exc
        except ValidationError as exc:
            raise KVStoreError(f"invalid KV store header: {exc}") from exc
        if n_layers is not None and n_layers != header.n_layers:
            raise KVStoreError(f"invalid KV store header: n_layers={n_layers} but layer={header.layer}")
        return header

    def fingerprint(self) -> str:
        """sha256 hex of the canonical JSON of :meth:`to_dict` (64 characters)."""
        return hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode("utf-8")).hexdigest()

    def doc_shape(self, tokens: int) -> tuple[int, int, int, int]:
        """``(n_layers, kv_heads, tokens, head_dim)``: the shape of one block's keys (or values)."""
        return (self.n_layers, self.kv_heads, tokens, self.head_dim)

    def entry_nbytes(self, tokens: int) -> int:
        """Payload bytes of one block of ``tokens`` tokens in a store (keys + values + scales;
        no alignment padding, no index entry), as :attr:`dtype`'s codec lays it out
        (:mod:`heedrank.index.kv.codec`)."""
        from heedrank import registry

        return int(registry.kv_codec(self).nbytes(tokens))

    def diff(self, other: KVHeader) -> tuple[str, ...]:
        """Fields (of :meth:`to_dict`, ``n_layers`` included) whose values differ, sorted."""
        return header_diff(self.to_dict(), other.to_dict())


def as_header(header: KVHeader | Mapping[str, Any]) -> KVHeader:
    """``header`` as a :class:`KVHeader`: itself, or parsed from a mapping (what a plugin
    reranker's ``block_store_header()`` may still return).

    Raises:
        KVStoreError: an invalid mapping.
    """
    return KVHeader.from_dict(header)


# ------------------------------------------------------------------------------ protocols


@runtime_checkable
class BlockStore(Protocol):
    """A persistent store of document blocks' keys/values (a collection's document KV
    store, :class:`heedrank.index.kv.KVStore`), keyed by :data:`BlockKey`.

    ``get_many`` returns ``({key: (keys, values)}, missing_keys)`` with read-only float arrays
    ``(n_layers, kv_heads, T, head_dim)``; a corrupt entry is a miss, never returned.
    ``put_many`` stores ``{key: (keys, values)}`` all or nothing (``admit=False``: an explicit
    fill, not subject to a store's admission rule, only to its disk budget); ``delete`` removes blocks
    (and returns how many were stored). A ``readonly`` store refuses both: a reader that
    computed a missing block keeps it to itself.
    """

    readonly: bool

    def get_many(self, keys: Iterable[BlockKey]) -> tuple[dict[BlockKey, tuple[Any, Any]], list[BlockKey]]: ...

    def put_many(self, items: Mapping[BlockKey, tuple[Any, Any]], *, admit: bool = True) -> int: ...

    def contains(self, key: BlockKey) -> bool: ...

    def delete(self, keys: Iterable[BlockKey]) -> int: ...


@runtime_checkable
class BlockCachingReranker(Protocol):
    """A reranker whose candidate blocks can come from a :class:`BlockStore` (cached
    BlockRank, method ``blockrank-cached``).

    ``block_store_header()`` is what a store must have been built with (model hash,
    template version, instruction hash, ``l*``, block length, dtype, adapter hash), or
    ``None`` when this configuration does not use a store; ``rerank(..., block_store=)``
    reads blocks from the store and writes the ones it had to compute back.
    """

    def block_store_header(self) -> KVHeader | None: ...

    def rerank(self, query: Query, candidates: Sequence[Document], *, block_store: Any = None) -> RerankResult: ...

    def block_keys(self, texts: Sequence[str]) -> list[BlockKey]:
        """Store keys of these document texts' blocks (tokenisation only)."""
        ...

    def encode_block_arrays(self, texts: Sequence[str]) -> list[tuple[BlockKey, Any, Any]]:
        """``(key, keys, values)`` per text: float arrays ``(n_layers, kv_heads, T, head_dim)``."""
        ...


@runtime_checkable
class BlockStoreOwner(Protocol):
    """An index that keeps a document KV store for its documents (``<index>/kv``)."""

    def block_store(self, header: KVHeader | Mapping[str, Any], *, create: bool = True) -> BlockStore | None: ...


class RerankerEntries(Protocol):
    """What :class:`BlockSync` reads the built rerankers from
    (:class:`heedrank.pipeline.RerankerCache`)."""

    def entries(self) -> list[tuple[Any, threading.BoundedSemaphore]]: ...


# ------------------------------------------------------------------------------ opening a store


def block_store_for(reranker: Any, index: Any, *, create: bool = True) -> BlockStore | None:
    """The document KV store ``index`` keeps for ``reranker``'s blocks, or ``None`` when the
    reranker does not read stored blocks (not in cached mode), the index keeps none
    (in memory), or ``create`` is false and the index has no store yet.

    Raises:
        KVStoreMismatchError: the index's store was built for another configuration (the
            message starts with the options that would read it as built, when there are some).
        KVStoreError: the store cannot be opened (e.g. another process writes it).
    """
    if not isinstance(reranker, BlockCachingReranker) or not isinstance(index, BlockStoreOwner):
        return None
    header = reranker.block_store_header()
    if header is None:
        return None
    try:
        return index.block_store(header, create=create)
    except KVStoreMismatchError as exc:
        raise KVStoreMismatchError(store_hint(reranker, as_header(header).to_dict(), exc.stored) + str(exc),
                                   exc.fields, exc.stored) from None


def store_hint(reranker: Any, expected: Mapping[str, Any], stored: Mapping[str, Any]) -> str:
    """The reranker options that would read a mismatched store as it is (no rebuild), when
    only ``l*``, the block length or the dtype differ: ``--opt layer=15 --max-doc-tokens 128``;
    ``""`` otherwise.

    Args:
        reranker: Its ``config.max_doc_tokens`` is the content budget of a block.
        expected: The reranker's header fields (:meth:`KVHeader.to_dict`).
        stored: The store's header fields (``{}`` when unknown).
    """
    differ = set(header_diff(stored, expected))
    if not stored or differ - {"layer", "n_layers", "max_doc_tokens", "dtype", "instruction_hash"}:
        return ""
    parts = []
    if "layer" in differ:
        parts.append(f"--opt layer={stored['layer']}")
    if "max_doc_tokens" in differ:  # block length = content budget + the block's marker tokens
        budget = getattr(getattr(reranker, "config", None), "max_doc_tokens", None)
        if budget is not None:
            parts.append(f"--max-doc-tokens {int(budget) + int(stored['max_doc_tokens']) - int(expected['max_doc_tokens'])}")
    if "dtype" in differ:
        parts.append(f"--opt kv_dtype={stored['dtype']}")
    return f"To read this store as built, run the reranker with {' '.join(parts)} (no rebuild). " if parts else ""


# ------------------------------------------------------------------------------ upkeep


class BlockSync:
    """Keeps an index's document KV store in step with its documents, for every built
    reranker in cached mode (:class:`BlockCachingReranker`): the blocks of added documents
    are encoded ahead of their first search, those of deleted ones dropped, and a store
    built for another configuration is caught at start-up.

    Nothing is loaded or created for a reranker that is not built yet: a block that is
    missing is computed on its first use and written back, and ``heedrank index kv build
    --prune`` removes blocks no document has any more.

    Args:
        index: The collection's index (a :class:`BlockStoreOwner`; anything else keeps no store).
        rerankers: The built rerankers (``None``: reranking disabled, nothing to keep).
    """

    def __init__(self, index: Any, rerankers: RerankerEntries | None) -> None:
        self.index = index
        self.rerankers = rerankers

    def _stores(self, *, create: bool) -> Iterator[tuple[BlockCachingReranker, threading.BoundedSemaphore, BlockStore]]:
        if self.rerankers is None or not isinstance(self.index, BlockStoreOwner):
            return
        for reranker, lock in self.rerankers.entries():
            store = block_store_for(reranker, self.index, create=create)
            if store is not None and isinstance(reranker, BlockCachingReranker):
                yield reranker, lock, store

    def encode_new(self, documents: Sequence[Document]) -> int:
        """Compute and store the blocks of ``documents`` that the store lacks (the API runs
        this in its ingest pool after a ``POST /documents`` commit, so new documents are hits
        on their first search). The LM work runs under each reranker's lock.

        Returns:
            Blocks written.

        Raises:
            KVStoreMismatchError: the index's store was built for another configuration.
            KVStoreError: the store cannot be written (e.g. a full disk).
        """
        if not documents:
            return 0
        written = 0
        for reranker, lock, store in self._stores(create=True):
            texts = {k: d.content for k, d in zip(reranker.block_keys([d.content for d in documents]), documents)}
            todo = [k for k in texts if not store.contains(k)]
            if not todo:
                continue
            with lock:
                arrays = reranker.encode_block_arrays([texts[k] for k in todo])
            written += store.put_many({k: (kk, vv) for k, kk, vv in arrays}, admit=False)  # documents just added
        return written

    def drop_deleted(self, documents: Sequence[Document]) -> int:
        """Delete the blocks of ``documents`` (deleted ones) from the store (keys from each
        reranker's ``block_keys``). An index without a store drops nothing.

        Blocks are keyed by their tokens, so a block shared with a live document of the same
        text is dropped too; that document's block is then a miss, computed on its next
        search and written back, so scores stay correct (only that one search pays for it).

        Returns:
            Blocks deleted.

        Raises:
            KVStoreMismatchError: the index's store was built for another configuration.
            KVStoreError: the store cannot be written.
        """
        if not documents:
            return 0
        dropped = 0
        for reranker, _lock, store in self._stores(create=False):
            dropped += int(store.delete(reranker.block_keys([d.content for d in documents])))
        return dropped

    def after_delete(self, documents: Sequence[Document]) -> int:
        """:meth:`drop_deleted` right after ``documents`` were deleted from the index: a
        failure does not undo or fail the (committed) delete; it is logged, and the stale
        blocks only take disk until ``heedrank index kv build --prune``.

        Returns:
            Blocks deleted (0 after a failure).
        """
        try:
            return self.drop_deleted(documents)
        except (HeedrankError, OSError) as exc:
            logger.warning("deleted %d documents but not their KV store blocks (%s); `heedrank index kv build "
                           "--prune` removes them", len(documents), exc)
            return 0

    def check_at_startup(self, reranker: Any, *, collection: str) -> BlockStore | None:
        """Open the index's store for the start-up ``reranker`` when the index has one and the
        reranker reads stored blocks, so that a store built for another configuration fails
        start-up instead of the first search. A store that cannot be opened for another
        reason (e.g. a running ``index kv build`` holds it) is only logged: the first search
        tries again.

        Returns:
            The opened store, or ``None``.

        Raises:
            KVStoreMismatchError: the store was built for another configuration (the message
                starts with ``collection``).
        """
        if self.index is None:
            return None
        try:
            store = block_store_for(reranker, self.index, create=False)
        except KVStoreMismatchError as exc:
            raise KVStoreMismatchError(f"collection {collection!r}: {exc}", exc.fields) from exc
        except KVStoreError as exc:
            logger.warning("collection %r: document KV store not opened at start-up (%s); the first search "
                           "tries again", collection, exc)
            return None
        if store is not None:
            logger.info("collection %r: document KV store opened for reranker %s", collection, type(reranker).__name__)
        return store


# ------------------------------------------------------------------------------ background fill


class IdleSignal(Protocol):
    """What :class:`BlockFiller` waits on: the requests in flight
    (:class:`heedrank.pipeline.RerankerCache`)."""

    @property
    def active(self) -> int: ...

    def wait_idle(self, timeout: float | None = None) -> bool: ...


class BlockFiller:
    """Fills one collection's document KV store in the background, while no request is
    served: first the blocks that searches skipped (:meth:`offer`, most recent request
    first), then every document's block the store lacks, in document order.

    It encodes one block at a time under the reranker's lock and only when ``idle`` says no
    rerank call is running or waiting, so a request waits for at most one block (about
    0.06 s for the packaged SmolLM2 on 2 cores). Encoded blocks are committed in batches of
    ``commit_every`` (or after ``commit_seconds``), with ``admit=False`` (an explicit fill is
    not subject to the store's admission rule, only to its disk budget). A restart loses the
    queue of skipped blocks, not the fill: the document scan starts again and skips what is
    stored. The scan stops when the store holds its disk budget (a store with a budget
    exposes ``disk_budget``); skipped blocks still go in (the store evicts for them).

    The log says how far the document scan is: a line each :attr:`progress_step` percent of
    the documents, and one when every block is stored. :meth:`describe` (``GET /info``)
    reads counters this thread keeps, never the store's files, so it answers at once
    while the store fills.

    Args:
        index: The collection's index (a :class:`BlockStoreOwner` with a ``docstore``).
        reranker: The service's start-up reranker in cached mode (:class:`BlockCachingReranker`).
        lock: What admits the reranker's calls (:func:`heedrank.pipeline.call_gate`); the fill
            takes it around each block it encodes.
        idle: The requests in flight (:class:`IdleSignal`).
        name: The collection's name, for logs.
    """

    commit_every = 16
    commit_seconds = 2.0
    scan_chunk = 256
    progress_step = 10
    """Percent of the documents between two progress lines of the document scan."""
    stats_seconds = 10.0
    """Least seconds between two reads of the store's byte counts (:meth:`describe`'s ``live_bytes``)."""

    def __init__(self, index: Any, reranker: Any, lock: threading.BoundedSemaphore, idle: IdleSignal, *,
                 name: str = "default") -> None:
        self.index, self.reranker, self.lock, self.idle, self.name = index, reranker, lock, idle, name
        self.store: Any = None
        self.filled = 0
        """Blocks encoded and committed by this filler since it started."""
        self.scan_done = False
        """Every document's block was found stored or encoded."""
        self.at_budget = False
        """The scan stopped because the store holds its disk budget."""
        self.documents: int | None = None
        """Live documents of the collection when the scan started (``None`` before)."""
        self.scanned = 0
        """Documents the scan has looked at: their blocks found stored, or handed to the fill to
        encode (the one in progress included). Equals :attr:`documents` once the scan is done."""
        self._next_progress = self.progress_step  # percent
        self._blocks: int | None = None
        self._live_bytes: int | None = None
        self._stats_at = 0.0
        self._queue: dict[BlockKey, str] = {}
        self._qlock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> BlockFiller:
        """Open the store (created when missing) and start the filling thread; a no-op when
        the reranker reads no stored blocks or the index keeps none."""
        self.store = block_store_for(self.reranker, self.index, create=True)
        if self.store is None or self.store.readonly:
            return self
        self._read_stats()
        self._thread = threading.Thread(target=self._run, name=f"heedrank-fill-{self.name}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float | None = 10.0) -> None:
        """Stop after the block in progress (its batch is committed)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def describe(self) -> dict[str, Any]:
        """The store and its fill, for ``GET /info``: ``blocks`` stored, ``live_bytes`` (as of
        the last commit, read at most every :attr:`stats_seconds`), ``disk_budget`` (bytes or
        ``None``), ``filling`` (the thread runs), ``queued`` skipped blocks, ``filled`` (blocks
        this fill encoded), ``scan_done``, ``at_budget``, ``documents`` and ``scanned`` (the
        document scan's progress: equal once ``scan_done``). ``blocks`` may stay below
        ``documents`` with the scan done: documents whose blocks have the same tokens (identical
        texts, or texts identical up to the block's token budget) share one block (NFCorpus: 40
        of its 3633 documents repeat another's text). Counters only: no store I/O, no lock the
        fill holds for long (the block count is the store's in-memory one)."""
        blocks = self._blocks
        if self.store is not None:
            try:
                blocks = len(self.store)
            except Exception:  # noqa: BLE001 - a closed store: the last count read
                pass
        return {
            "blocks": blocks,
            "live_bytes": self._live_bytes,
            "disk_budget": getattr(self.store, "disk_budget", None),
            "filling": self.running and (not (self.scan_done or self.at_budget) or self.queued() > 0),
            "queued": self.queued(), "filled": self.filled, "scan_done": self.scan_done, "at_budget": self.at_budget,
            "documents": self.documents, "scanned": self.scanned,
        }

    def _read_stats(self, force: bool = True) -> None:
        """Refresh the counters :meth:`describe` reports: the block count (cheap, in memory)
        always, the byte counts (a pass over the store's files) when ``force`` or at most every
        :attr:`stats_seconds`."""
        import time

        try:
            self._blocks = len(self.store)
            if force or time.monotonic() - self._stats_at >= self.stats_seconds:
                self._live_bytes = int(self.store.stats().live_bytes)
                self._stats_at = time.monotonic()
        except Exception:  # noqa: BLE001 - counters for /info only
            logger.debug("collection %r: reading the document KV store's counters failed", self.name, exc_info=True)

    def _progress(self) -> None:
        """A log line each time the scan passes another :attr:`progress_step` of the documents."""
        total = self.documents
        percent = self.scanned * 100 // total if total else 0
        if not total or percent < self._next_progress:
            return
        logger.info("collection %r: document KV store fill %d%% (%d of %d documents scanned; %s blocks stored, "
                    "%d encoded by this fill)", self.name, percent, self.scanned, total,
                    "?" if self._blocks is None else self._blocks, self.filled)
        self._next_progress = (percent // self.progress_step + 1) * self.progress_step

    def queued(self) -> int:
        """Skipped blocks waiting to be filled."""
        with self._qlock:
            return len(self._queue)

    def offer(self, documents: Sequence[Document]) -> None:
        """Queue the blocks of ``documents`` (candidates a search skipped as cold) ahead of the
        document scan. Tokenisation only; never blocks on the LM."""
        texts = [d.content for d in documents]
        keys = self.reranker.block_keys(texts)
        with self._qlock:
            for key, text in zip(keys, texts):
                self._queue.pop(key, None)
                self._queue[key] = text  # most recent last: taken first
        self._wake.set()

    def _next_queued(self) -> tuple[BlockKey, str] | None:
        with self._qlock:
            if not self._queue:
                return None
            key = next(reversed(self._queue))
            return key, self._queue.pop(key)

    def _scan(self) -> Iterator[tuple[BlockKey, str]]:
        """``(key, text)`` of every live document whose block the store lacks (checked again
        before encoding), in document order."""
        chunk: list[str] = []
        for doc in self.index.docstore.iter_documents():
            chunk.append(doc.content)
            if len(chunk) >= self.scan_chunk:
                yield from self._missing(chunk)
                chunk = []
        yield from self._missing(chunk)

    def _missing(self, texts: list[str]) -> Iterator[tuple[BlockKey, str]]:
        if self._stop.is_set():
            return
        for key, text in zip(self.reranker.block_keys(texts), texts):
            # counted before the yield: the fill encodes a yielded block before it asks for the next
            # item, and may never ask again (the disk budget reached), so a count after the yield
            # missed the last document handed over
            self.scanned += 1
            self._progress()
            if not self.store.contains(key):
                yield key, text

    def _full(self, pending: int) -> bool:
        """Whether one more block (after the ``pending`` ones not committed yet) could evict
        another: each counted at the largest a block can be."""
        budget = getattr(self.store, "disk_budget", None)
        if not budget:
            return False
        header = self.store.header
        largest = self.store.codec.nbytes(header.max_doc_tokens)
        return int(self.store.budget_bytes()) + (pending + 1) * largest > int(budget)  # O(1): checked per block

    def _run(self) -> None:
        import time

        scan: Iterator[tuple[BlockKey, str]] | None = self._scan()
        pending: dict[BlockKey, tuple[Any, Any]] = {}
        finished = full = False
        last_commit = time.monotonic()
        try:
            self.documents = len(self.index.docstore)
        except Exception:  # noqa: BLE001 - progress lines only
            self.documents = None
        logger.info("collection %r: filling the document KV store in the background (%s blocks stored, %s "
                    "documents; a log line every %d%%)", self.name, "?" if self._blocks is None else self._blocks,
                    "?" if self.documents is None else self.documents, self.progress_step)
        try:
            while not self._stop.is_set():
                item = self._next_queued()
                if item is None and scan is not None:
                    if self._full(len(pending)):
                        full = True
                        logger.info("collection %r: the document KV store holds its disk budget; the background "
                                    "fill stops its document scan", self.name)
                        scan = None
                    else:
                        item = next(scan, None)
                        if item is None:
                            scan = None
                            finished = True
                if item is None:
                    self._commit(pending)
                    self._read_stats(force=False)  # idle: blocks written by searches and ingests count too
                    if full:
                        self.at_budget = True  # after the commit: what the scan stored is visible
                    if finished and not self.scan_done:
                        self.scan_done = True
                        self._read_stats()
                        logger.info("collection %r: document KV store full: every document's block is stored "
                                    "(%s blocks, %d encoded by this fill)", self.name,
                                    "?" if self._blocks is None else self._blocks, self.filled)
                    self._wake.wait(1.0)
                    self._wake.clear()
                    continue
                key, text = item
                if key in pending or self.store.contains(key):
                    continue
                while not self._stop.is_set() and not self.idle.wait_idle(0.5):
                    if pending and time.monotonic() - last_commit > self.commit_seconds:
                        self._commit(pending)
                        last_commit = time.monotonic()
                if self._stop.is_set():
                    break
                with self.lock:
                    ((k, kk, vv),) = self.reranker.encode_block_arrays([text])
                pending[k] = (kk, vv)
                if len(pending) >= self.commit_every or time.monotonic() - last_commit > self.commit_seconds:
                    self._commit(pending)
                    last_commit = time.monotonic()
            self._commit(pending)
        except Exception:  # noqa: BLE001 - a background task: log, never take the service down
            logger.exception("collection %r: the background fill of the document KV store stopped", self.name)

    def _commit(self, pending: dict[BlockKey, tuple[Any, Any]]) -> None:
        if not pending:
            return
        written = self.store.put_many(pending, admit=False)
        self.filled += int(written)
        pending.clear()
        self._read_stats(force=False)

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
from heedrank.seam import serving_of
from heedrank.textrules import is_int

if TYPE_CHECKING:  # type-only: no runtime edge to the protocols module, which re-exports this one's
    from heedrank.protocols import RerankResult
    from heedrank.types import Document, Query

logger = logging.getLogger(__name__)

__all__ = [
    "KV_DTYPES",
    "KV_FORMAT_VERSION",
    "BlockCachingReranker",
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
            if not is_int(value) or value < (0 if name == "layer" else 1):
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
        budget = serving_of(reranker).max_doc_tokens
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

"""The parts of an :class:`heedrank.index.store.Index` opened on first use, not at open: the
query encoder (:class:`LazyEncoder`, loaded when a dense search or an update first needs
it) and the document KV stores of its rerankers (:class:`BlockStores`, one
:class:`heedrank.index.kv.KVStore` per header fingerprint in the index directory's ``kv``
folder, closed with the index). Both open through :mod:`heedrank.index.opening`.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heedrank.index import opening

from heedrank.protocols import Encoder

if TYPE_CHECKING:
    from heedrank.blocks import KVHeader
    from heedrank.index.kv import KVStore


class LazyEncoder:
    """An index's query encoder, loaded on first :meth:`get` (thread-safe).

    Args:
        encoder: A ready encoder, or ``None`` to load one.
        embedder_dir: The model directory to load it from.
        params: The index's ``params.json`` content (the prefixes and runtime recorded
            under ``params["dense"]["embedder"]``).
    """

    def __init__(self, encoder: Encoder | None, embedder_dir: Path | None, params: Mapping[str, Any]) -> None:
        self._encoder = encoder
        self._embedder_dir = embedder_dir
        self._params = params
        self._lock = threading.Lock()

    @property
    def ready(self) -> bool:
        """Whether the encoder is loaded (or was given)."""
        return self._encoder is not None

    def get(self) -> Encoder:
        """The encoder, loading it the first time.

        Raises:
            ModelLoadError: the model cannot be loaded.
        """
        if self._encoder is None:
            with self._lock:
                if self._encoder is None:
                    self._encoder = opening.load_encoder(self._embedder_dir, self._params)
        return self._encoder


class BlockStores:
    """The open document KV stores of one directory, by header fingerprint.

    Args:
        path: The store's directory (``<index>/kv``).
        cache_bytes: RAM LRU of each store, bytes (``None``: the library default,
            :data:`heedrank.config.KV_CACHE_BUDGET`).
        kv_tiers: Disk budget, eviction and admission (:class:`heedrank.config.KVTiers`);
            ``None``: unbounded.
    """

    def __init__(self, path: Path, *, cache_bytes: int | None, kv_tiers: Any) -> None:
        self.path = path
        self.cache_bytes = cache_bytes
        self.kv_tiers = kv_tiers
        self._lock = threading.Lock()
        self._stores: dict[str, KVStore] = {}

    def get(self, header: KVHeader | Mapping[str, Any], *, create: bool = True) -> KVStore | None:
        """The store for blocks computed as ``header`` says, opened once; ``None`` when it
        does not exist and ``create`` is false.

        Raises:
            KVStoreMismatchError: the store was built for another header.
            KVStoreError: the store cannot be opened.
        """
        from heedrank.blocks import as_header

        want = as_header(header)
        key = want.fingerprint()
        with self._lock:
            if key not in self._stores:
                if not (self.path / "header.json").exists() and not create:
                    return None
                self._stores[key] = opening.open_kv_store(
                    self.path, want, cache_bytes=self.cache_bytes, kv_tiers=self.kv_tiers)
            return self._stores[key]

    def close(self) -> None:
        """Close every open store (a later :meth:`get` opens it again)."""
        with self._lock:
            for store in self._stores.values():
                store.close()
            self._stores.clear()

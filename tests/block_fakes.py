"""Fakes of the block contract (:mod:`heedrank.blocks`) shared by the store-upkeep and fill tests."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from heedrank.blocks import BlockKey, KVHeader, as_header
from heedrank.index.kv import KVStore
from heedrank.types import Document


class FakeCached:
    """Blocks keyed by the hash of the text, ``(2, 1, 1, 2)`` arrays."""

    def __init__(self, layer: int = 1) -> None:
        self.layer = layer
        self.encoded: list[str] = []

    def block_store_header(self) -> KVHeader:
        return KVHeader(model_hash="fake", prompt_template_version="t1", instruction_hash="i0", layer=self.layer,
                        kv_heads=1, head_dim=2, max_doc_tokens=8)

    def block_keys(self, texts: Sequence[str]) -> list[BlockKey]:
        return [BlockKey(hashlib.sha256(t.encode()).hexdigest()[:16]) for t in texts]

    def encode_block_arrays(self, texts: Sequence[str]) -> list[tuple[BlockKey, Any, Any]]:
        self.encoded += list(texts)
        arrays = [np.full((self.layer + 1, 1, 1, 2), len(t), dtype=np.float32) for t in texts]
        return [(k, a, -a) for k, a in zip(self.block_keys(texts), arrays)]

    def rerank(self, query: Any, candidates: Any, *, block_store: Any = None) -> Any:  # pragma: no cover
        raise NotImplementedError


class FakeIndex:
    """An index owning one store at ``<root>/kv`` (as :meth:`heedrank.index.store.Index.block_store`)."""

    def __init__(self, root: Any) -> None:
        self.path = root / "kv"
        self.store: KVStore | None = None

    def block_store(self, header: Any, *, create: bool = True) -> KVStore | None:
        if self.store is None:
            if not (self.path / "header.json").exists() and not create:
                return None
            self.store = KVStore.open_or_create(self.path, as_header(header), cache_bytes=0)
        return self.store


class Idle:
    """The request signal of a service with no request in flight."""

    @property
    def active(self) -> int:
        return 0

    def wait_idle(self, timeout: float | None = None) -> bool:
        return True


class DocIndex(FakeIndex):
    """:class:`FakeIndex` with a document store of ``docs``."""

    def __init__(self, root: Any, docs: Sequence[Document]) -> None:
        super().__init__(root)
        from heedrank.index.memory import InMemoryDocStore

        self.docstore = InMemoryDocStore(docs)

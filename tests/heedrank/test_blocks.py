"""The block contract of the core (heedrank.blocks): the typed header and its JSON form,
the header diff, the codecs behind its byte counts, and BlockSync keeping a real document KV
store in step with added and deleted documents (a fake cached reranker, no LM)."""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from heedrank.blocks import (
    KV_DTYPES,
    BlockCachingReranker,
    BlockKey,
    BlockStore,
    BlockSync,
    KVHeader,
    as_header,
    block_store_for,
    header_diff,
)
from heedrank.errors import KVStoreError, KVStoreMismatchError
from heedrank.index.kv import CODECS, KVStore
from heedrank.types import Document

SMOL = KVHeader(model_hash="m", prompt_template_version="t", instruction_hash="i", layer=15, kv_heads=3,
                head_dim=64, max_doc_tokens=96)


def test_the_header_is_a_record_with_a_json_form() -> None:
    fields = ["model_hash", "prompt_template_version", "instruction_hash", "layer", "kv_heads", "head_dim",
              "max_doc_tokens", "dtype", "adapter_hash", "format_version", "n_layers"]
    d = SMOL.to_dict()
    assert not isinstance(SMOL, Mapping) and list(d) == fields and d["format_version"] == 1 and d["n_layers"] == 16
    assert KVHeader.from_dict(d) == SMOL and as_header(d) == SMOL and KVHeader.from_dict(SMOL) is SMOL
    assert hash(SMOL) == hash(KVHeader.from_dict(d))
    with pytest.raises(KVStoreError, match="n_layers=3"):
        KVHeader.from_dict({**d, "n_layers": 3})


def test_a_header_with_unknown_fields_says_to_rebuild_the_store() -> None:
    with pytest.raises(KVStoreError, match="rebuild it with `heedrank index kv build`"):
        KVHeader.from_dict({**SMOL.to_dict(), "layers": [13, 15], "n_layers": 16})


def test_the_diff_names_what_differs() -> None:
    other = replace(SMOL, layer=3, dtype="int8")
    assert SMOL.diff(other) == ("dtype", "layer", "n_layers") and SMOL.diff(SMOL) == ()
    assert header_diff({"layer": 15}, other.to_dict()) == tuple(sorted(k for k in other.to_dict() if k != "adapter_hash"))


def test_byte_counts_come_from_the_codecs() -> None:
    assert set(CODECS) == set(KV_DTYPES)
    assert SMOL.entry_nbytes(96) == 1_179_648  # the module docstring's numbers at SmolLM2's shape
    assert replace(SMOL, dtype="int8").entry_nbytes(96) == 620_544


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


class Entries:
    def __init__(self, *rerankers: Any) -> None:
        self.items = [(r, threading.Lock()) for r in rerankers]

    def entries(self) -> list[tuple[Any, threading.Lock]]:
        return list(self.items)


DOCS = [Document("a", "apples"), Document("b", "pears"), Document("c", "apples")]


def test_block_sync_encodes_new_blocks_once_and_drops_deleted_ones(tmp_path) -> None:
    reranker, index = FakeCached(), FakeIndex(tmp_path)
    assert isinstance(reranker, BlockCachingReranker)
    sync = BlockSync(index, Entries(reranker))
    assert BlockSync(index, None).encode_new(DOCS) == 0 and index.store is None  # nothing built: nothing created
    assert sync.drop_deleted(DOCS) == 0 and index.store is None  # no store yet: none created to drop from
    assert sync.encode_new(DOCS) == 2 and reranker.encoded == ["apples", "pears"]  # a and c share a block
    assert sync.encode_new(DOCS) == 0 and len(reranker.encoded) == 2
    assert isinstance(index.store, BlockStore)
    assert sync.drop_deleted(DOCS[:1]) == 1 and len(index.store) == 1  # c's shared block goes too
    index.store.close()
    assert sync.after_delete(DOCS[1:2]) == 0  # a closed store: logged, the delete itself stands


def test_a_store_of_another_configuration_is_named_at_startup(tmp_path, caplog) -> None:
    index = FakeIndex(tmp_path)
    BlockSync(index, Entries(FakeCached(layer=1))).encode_new(DOCS)
    index.store.close()
    index.store = None
    layered = FakeCached(layer=2)

    def refuse(header: Any, *, create: bool = True) -> Any:
        return KVStore.open(index.path, as_header(header))

    index.block_store = refuse  # type: ignore[method-assign]
    with pytest.raises(KVStoreMismatchError) as ei:
        BlockSync(index, None).check_at_startup(layered, collection="c1")
    assert str(ei.value).startswith("collection 'c1': To read this store as built, run the reranker with --opt layer=1")
    assert "layer" in ei.value.fields

    def busy(header: Any, *, create: bool = True) -> Any:
        raise KVStoreError("another process writes it")

    index.block_store = busy  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING):
        assert BlockSync(index, None).check_at_startup(layered, collection="c1") is None
    assert "not opened at start-up" in caplog.text
    assert block_store_for(object(), index) is None  # not a cached reranker: no store


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


def test_the_fill_logs_every_tenth_and_when_full_and_describe_lists_no_files(tmp_path, caplog, monkeypatch) -> None:
    import time

    from heedrank.blocks import BlockFiller

    docs = [Document(f"d{i:02d}", f"text {i}") for i in range(40)]
    reranker, index = FakeCached(), DocIndex(tmp_path, docs)
    filler = BlockFiller(index, reranker, threading.Lock(), Idle(), name="c1")
    filler.commit_every = 4
    with caplog.at_level(logging.INFO, logger="heedrank.blocks"):
        filler.start()
        deadline = time.monotonic() + 20
        while not filler.scan_done and time.monotonic() < deadline:
            time.sleep(0.02)
        filler.stop()
    assert filler.scan_done and len(reranker.encoded) == 40
    lines = [r.getMessage() for r in caplog.records if "document KV store fill" in r.getMessage()]
    assert [int(m.split("fill ")[1].split("%")[0]) for m in lines] == list(range(10, 101, 10)), lines
    assert "(40 of 40 documents scanned; " in lines[-1]
    assert any("document KV store full: every document's block is stored (40 blocks" in r.getMessage()
               for r in caplog.records)

    def no_io(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("describe() touched the store")

    monkeypatch.setattr(index.store, "stats", no_io)
    info = filler.describe()
    assert info["blocks"] == 40 and info["live_bytes"] > 0 and info["filled"] == 40
    assert info["documents"] == 40 and info["scanned"] == 40 and info["scan_done"] and not info["filling"]


def _fill(filler: Any) -> dict[str, Any]:
    """``filler`` started and waited for until its scan is done or stopped at the budget; its ``describe()``."""
    import time

    filler.start()
    deadline = time.monotonic() + 20
    while not (filler.scan_done or filler.at_budget) and time.monotonic() < deadline:
        time.sleep(0.02)
    filler.stop()
    return filler.describe()


def test_scanned_counts_the_last_document_handed_to_the_fill_when_the_budget_stops_the_scan(tmp_path) -> None:
    """The scan counts a document when it hands its block to the fill: stopped at the disk budget
    right after encoding one, ``scanned`` counts it (it once lagged one behind)."""
    from heedrank.blocks import BlockFiller

    docs = [Document(f"d{i:02d}", f"text {i}") for i in range(20)]
    reranker, index = FakeCached(), DocIndex(tmp_path, docs)
    filler = BlockFiller(index, reranker, threading.Lock(), Idle(), name="c1")
    filler._full = lambda pending: len(reranker.encoded) >= 5  # type: ignore[method-assign]  # budget after 5 blocks
    info = _fill(filler)
    assert info["at_budget"] and not info["scan_done"]
    assert reranker.encoded == [d.text for d in docs[:5]]
    assert info["scanned"] == 5 and info["filled"] == info["blocks"] == 5 and info["documents"] == 20


def test_identical_texts_share_a_block_so_blocks_may_be_fewer_than_documents_scanned(tmp_path) -> None:
    """A finished scan has ``scanned == documents``; ``blocks`` is fewer when texts repeat."""
    from heedrank.blocks import BlockFiller

    docs = [Document(f"d{i:02d}", f"text {i % 7}") for i in range(10)]  # 3 texts repeat
    reranker, index = FakeCached(), DocIndex(tmp_path, docs)
    info = _fill(BlockFiller(index, reranker, threading.Lock(), Idle(), name="c1"))
    assert info["scan_done"] and info["documents"] == info["scanned"] == 10
    assert info["blocks"] == info["filled"] == 7 and len(reranker.encoded) == 7

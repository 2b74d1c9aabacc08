"""The block contract of the core (heedrank.blocks): the typed header and its JSON form,
the header diff, the codecs behind its byte counts, and BlockSync keeping a real document KV
store in step with added and deleted documents (a fake cached reranker, no LM)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import pytest

from block_fakes import FakeCached, FakeIndex  # tests/block_fakes.py
from heedrank.blocks import (
    KV_DTYPES,
    BlockCachingReranker,
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

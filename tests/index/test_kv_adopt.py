"""KVStore.adopt / adopt_parts: the driver's side of a distributed KV store build. A part
store's committed shards join the store in one manifest commit (linked, not copied); what a
writer left half-written is never adopted; blocks already stored are skipped; a crash
before the commit leaves the store and the part as they were."""

from __future__ import annotations

import os

import numpy as np
import pytest

from heedrank.errors import KVStoreError, KVStoreMismatchError
from heedrank.index.kv import maintenance as kvstore
from heedrank.index.kv import KVHeader, KVStore, build_missing

HEADER = KVHeader(model_hash="m" * 8, prompt_template_version="t1", instruction_hash="i" * 8, layer=1,
                  kv_heads=2, head_dim=4, max_doc_tokens=8)


def _arrays(d: str):
    n = int(d[1:])
    keys = np.full(HEADER.doc_shape(1 + n % HEADER.max_doc_tokens), n, dtype=np.float32)
    return keys, -keys


def _compute(ids):
    return {d: _arrays(d) for d in ids}


def _part(store: KVStore, name: str, ids, batch_size: int = 2):
    """A part store as an actor writes it: one committed shard per batch."""
    path = store.parts_dir() / name
    with KVStore.create(path, HEADER) as part:
        build_missing(part, ids, _compute, batch_size=batch_size)
    return path


def _check(store: KVStore, ids):
    assert sorted(store.keys()) == sorted(ids)
    for d in ids:
        keys, values = store.get(d)
        want, _ = _arrays(d)
        assert keys.shape == want.shape and np.all(keys == want) and np.all(values == -want)


def test_adopt_commits_a_part_once_and_removes_it(tmp_path):
    store = KVStore.create(tmp_path / "kv", HEADER)
    store.put_many(_compute(["d0"]))
    part = _part(store, "part-00000", ["d0", "d1", "d2", "d3", "d4"])  # d0 is stored already
    assert store.adopt(part, remove=False) == 4
    assert store.stats().shards == 1 + 3  # the part has [d0 d1] [d2 d3] [d4]; d0 is skipped, its shard adds d1
    _check(store, ["d0", "d1", "d2", "d3", "d4"])
    # a second adoption (a crash after the commit, before the part was removed) adds nothing
    assert store.adopt(part) == 0 and not part.exists()
    store.close()
    with KVStore.open(tmp_path / "kv", HEADER, readonly=True) as again:  # durable, and checksums verify
        _check(again, ["d0", "d1", "d2", "d3", "d4"])
        assert again.verify() == []


def test_half_written_and_corrupt_shards_are_not_adopted(tmp_path):
    store = KVStore.create(tmp_path / "kv", HEADER)
    part = _part(store, "part-00000", ["d1", "d2", "d3"])
    (part / "shard-000009.bin").write_bytes(b"\0" * 100)  # a writer killed mid-shard: not in its manifest
    (part / "shard-000009.idx.json").write_text('{"entries": [["d9", 0, 64, 1, 0]]}')
    with KVStore.open(part, HEADER, readonly=True) as p:
        loc = p.manifest.get("d3")
        bin_path = part / p.manifest.shards[loc.shard]["bin"]
    with open(bin_path, "r+b") as f:  # flip one byte of d3's payload
        f.seek(loc.offset)
        byte = f.read(1)
        f.seek(loc.offset)
        f.write(bytes([byte[0] ^ 0xFF]))
    assert store.adopt(part, verify=True) == 2
    _check(store, ["d1", "d2"])
    assert "d9" not in store and "d3" not in store


def test_crash_before_the_commit_changes_nothing(tmp_path, monkeypatch):
    store = KVStore.create(tmp_path / "kv", HEADER)
    part = _part(store, "part-00000", ["d1", "d2", "d3"])
    before = sorted(os.listdir(store.path))

    def full_disk(manifest):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store.manifest, "commit", full_disk)
    with pytest.raises(KVStoreError, match="disk full"):
        store.adopt(part)
    assert len(store) == 0 and sorted(os.listdir(store.path)) == before and part.exists()
    monkeypatch.undo()
    assert store.adopt(part) == 3
    _check(store, ["d1", "d2", "d3"])


def test_adopt_parts_skips_a_locked_part_and_drops_an_empty_one(tmp_path, caplog):
    store = KVStore.create(tmp_path / "kv", HEADER)
    _part(store, "part-00000", ["d1", "d2"])
    busy = _part(store, "part-00001", ["d3"])
    (store.parts_dir() / "part-00002").mkdir()  # its writer died before writing a header
    holder = KVStore.open(busy, HEADER)  # an actor still writing it
    try:
        assert store.adopt_parts() == 2
    finally:
        holder.close()
    assert "is not adopted now" in caplog.text
    assert sorted(p.name for p in store.parts_dir().iterdir()) == ["part-00001"]
    assert store.adopt_parts() == 1
    _check(store, ["d1", "d2", "d3"])


def test_a_part_for_another_header_is_refused(tmp_path):
    store = KVStore.create(tmp_path / "kv", HEADER)
    path = store.parts_dir() / "part-00000"
    other = KVHeader(model_hash="x" * 8, prompt_template_version="t1", instruction_hash="i" * 8, layer=1,
                     kv_heads=2, head_dim=4, max_doc_tokens=8)
    with KVStore.create(path, other):
        pass
    with pytest.raises(KVStoreMismatchError, match="model_hash"):
        store.adopt(path)
    assert path.exists() and len(store) == 0


def test_adopt_copies_where_hard_links_are_refused(tmp_path, monkeypatch):
    store = KVStore.create(tmp_path / "kv", HEADER)
    part = _part(store, "part-00000", ["d1", "d2"])

    def no_links(src, dst):
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(kvstore.os, "link", no_links)
    assert store.adopt(part) == 2
    _check(store, ["d1", "d2"])

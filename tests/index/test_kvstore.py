"""Document KV store: header checks, fp16/int8 codecs, checksums, truncation,
full disk, delete + compact, RAM LRU, threads, resumable builds, kill -9 mid-write."""

from __future__ import annotations

import errno
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from heedrank.index.kv import KVHeader, KVStore, build_missing
from heedrank.index.kv import manifest as kvm
from heedrank.index.kv.format import FORMAT_VERSION

from heedrank.config import KV_CACHE_BUDGET
from heedrank.errors import (
    IndexMismatchError,
    KVStoreError,
    KVStoreMismatchError,
    ValidationError,
)

# Deterministic arrays per doc id; shared with the kill -9 child process (exec'd there too).
GEN_SRC = '''
import zlib
import numpy as np

def doc_arrays(doc_id, L, H, D, max_t, tokens=None):
    seed = zlib.crc32(doc_id.encode())
    rng = np.random.default_rng(seed)
    T = tokens if tokens is not None else 1 + seed % max_t
    k = (rng.standard_normal((L, H, T, D)) * 3).astype(np.float16)
    v = rng.standard_normal((L, H, T, D)).astype(np.float16)
    return k, v
'''
_ns: dict = {}
exec(GEN_SRC, _ns)  # noqa: S102 - the same source runs in the kill -9 child
_doc_arrays = _ns["doc_arrays"]

H = KVHeader(
    model_hash="sha256:aa11", prompt_template_version="blockrank-v1", instruction_hash="sha256:ii22",
    layer=2, kv_heads=2, head_dim=8, max_doc_tokens=16,
)
H8 = KVHeader(**{**H.__dict__, "dtype": "int8"})


def arrays(doc_id: str, header: KVHeader = H, tokens: int | None = None):
    return _doc_arrays(doc_id, header.n_layers, header.kv_heads, header.head_dim, header.max_doc_tokens, tokens)


def items(ids, header: KVHeader = H, tokens: int | None = None):
    return {d: arrays(d, header, tokens) for d in ids}


def assert_exact(store: KVStore, ids) -> None:
    found, missing = store.get_many(ids)
    assert missing == []
    for d in ids:
        k, v = arrays(d, store.header)
        assert found[d][0].dtype == np.float32
        np.testing.assert_array_equal(found[d][0], k.astype(np.float32))
        np.testing.assert_array_equal(found[d][1], v.astype(np.float32))


def entries(path: Path, shard_bin: str) -> list[list]:
    return json.loads((path / shard_bin.replace(".bin", ".idx.json")).read_text())["entries"]


def committed_files(path: Path) -> set[str]:
    m = json.loads((path / "MANIFEST.json").read_text())
    return {"header.json", "MANIFEST.json", "LOCK"} | {s[k] for s in m["shards"] for k in ("bin", "idx")}


# ----------------------------------------------------------------------------- header


def test_header_mismatch_names_fields_and_rebuild_command(tmp_path):
    path = tmp_path / "idx" / "kv"
    KVStore.create(path, H).close()
    other = KVHeader(**{**H.__dict__, "layer": 5, "adapter_hash": "sha256:lora1"})
    with pytest.raises(KVStoreMismatchError) as ei:
        KVStore.open(path, other)
    err = ei.value
    assert err.fields == ("adapter_hash", "layer", "n_layers")
    msg = str(err)
    assert "layer: stored 2, expected 5" in msg
    assert "adapter_hash: stored None, expected 'sha256:lora1'" in msg
    assert f"heedrank index kv build --index {tmp_path / 'idx'}" in msg
    assert isinstance(err, IndexMismatchError) and isinstance(err, KVStoreError) and err.status_code == 409
    # the same header opens fine; dtype alone differing is also refused
    with KVStore.open(path, H) as s:
        assert len(s) == 0
    with pytest.raises(KVStoreMismatchError) as ei:
        KVStore.open(path, H8)
    assert ei.value.fields == ("dtype",)


def test_header_validation_and_json_round_trip(tmp_path):
    with pytest.raises(ValidationError):
        KVHeader(**{**H.__dict__, "dtype": "bfloat16"})
    with pytest.raises(ValidationError):
        KVHeader(**{**H.__dict__, "kv_heads": 0})
    d = H.to_dict()
    assert d["n_layers"] == 3 and d["format_version"] == FORMAT_VERSION and d["adapter_hash"] is None
    assert KVHeader.from_dict(d) == H
    assert H.fingerprint() != H8.fingerprint() and len(H.fingerprint()) == 64
    with pytest.raises(KVStoreError, match="does not exist|no document KV store"):
        KVStore.open(tmp_path / "nothing", H)


# ----------------------------------------------------------------------------- codecs


def test_fp16_round_trip_is_exact_and_survives_reopen(tmp_path):
    ids = [f"d{i}" for i in range(12)]
    with KVStore.create(tmp_path / "kv", H) as s:
        assert s.put_many(items(ids)) == 12
        assert_exact(s, ids)
        # float32 input is stored as fp16
        k32 = np.random.default_rng(1).standard_normal(H.doc_shape(7)).astype(np.float32)
        s.put_many({"f32": (k32, -k32)})
        k, v = s.get("f32")
        np.testing.assert_array_equal(k, k32.astype(np.float16).astype(np.float32))
        np.testing.assert_array_equal(v, -k32.astype(np.float16).astype(np.float32))
        assert not k.flags.writeable  # callers cannot corrupt the cached copy
        assert s.tokens("d3") == arrays("d3")[0].shape[2]
    with KVStore.open(tmp_path / "kv", H, readonly=True) as s:
        assert sorted(s.keys()) == sorted(ids + ["f32"])
        assert_exact(s, ids)
        with pytest.raises(KVStoreError, match="readonly"):
            s.put_many(items(["x"]))


def test_int8_round_trip_error_bound(tmp_path):
    rng = np.random.default_rng(0)
    L, Hh, T, D = H8.doc_shape(13)
    k = rng.standard_normal((L, Hh, T, D)).astype(np.float32) * rng.uniform(0.1, 20, size=(1, 1, 1, D)).astype(np.float32)
    k[0, 0, 3, 5] = 90.0  # an outlier channel
    v = rng.standard_normal((L, Hh, T, D)).astype(np.float32)
    v[1, 1, 2] = 0.0  # an all-zero token: scale 1, codes 0, exact
    with KVStore.create(tmp_path / "kv", H8) as s:
        s.put_many({"a": (k, v)})
        kk, vv = s.get("a")
    key_scale = np.abs(k).max(axis=2, keepdims=True) / 127  # per (layer, head, channel)
    val_scale = np.abs(v).max(axis=3, keepdims=True) / 127  # per (layer, head, token)
    val_scale[val_scale == 0] = 1
    err_k, err_v = np.abs(kk - k), np.abs(vv - v)
    assert (err_k <= key_scale / 2 * (1 + 1e-5) + 1e-7).all()
    assert (err_v <= val_scale / 2 * (1 + 1e-5) + 1e-7).all()
    assert err_k.max() > 0 and (vv[1, 1, 2] == 0).all()
    # relative error is small for a Gaussian channel: ~1% of the channel's max
    assert float(err_v.max()) < 0.03


def test_bytes_per_document_at_smollm2_shape(tmp_path):
    smol16 = KVHeader("sha256:smollm2", "blockrank-v1", "sha256:ins", layer=15, kv_heads=3, head_dim=64, max_doc_tokens=96)
    smol8 = KVHeader(**{**smol16.__dict__, "dtype": "int8"})
    assert smol16.entry_nbytes(96) == 16 * 2 * 3 * 96 * 64 * 2 == 1_179_648
    assert smol8.entry_nbytes(96) == 2 * 16 * 3 * 96 * 64 + 4 * 16 * 3 * (64 + 96) == 620_544
    for h, want in ((smol16, 1_179_648), (smol8, 620_544)):
        with KVStore.create(tmp_path / h.dtype, h) as s:
            s.put_many(items(["one"], h, tokens=96))
            shard = next((tmp_path / h.dtype).glob("shard-*.bin"))
            assert shard.stat().st_size == want  # already 64-byte aligned: no padding
            assert s.stats().live_bytes == want


def test_put_validation_writes_nothing(tmp_path):
    with KVStore.create(tmp_path / "kv", H) as s:
        k, v = arrays("a")
        with pytest.raises(ValidationError, match="shape"):
            s.put_many({"a": (k, v[:, :, :1])})
        with pytest.raises(ValidationError, match="max_doc_tokens"):
            s.put_many(items(["big"], tokens=17))
        bad = k.copy()
        bad[0, 0, 0, 0] = np.nan
        with pytest.raises(ValidationError, match="NaN"):
            s.put_many({"ok": arrays("ok"), "nan": (bad, v)})
        with pytest.raises(ValidationError, match="float16 range"):
            s.put_many({"huge": (np.full(k.shape, 1e6, np.float32), v)})
        assert len(s) == 0 and not list((tmp_path / "kv").glob("shard-*"))


# ----------------------------------------------------------------------------- integrity


def test_corrupt_byte_is_a_miss_with_warning_then_recomputed(tmp_path, caplog):
    path = tmp_path / "kv"
    ids = ["a", "b", "c"]
    with KVStore.create(path, H) as s:
        s.put_many(items(ids))
    shard = next(path.glob("shard-*.bin"))
    rows = {r[0]: r for r in entries(path, shard.name)}
    with open(shard, "r+b") as f:  # flip one byte in the middle of b's payload
        off = rows["b"][1] + rows["b"][2] // 2
        f.seek(off)
        byte = f.read(1)
        f.seek(off)
        f.write(bytes([byte[0] ^ 0x40]))
    with KVStore.open(path, H, cache_bytes=0) as s:
        assert s.contains("b")  # the checksum is checked on read
        with caplog.at_level("WARNING", logger=kvm.logger.name):
            found, missing = s.get_many(ids)
        assert missing == ["b"] and list(found) == ["a", "c"]
        assert any("'b'" in r.message and "crc32 mismatch" in r.message for r in caplog.records)
        assert not s.contains("b") and s.stats().dropped_entries == 1
        calls = []
        rep = build_missing(s, ids, lambda batch: calls.append(batch) or items(batch))
        assert calls == [["b"]] and (rep.skipped, rep.computed) == (2, 1)
        assert_exact(s, ids)
        # verify() finds a bad entry without serving it
        shard2 = max(path.glob("shard-*.bin"))
        with open(shard2, "r+b") as f:
            f.seek(10)
            f.write(b"\xff\xfe")
        assert s.verify() == ["b"]
        assert s.get("b") is None


def test_truncated_shard_is_a_miss_on_open(tmp_path, caplog):
    path = tmp_path / "kv"
    with KVStore.create(path, H) as s:
        s.put_many(items(["a", "b", "c"]))
    shard = next(path.glob("shard-*.bin"))
    rows = sorted(entries(path, shard.name), key=lambda r: r[1])
    first, second = rows[0][0], rows[1][0]
    os.truncate(shard, rows[1][1] + 10)  # cut inside the second entry
    with caplog.at_level("WARNING", logger=kvm.logger.name):
        s = KVStore.open(path, H)
    assert any("truncated" in r.message for r in caplog.records)
    found, missing = s.get_many([r[0] for r in rows])
    assert list(found) == [first] and missing == [second, rows[2][0]]
    assert_exact(s, [first])
    s.close()


def test_shard_truncated_after_mapping_is_a_miss_not_a_crash(tmp_path, caplog):
    path = tmp_path / "kv"
    with KVStore.create(path, H) as s:
        s.put_many(items(["a", "b", "c"]))
    shard = next(path.glob("shard-*.bin"))
    rows = sorted(entries(path, shard.name), key=lambda r: r[1])
    with KVStore.open(path, H, readonly=True, cache_bytes=0) as s:
        assert_exact(s, [rows[0][0]])  # the shard is now mapped
        os.truncate(shard, rows[1][1])
        with caplog.at_level("WARNING", logger=kvm.logger.name):
            found, missing = s.get_many([r[0] for r in rows])  # would SIGBUS without the size check
        assert list(found) == [rows[0][0]] and missing == [rows[1][0], rows[2][0]]
        assert any("truncated" in r.message for r in caplog.records)


@pytest.mark.parametrize("fail_on", ["bin", "idx.json", "MANIFEST"])
def test_disk_full_raises_and_commits_nothing(tmp_path, monkeypatch, fail_on):
    path = tmp_path / "kv"
    s = KVStore.create(path, H)
    s.put_many(items(["a", "b"]))
    real = kvm._write

    def full(fd, data):
        if fail_on in os.path.basename(os.readlink(f"/proc/self/fd/{fd}")):
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, data)

    monkeypatch.setattr(kvm, "_write", full)
    with pytest.raises(KVStoreError, match="disk full") as ei:
        s.put_many(items(["c", "d"]))
    assert ei.value.__cause__.errno == errno.ENOSPC
    assert set(os.listdir(path)) == committed_files(path)  # no partial shard or tmp file left
    assert not s.contains("c") and sorted(s.keys()) == ["a", "b"]
    if fail_on == "MANIFEST":  # a deletion is a manifest commit too
        with pytest.raises(KVStoreError, match="disk full"):
            s.delete(["a"])
        assert s.contains("a") and set(os.listdir(path)) == committed_files(path)
    monkeypatch.setattr(kvm, "_write", real)
    s.put_many(items(["c"]))  # works again once there is space
    s.close()
    with KVStore.open(path, H) as s2:
        assert sorted(s2.keys()) == ["a", "b", "c"]
        assert_exact(s2, ["a", "b", "c"])


def test_disk_full_during_compaction_leaves_the_store_unchanged(tmp_path, monkeypatch):
    path = tmp_path / "kv"
    ids = [f"d{i}" for i in range(12)]
    s = KVStore.create(path, H)
    for b in range(0, 12, 3):
        s.put_many(items(ids[b : b + 3]))
    s.delete(ids[:3])
    before = (set(os.listdir(path)), s.stats())
    real, calls = kvm._write, []

    def full(fd, data):
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        calls.append(name)
        if name.endswith(".bin") and len({c for c in calls if c.endswith(".bin")}) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")  # the second new shard
        real(fd, data)

    monkeypatch.setattr(kvm, "_write", full)
    with pytest.raises(KVStoreError, match="disk full"):
        s.compact(shard_max_bytes=H.entry_nbytes(16) * 3)
    monkeypatch.setattr(kvm, "_write", real)
    assert set(os.listdir(path)) == before[0] and s.stats().shards == before[1].shards == 4
    assert_exact(s, ids[3:])
    s.close()
    with KVStore.open(path, H) as s2:
        assert sorted(s2.keys()) == sorted(ids[3:])
        assert s2.compact().shards_after == 1
        assert_exact(s2, ids[3:])


def test_uncommitted_files_removed_and_single_writer(tmp_path):
    path = tmp_path / "kv"
    with KVStore.create(path, H) as s:
        s.put_many(items(["a"]))
        with pytest.raises(KVStoreError, match="open for writing"):
            KVStore.open(path, H)
        with KVStore.open(path, H, readonly=True) as reader:
            s.put_many(items(["b"]))
            assert not reader.contains("b")
            reader.refresh()
            assert_exact(reader, ["a", "b"])
    (path / "shard-000099.bin").write_bytes(b"partial")
    (path / ".MANIFEST.json.tmp-1-2").write_bytes(b"{")
    with KVStore.open(path, H, readonly=True) as r:  # readers never touch files they do not own
        assert (path / "shard-000099.bin").exists() and len(r) == 2
    with KVStore.open(path, H) as s:
        assert set(os.listdir(path)) == committed_files(path)
        assert_exact(s, ["a", "b"])


# ----------------------------------------------------------------------------- delete / compact


def test_delete_and_compact_reclaim_bytes(tmp_path):
    path = tmp_path / "kv"
    ids = [f"d{i}" for i in range(20)]
    with KVStore.create(path, H) as s:
        s.put_many(items(ids[:10]))
        s.put_many(items(ids[10:]))
        s.put_many(items(ids[:5]))  # re-put: the older copies become dead bytes
        gone = ids[5:15]
        assert s.delete(gone + ["never-stored"]) == 10
        keep = ids[:5] + ids[15:]
        before = s.stats()
        assert before.blocks == 10 and before.tombstones == 10 and before.shards == 3
        assert before.live_bytes == sum(H.entry_nbytes(arrays(d)[0].shape[2]) for d in keep)
        assert s.get_many(gone)[1] == gone
        rep = s.compact(shard_max_bytes=before.live_bytes // 2)
        after = s.stats()
        assert rep.shards_before == 3 and rep.shards_after == after.shards >= 2 and rep.blocks == 10
        assert rep.bytes_before == before.bytes_on_disk and rep.bytes_after == after.bytes_on_disk
        # every dead entry's bytes are back; what is left is live payload + padding + index files
        dead = sum(H.entry_nbytes(arrays(d)[0].shape[2]) for d in gone + ids[:5])
        assert before.bytes_on_disk - after.bytes_on_disk >= dead
        assert after.bytes_on_disk - after.live_bytes < 4096 and after.tombstones == 0
        assert set(os.listdir(path)) == committed_files(path)
        assert_exact(s, keep)
        s.put_many(items(["d7"]))  # a deleted id can come back
    with KVStore.open(path, H) as s:
        assert sorted(s.keys()) == sorted(keep + ["d7"])
        assert_exact(s, keep + ["d7"])
        assert s.get_many(gone)[1] == [d for d in gone if d != "d7"]


def test_delete_survives_reopen_before_compaction(tmp_path):
    path = tmp_path / "kv"
    with KVStore.create(path, H) as s:
        s.put_many(items(["a", "b"]))
        s.delete(["a"])
    with KVStore.open(path, H) as s:
        assert s.keys() == ["b"] and s.get("a") is None


# ----------------------------------------------------------------------------- caches


def test_lru_budget_and_counters(tmp_path, monkeypatch):
    T = 8
    doc_bytes = 2 * 4 * H.n_layers * H.kv_heads * T * H.head_dim  # decoded float32 keys + values
    with KVStore.create(tmp_path / "kv", H, cache_bytes=int(2.5 * doc_bytes)) as s:
        s.put_many(items(["a", "b", "c"], tokens=T))
        s.get_many(["a"])
        s.get_many(["a"])
        st = s.cache_stats()
        assert (st.hits, st.misses, st.entries, st.bytes) == (1, 1, 1, doc_bytes)
        s.get_many(["b", "c", "zzz"])
        st = s.cache_stats()
        assert (st.hits, st.misses, st.evictions, st.entries) == (1, 4, 1, 2)
        assert st.bytes == 2 * doc_bytes <= st.max_bytes
        found, _ = s.get_many(["a", "c"])  # a was evicted (least recent): read again from disk
        st = s.cache_stats()
        assert (st.hits, st.misses) == (2, 5) and len(found) == 2 and st.bytes <= st.max_bytes
        s.put_many(items(["c"], tokens=T))  # a rewrite invalidates the cached copy
        assert s.get_many(["c"])[0] and s.cache_stats().misses == 6
        assert s.stats().cache == s.cache_stats()
    monkeypatch.setenv(KV_CACHE_BUDGET.env, "12345")
    with KVStore.open(tmp_path / "kv", H) as s:
        assert s.cache_stats().max_bytes == 12345
    monkeypatch.setenv(KV_CACHE_BUDGET.env, "lots")
    with pytest.raises(ValidationError, match="HEEDRANK_KV_CACHE_BYTES"):
        KVStore.open(tmp_path / "kv", H)


# ----------------------------------------------------------------------------- threads


def test_thread_safety_smoke(tmp_path):
    path = tmp_path / "kv"
    base = [f"base{i}" for i in range(40)]
    new = [f"new{i}" for i in range(40)]
    s = KVStore.create(path, H, cache_bytes=6 * 2 * 4 * H.n_layers * H.kv_heads * 16 * H.head_dim)
    s.put_many(items(base))
    errors: list[BaseException] = []
    done = threading.Event()
    reads = [0]

    def reader(seed):
        rng = random.Random(seed)
        try:
            while not done.is_set() or reads[0] < 50:
                ask = rng.sample(base + new, 8)
                found, missing = s.get_many(ask)
                assert sorted(list(found) + missing) == sorted(ask) and list(found) == [d for d in ask if d in found]
                for d, (k, v) in found.items():
                    ek, ev = arrays(d)
                    assert np.array_equal(k, ek.astype(np.float32)) and np.array_equal(v, ev.astype(np.float32))
                reads[0] += 1
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    def writer():
        try:
            for b in range(0, 40, 8):
                s.put_many(items(new[b : b + 8]))
            s.delete(base[:20])
            s.compact(shard_max_bytes=20_000)
            s.put_many(items(base[:5]))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            done.set()

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(4)] + [threading.Thread(target=writer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert sorted(s.keys()) == sorted(base[:5] + base[20:] + new)
    assert_exact(s, s.keys())
    s.close()


# ----------------------------------------------------------------------------- builds


def test_resumable_build(tmp_path):
    ids = [f"doc{i:02d}" for i in range(10)]
    calls: list[list[str]] = []

    def compute(batch):
        calls.append(batch)
        if len(calls) == 3:
            raise RuntimeError("LM crashed")
        return items(batch)

    s = KVStore.create(tmp_path / "kv", H)
    with pytest.raises(RuntimeError, match="LM crashed"):
        build_missing(s, ids, compute, batch_size=4)
    assert sorted(s.keys()) == ids[:8]
    s.close()

    calls.clear()
    s = KVStore.open(tmp_path / "kv", H)
    rep = build_missing(s, ids + ids[:3], lambda b: calls.append(b) or items(b), batch_size=4, show_progress=True)
    assert calls == [ids[8:]]
    assert (rep.requested, rep.skipped, rep.computed, rep.shards) == (10, 8, 2, 1)
    assert s.stats().shards == 3  # each batch is its own shard

    with KVStore.create(tmp_path / "oneshot", H) as one:
        build_missing(one, ids, items, batch_size=100)
        a, _ = s.get_many(ids)
        b, _ = one.get_many(ids)
        assert list(a) == list(b) == ids
        for d in ids:
            np.testing.assert_array_equal(a[d][0], b[d][0])
            np.testing.assert_array_equal(a[d][1], b[d][1])
    with pytest.raises(KVStoreError, match="no keys/values"):
        build_missing(s, ["zz1", "zz2"], lambda b: items(b[:1]))
    s.close()


_CHILD = GEN_SRC + '''
import json, sys, time
from heedrank.index.kv import manifest as kvm
from heedrank.index.kv.format import FORMAT_VERSION
from heedrank.index.kv import store as kv
path, slow_from, prefix = sys.argv[1], int(sys.argv[2]), sys.argv[3]
h = kv.KVHeader(**json.loads(sys.argv[4]))
budget = int(sys.argv[5]) if len(sys.argv) > 5 else None
store = kv.KVStore.open_or_create(path, h, cache_bytes=0, disk_budget=budget)
real_reclaim = kv.maintenance.reclaim
def noisy_reclaim(*args, **kwargs):
    print("reclaim", flush=True)
    return real_reclaim(*args, **kwargs)
kv.maintenance.reclaim = noisy_reclaim
real, state = kvm._write, {"batch": 0}
def slow_write(fd, data):
    if state["batch"] >= slow_from:
        time.sleep(0.02)
    real(fd, data)
kvm._write = slow_write
for b in range(100000):
    state["batch"] = b
    ids = [f"{prefix}b{b}-{i}" for i in range(8)]
    print(f"writing {b}", flush=True)
    store.put_many({d: doc_arrays(d, h.n_layers, h.kv_heads, h.head_dim, h.max_doc_tokens) for d in ids})
    if budget is not None and b > 0:  # scramble the LRU order (evictions all over the shards); this batch last
        store.get_many([f"{prefix}b{(b * 7 + j) % b}-{j}" for j in range(6)] + ids)
    print(f"committed {b}", flush=True)
'''


def _spawn(path: Path, slow_from: int, prefix: str, budget: int | None = None) -> subprocess.Popen:
    hdr = {k: v for k, v in H.to_dict().items() if k != "n_layers"}
    extra = [] if budget is None else [str(budget)]
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(path), str(slow_from), prefix, json.dumps(hdr), *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _wait_line(proc: subprocess.Popen, want: str, lines: list[str]) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"child exited early: {proc.stderr.read()}")
        lines.append(line.strip())
        if line.strip() == want:
            return
    raise AssertionError(f"no {want!r} from the child")


def _check_after_kill(path: Path, committed: dict[str, int]) -> None:
    with KVStore.open(path, H, cache_bytes=0) as s:
        assert set(os.listdir(path)) == committed_files(path)  # uncommitted shard removed
        ids = s.keys()
        assert_exact(s, ids)  # everything stored reads back bit-exactly
        batches: dict[str, int] = {}
        for d in ids:
            batches[d.rsplit("-", 1)[0]] = batches.get(d.rsplit("-", 1)[0], 0) + 1
        assert set(batches.values()) <= {8}  # shards are all-or-nothing
        for prefix, last in committed.items():
            for b in range(last + 1):
                assert batches.get(f"{prefix}b{b}") == 8  # every acknowledged commit is there


def test_kill9_mid_write_leaves_only_committed_shards(tmp_path):
    path = tmp_path / "kv"
    # 1) deterministic: SIGKILL while shard 3 is half written (writes slowed down from batch 3)
    proc = _spawn(path, slow_from=3, prefix="s")
    lines: list[str] = []
    partial = path / "shard-000003.bin"
    try:
        _wait_line(proc, "writing 3", lines)
        deadline = time.monotonic() + 10
        while not (partial.exists() and partial.stat().st_size > 0) and time.monotonic() < deadline:
            time.sleep(0.002)
        proc.kill()  # the shard has >= 16 more slowed writes (>= 0.3 s) before it could commit
    finally:
        proc.wait(timeout=10)
    lines += [x.strip() for x in proc.stdout.read().splitlines()]
    assert "committed 2" in lines and "committed 3" not in lines
    manifest = json.loads((path / "MANIFEST.json").read_text())
    assert [m["id"] for m in manifest["shards"]] == [0, 1, 2]
    assert partial.exists() and 0 < partial.stat().st_size  # a half-written shard was left behind
    _check_after_kill(path, {"s": 2})
    with KVStore.open(path, H) as s:
        assert not partial.exists() and s.get_many(["sb3-0"])[1] == ["sb3-0"]

    # 2) random kill times at full speed, on the same store
    committed = {"s": 2}
    rng = random.Random(13)
    for r in range(3):
        proc = _spawn(path, slow_from=10**9, prefix=f"r{r}")
        lines = []
        try:
            _wait_line(proc, "committed 0", lines)
            time.sleep(rng.uniform(0.0, 0.15))
            proc.kill()
        finally:
            proc.wait(timeout=10)
        lines += [x.strip() for x in proc.stdout.read().splitlines()]
        done = [int(x.split()[1]) for x in lines if x.startswith("committed")]
        committed[f"r{r}"] = max(done)
        _check_after_kill(path, committed)


def _check_bounded_after_kill(path: Path, budget: int, acked: tuple[str, int] | None) -> None:
    """After a kill -9 of a bounded writer: what is committed is within the budget and reads
    back exactly, before any repair (readonly) and after the writable open's cleanup."""
    with KVStore.open(path, H, readonly=True, cache_bytes=0) as r:  # as the kill left it
        st = r.stats()
        assert st.live_bytes <= budget
        assert_exact(r, r.keys())  # crc32 and exact values of every live block
        if acked is not None:  # the last acknowledged batch is the newest: never a victim yet
            prefix, b = acked
            assert all(r.contains(f"{prefix}b{b}-{i}") for i in range(8))
    with KVStore.open(path, H, cache_bytes=0, disk_budget=budget) as s:
        assert set(os.listdir(path)) == committed_files(path)  # orphans of a put or a reclaim removed
        st = s.stats()
        assert st.live_bytes <= budget and st.evictions == 0
        shard_bytes = sum(p.stat().st_size for p in path.glob("shard-*.bin"))
        assert shard_bytes <= budget * 1.25  # dead bytes past the slack are reclaimed at open
        assert_exact(s, s.keys())


def test_kill9_during_eviction_and_reclaim_keeps_the_store_consistent(tmp_path):
    path = tmp_path / "kv"
    budget = 3 * 8 * H.entry_nbytes(H.max_doc_tokens)  # ~5 batches of 8 blocks: evicts from about the 6th
    rng = random.Random(29)
    written = reclaims = 0
    # 1) writes slowed from batch 5; the child reads earlier blocks after each put, so evictions
    #    leave shards partly live and a reclaim rewrites blocks: SIGKILL while it writes its shard
    # 2) slowed from the start, killed shortly after a reclaim starts; 3) full speed, random times
    runs = [(5, "reclaim"), (0, "reclaim"), (0, "reclaim"), (10**9, "committed 0"), (10**9, "committed 0")]
    for r, (slow_from, want) in enumerate(runs):
        proc = _spawn(path, slow_from=slow_from, prefix=f"k{r}", budget=budget)
        lines: list[str] = []
        try:
            _wait_line(proc, want, lines)
            if r == 0:
                deadline = time.monotonic() + 10
                partial: list[Path] = []
                while not partial and time.monotonic() < deadline:
                    partial = [p for p in path.glob("shard-*.bin")
                               if p.name not in committed_files(path) and p.stat().st_size > 0]
                    time.sleep(0.002)
                assert partial, "the reclaim wrote no shard"
            else:
                time.sleep(rng.uniform(0.0, 0.05 if want == "reclaim" else 0.2))
            proc.kill()
        finally:
            proc.wait(timeout=10)
        lines += [x.strip() for x in proc.stdout.read().splitlines()]
        if r == 0:
            # killed mid-rewrite: its shard is left uncommitted (>= 2 slowed writes, 40 ms, remained)
            assert lines[-1] == "reclaim" and all(p.exists() and p.name not in committed_files(path) for p in partial)
        done = [int(x.split()[1]) for x in lines if x.startswith("committed")]
        written += 8 * len(done)
        reclaims += lines.count("reclaim")
        _check_bounded_after_kill(path, budget, (f"k{r}", max(done)) if done else None)
    with KVStore.open(path, H, readonly=True) as s:
        assert written > len(s)  # blocks were evicted
    assert reclaims >= 3


def test_float16_output_option(tmp_path):
    with KVStore.create(tmp_path / "kv", H, out_dtype="float16") as s:
        s.put_many(items(["a"]))
        k, v = s.get("a")
        ek, ev = arrays("a")
        assert k.dtype == np.float16 and np.array_equal(k, ek) and np.array_equal(v, ev)
    with KVStore.create(tmp_path / "kv8", H8, out_dtype="float16") as s:
        s.put_many(items(["a"], H8))
        k, _ = s.get("a")
        assert k.dtype == np.float16 and np.abs(k.astype(np.float32) - ek.astype(np.float32)).max() < 0.2
    with pytest.raises(ValidationError, match="out_dtype"):
        KVStore.open(tmp_path / "kv", H, out_dtype="bfloat16")
    with KVStore.open(tmp_path / "kv", H) as s:  # the failed open above released the writer lock
        assert s.contains("a")

"""The document KV store as a bounded cache tier: disk budget, eviction (LRU / LFU / FIFO),
admission, reclaim of dead bytes, reopen, and arrays held by readers across evictions."""

from __future__ import annotations

import errno
import json
import logging
import os
import random
import threading
import zlib
from pathlib import Path

import numpy as np
import pytest
from heedrank.index.kv import KVHeader, KVStore
from heedrank.index.kv import budget as kvb
from heedrank.index.kv import manifest as kvm
from heedrank.index.kv.tiers import Admission, LFUPolicy, LRUPolicy, eviction_policy

from heedrank.errors import KVStoreError, UnknownNameError, ValidationError

H = KVHeader(
    model_hash="sha256:t1", prompt_template_version="blockrank-v1", instruction_hash="sha256:i1",
    layer=1, kv_heads=1, head_dim=8, max_doc_tokens=4,
)
H8 = KVHeader(**{**H.__dict__, "dtype": "int8"})
T = 2
BLOCK = H.entry_nbytes(T)  # 4 * 2 layers * 1 head * 2 tokens * 8 = 128 bytes, already 64-aligned
assert BLOCK == 128


def arrays(key: str, header: KVHeader = H, tokens: int = T) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(zlib.crc32(key.encode()))
    shape = header.doc_shape(tokens)
    return (rng.standard_normal(shape) * 2).astype(np.float16), rng.standard_normal(shape).astype(np.float16)


def items(keys, header: KVHeader = H, tokens: int | None = T):
    out = {}
    for k in keys:
        t = tokens if tokens is not None else 1 + zlib.crc32(k.encode()) % header.max_doc_tokens
        out[k] = arrays(k, header, t)
    return out


def assert_exact(store: KVStore, keys) -> None:
    found, missing = store.get_many(keys)
    assert missing == []
    for k in keys:
        t = store.tokens(k)
        ek, ev = arrays(k, store.header, t)
        np.testing.assert_array_equal(found[k][0], ek.astype(np.float32))
        np.testing.assert_array_equal(found[k][1], ev.astype(np.float32))


def bin_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.glob("shard-*.bin"))


def committed_files(path: Path) -> set[str]:
    m = json.loads((path / "MANIFEST.json").read_text())
    return {"header.json", "MANIFEST.json", "LOCK"} | {s[k] for s in m["shards"] for k in ("bin", "idx")}


def in_sync(store: KVStore) -> None:
    """The eviction bookkeeping mirrors the live index exactly."""
    policy = store.budget.policy
    assert policy is not None
    index = dict(store.manifest.items())
    assert set(policy.order()) == set(index)
    assert policy.total_bytes == sum(loc.length + (-loc.length % 64) for loc in index.values())


def read(store: KVStore, *keys: str) -> None:
    for k in keys:
        found, _ = store.get_many([k])
        assert k in found


# ----------------------------------------------------------------------------- policies


@pytest.mark.parametrize("eviction, victim", [("lru", "b"), ("lfu", "c"), ("fifo", "a")])
def test_each_policy_picks_its_victim(tmp_path, eviction, victim):
    with KVStore.create(tmp_path / "kv", H, disk_budget=4 * BLOCK, eviction=eviction) as s:
        for k in "abcd":
            s.put_many(items([k]))
        # counts: a 4, b 3, c 2, d 2 (c read before d); last reads: b, c, d, a
        read(s, "b", "b", "c", "d", "a", "a", "a")
        assert s.put_many(items(["e"])) == 1
        assert sorted(s.keys()) == sorted(set("abcde") - {victim})
        st = s.stats()
        assert (st.evictions, st.disk_budget, st.live_bytes) == (1, 4 * BLOCK, 4 * BLOCK)
        assert s.get(victim) is None
        assert_exact(s, s.keys())
        in_sync(s)


def test_lru_evicts_least_recently_read_and_ram_hits_count(tmp_path):
    # the RAM cache holds everything: the reads below are RAM hits, and still accesses
    with KVStore.create(tmp_path / "kv", H, disk_budget=4 * BLOCK, cache_bytes=1 << 20) as s:
        s.put_many(items(["a", "b", "c", "d"]))
        read(s, "a", "b", "c", "d")
        read(s, "a", "b")
        assert s.cache_stats().hits == 2
        s.put_many(items(["e"]))
        assert "c" not in s and "a" in s  # c: least recently read
        read(s, "d")
        s.put_many(items(["f", "g"]))  # order now a, b, e, d: two go
        assert sorted(s.keys()) == ["d", "e", "f", "g"]
        assert s.stats().evictions == 3
        assert s.get("a") is None  # the evicted block's RAM copy went with it


def test_lfu_evicts_least_often_read(tmp_path):
    with KVStore.create(tmp_path / "kv", H, disk_budget=3 * BLOCK, eviction="lfu") as s:
        s.put_many(items(["hot", "warm", "cold"]))
        read(s, *["hot"] * 5, *["warm"] * 2, "cold")
        s.put_many(items(["new1"]))  # cold (count 2) and warm (count 3) vs hot (6): cold goes
        assert sorted(s.keys()) == ["hot", "new1", "warm"]
        s.put_many(items(["new2"]))  # new1 (count 1) is now the least often accessed
        assert sorted(s.keys()) == ["hot", "new2", "warm"]
        s.put_many(items(["warm"]))  # a re-put is an access: warm 4
        assert s.budget.policy.access("warm")[1] == 4
        s.put_many(items(["new3", "new4"]))  # new2 (1) then ... the batch itself is never a victim
        assert sorted(s.keys()) == ["hot", "new3", "new4"]


def test_policy_units():
    p = LRUPolicy()
    p.seed([("a", 64), ("b", 128), ("c", 64)])
    assert p.total_bytes == 256 and p.order() == ["a", "b", "c"]
    p.touch(["a", "zzz"])  # unknown keys are ignored
    assert p.order() == ["b", "c", "a"] and p.access("a") == (4, 2)
    assert p.victims(100) == ["b"] and p.victims(129) == ["b", "c"]
    assert p.victims(129, protect={"b"}) == ["c", "a"] and p.victims(0) == [] and p.victims(10_000) == ["b", "c", "a"]
    p.put([("b", 64)])  # re-put: new size, an access
    assert p.total_bytes == 192 and p.order() == ["c", "a", "b"]
    p.remove(["c", "nope"])
    assert p.total_bytes == 128 and len(p) == 2
    q = LFUPolicy()
    q.put([("x", 1), ("y", 1), ("z", 1)])
    q.touch(["x", "x", "z"])
    assert q.order() == ["y", "z", "x"]
    q.remove(["z"])
    assert q.order() == ["y", "x"] and q._buckets.keys() == {1, 3}
    with pytest.raises(UnknownNameError, match="lru"):
        eviction_policy("random")
    a = Admission(after=3, window=2)
    assert [a.offer("k") for _ in range(3)] == [False, False, True] and a.offers("k") == 0
    with pytest.raises(ValidationError):
        Admission(after=0)


# ----------------------------------------------------------------------------- admission


def test_admission_writes_on_the_second_offer_only(tmp_path):
    with KVStore.create(tmp_path / "kv", H, disk_budget=3 * BLOCK, admit_after=2, admit_window=3) as s:
        s.put_many(items(["p1", "p2", "p3"]), admit=False)  # a prebuild: no admission
        read(s, "p1", "p2", "p3")
        assert s.put_many(items(["once"])) == 0  # a one-off candidate evicts nothing
        assert sorted(s.keys()) == ["p1", "p2", "p3"] and s.stats().not_admitted == 1
        assert s.put_many(items(["once", "x"])) == 1  # its second offer: written, evicts p1
        assert sorted(s.keys()) == ["once", "p2", "p3"]
        st = s.stats()
        assert (st.not_admitted, st.evictions) == (2, 1)
        assert s.put_many(items(["p2"])) == 1  # a stored block is rewritten without admission
        # the window holds the last 3 distinct keys offered: x falls out, so its count restarts
        for k in ("u", "v", "w"):
            assert s.put_many(items([k])) == 0
        assert s.put_many(items(["x"])) == 0 and s.put_many(items(["x"])) == 1
        assert s.budget.admission.offers("x") == 0 and len(s.budget.admission) <= 3
        # admit=False bypasses admission, never the budget
        assert s.put_many(items(["y1", "y2"]), admit=False) == 2
        assert s.stats().live_bytes <= 3 * BLOCK and {"y1", "y2"} <= set(s.keys())
        assert s.put_many(items(["y1"])) == 1  # stored: passes
        assert_exact(s, s.keys())


def test_admission_applies_only_where_a_write_would_evict(tmp_path):
    """A bounded store with free room writes a first offer (nothing is displaced, the computed
    block is kept); once full, a one-off block waits for its second offer."""
    with KVStore.create(tmp_path / "kv", H, disk_budget=3 * BLOCK, admit_after=2) as s:
        assert s.put_many(items(["a", "b"])) == 2 and s.stats().not_admitted == 0
        assert s.put_many(items(["c", "d"])) == 0  # two blocks do not fit in the room of one: the rule
        assert s.put_many(items(["c"])) == 1  # its second offer (and it fits)
        assert s.put_many(items(["e"])) == 0 and sorted(s.keys()) == ["a", "b", "c"]
        st = s.stats()
        assert (st.not_admitted, st.evictions) == (3, 0)
        assert s.put_many(items(["e"])) == 1 and st.live_bytes <= 3 * BLOCK  # second offer: evicts one
        assert s.stats().evictions == 1
        assert_exact(s, s.keys())


def test_admission_without_budget_and_validation_still_checked(tmp_path):
    with KVStore.create(tmp_path / "kv", H, admit_after=2) as s:
        assert s.put_many(items(["a"])) == 0 and s.put_many(items(["a"])) == 1
        k, v = arrays("b")
        with pytest.raises(ValidationError, match="shape"):
            s.put_many({"b": (k, v[:, :, :1])})  # checked even though it would not be admitted
        st = s.stats()
        assert st.disk_budget is None and st.evictions == 0 and st.not_admitted == 1


# ----------------------------------------------------------------------------- budget / disk bytes


@pytest.mark.parametrize("eviction", ["lru", "lfu", "fifo"])
def test_budget_and_disk_bound_hold_after_many_puts(tmp_path, eviction):
    path = tmp_path / "kv"
    budget, slack = 1500, 0.25  # not a multiple of a block
    rng = random.Random(7)
    written: set[str] = set()
    with KVStore.create(path, H, disk_budget=budget, eviction=eviction, cache_bytes=0, compact_slack=slack) as s:
        for i in range(80):
            batch = [f"k{rng.randrange(60)}" for _ in range(rng.randint(1, 5))]
            s.put_many(items(batch, tokens=None))  # T varies: 64..256 bytes per block
            written.update(batch)
            s.get_many(rng.sample(sorted(written), min(4, len(written))))
            if rng.random() < 0.1:
                s.delete([f"k{rng.randrange(60)}"])
            st = s.stats()
            assert st.live_bytes <= budget
            assert bin_bytes(path) <= budget * (1 + slack)  # shard files: live + dead
            assert st.shards <= 40
            assert st.tombstones <= 60
        in_sync(s)
        assert set(os.listdir(path)) == committed_files(path)
        assert_exact(s, s.keys())
        st = s.stats()
        assert st.evictions > 30 and st.blocks >= 5
        # bytes of the whole directory: the shards plus index files, manifest and header
        assert st.bytes_on_disk <= budget * (1 + slack) + 100 * (st.blocks + st.tombstones) + 4096
        keys = sorted(s.keys())
    with KVStore.open(path, H, disk_budget=budget, eviction=eviction) as s:
        assert sorted(s.keys()) == keys
        assert_exact(s, keys)


def test_reclaim_rewrites_only_the_deadest_shards(tmp_path):
    path = tmp_path / "kv"
    budget = 8 * BLOCK
    with KVStore.create(path, H, disk_budget=budget, compact_slack=0.25, eviction="fifo") as s:
        s.put_many(items([f"old{i}" for i in range(4)]))  # shard 0
        s.put_many(items([f"mid{i}" for i in range(4)]))  # shard 1
        s.put_many(items(["n0", "n1"]))  # evicts old0, old1: 256 dead bytes, not above the slack (256)
        assert [x["id"] for x in json.loads((path / "MANIFEST.json").read_text())["shards"]] == [0, 1, 2]
        # evicts old2: 384 dead bytes > 0.25 * 1024: the reclaim rewrites shard 0 only (3/4 dead)
        s.put_many(items(["n2"]))
        m = json.loads((path / "MANIFEST.json").read_text())
        ids = [x["id"] for x in m["shards"]]
        assert ids == [1, 2, 3, 4]  # shard 0's live block (old3) moved to a new shard 4
        assert m["tombstones"] == {}  # old0..old2 were only in shard 0
        assert bin_bytes(path) == s.stats().live_bytes == budget
        assert sorted(s.keys()) == sorted(["old3"] + [f"mid{i}" for i in range(4)] + ["n0", "n1", "n2"])
        assert set(os.listdir(path)) == committed_files(path)
        assert_exact(s, s.keys())
        in_sync(s)
        assert s.manifest.dead_bytes_by_shard() == {sid: 0 for sid in ids}


def test_put_larger_than_the_budget_writes_what_fits_in_order(tmp_path, caplog):
    with KVStore.create(tmp_path / "kv", H, disk_budget=3 * BLOCK + 10) as s:
        s.put_many(items(["z"]))
        with caplog.at_level(logging.WARNING, logger=kvb.logger.name):
            n = s.put_many(items(["a", "b", "c", "d", "e"]))
        assert n == 3 and sorted(s.keys()) == ["a", "b", "c"]
        assert any("exceeds the disk budget" in r.message for r in caplog.records)
        st = s.stats()
        assert (st.over_budget, st.evictions, st.live_bytes) == (2, 1, 3 * BLOCK)
        # a single block larger than the whole budget is never written, and never raises
    with KVStore.create(tmp_path / "tiny", H, disk_budget=BLOCK - 1) as s:
        assert s.put_many(items(["a"])) == 0 and len(s) == 0 and s.stats().over_budget == 1
        with pytest.raises(ValidationError, match="disk_budget"):
            KVStore.create(tmp_path / "zero", H, disk_budget=0)


def test_failed_eviction_commit_evicts_nothing(tmp_path, monkeypatch):
    path = tmp_path / "kv"
    s = KVStore.create(path, H, disk_budget=2 * BLOCK)
    s.put_many(items(["a", "b"]))
    real = kvm._write

    def full(fd, data):
        if "MANIFEST" in os.path.basename(os.readlink(f"/proc/self/fd/{fd}")):
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, data)

    monkeypatch.setattr(kvm, "_write", full)
    with pytest.raises(KVStoreError, match="disk full"):
        s.put_many(items(["c"]))
    monkeypatch.setattr(kvm, "_write", real)
    assert sorted(s.keys()) == ["a", "b"] and s.stats().evictions == 0
    assert set(os.listdir(path)) == committed_files(path)
    in_sync(s)
    assert s.put_many(items(["c"])) == 1 and sorted(s.keys()) == ["b", "c"]
    s.close()
    with KVStore.open(path, H) as s2:
        assert sorted(s2.keys()) == ["b", "c"]
        assert_exact(s2, ["b", "c"])


def test_delete_with_a_budget_reclaims_dead_bytes(tmp_path):
    path = tmp_path / "kv"
    with KVStore.create(path, H, disk_budget=8 * BLOCK) as s:
        s.put_many(items([f"d{i}" for i in range(8)]))
        s.delete(["d0"])  # 128 dead bytes: within the slack (256)
        assert bin_bytes(path) == 8 * BLOCK and s.stats().tombstones == 1
        s.delete(["d1", "d2"])  # 384 dead: the shard is rewritten
        assert bin_bytes(path) == 5 * BLOCK and s.stats().tombstones == 0
        assert_exact(s, [f"d{i}" for i in range(3, 8)])


def test_adopt_into_a_bounded_store_keeps_the_budget(tmp_path):
    path = tmp_path / "kv"
    part = tmp_path / "part"
    with KVStore.create(part, H) as p:
        p.put_many(items([f"p{i}" for i in range(4)]))
    with KVStore.create(path, H, disk_budget=3 * BLOCK) as s:
        s.put_many(items(["mine"]))
        assert s.adopt(part) == 4
        assert s.stats().live_bytes <= 3 * BLOCK and "mine" not in s
        assert sorted(s.keys()) == ["p1", "p2", "p3"]
        in_sync(s)


# ----------------------------------------------------------------------------- reopen


def test_reopen_seeds_order_from_shards_and_keeps_the_budget(tmp_path):
    path = tmp_path / "kv"
    with KVStore.create(path, H, disk_budget=6 * BLOCK) as s:
        s.put_many(items(["a", "b"]))  # shard 0
        s.put_many(items(["c", "d"]))  # shard 1
        s.put_many(items(["e", "f"]))  # shard 2
        read(s, "a", "b", "a")  # most recent and most frequent now: not remembered across a reopen
    with KVStore.open(path, H, disk_budget=6 * BLOCK, eviction="lru") as s:
        assert s.budget.policy.order() == ["a", "b", "c", "d", "e", "f"]
        assert all(s.budget.policy.access(k)[1] == 1 for k in "abcdef")
        s.put_many(items(["g"]))
        assert "a" not in s and "b" in s  # the oldest shard's first block goes first
        read(s, "b")
        s.put_many(items(["h"]))
        assert "c" not in s and "b" in s
    # a smaller budget at open evicts down to it (oldest shards first) and reclaims
    with KVStore.open(path, H, disk_budget=3 * BLOCK) as s:
        st = s.stats()
        assert st.evictions == 3 and st.live_bytes == 3 * BLOCK
        assert bin_bytes(path) <= 3 * BLOCK * 1.25
        kept = sorted(s.keys())
        assert_exact(s, kept)
    # readonly: the budget is reported, nothing is evicted or tracked
    with KVStore.open(path, H, readonly=True, disk_budget=BLOCK) as r:
        assert sorted(r.keys()) == kept and r.stats().disk_budget == BLOCK and r.budget.policy is None
    # unbounded again (the default): nothing is evicted
    with KVStore.open(path, H) as s:
        assert s.put_many(items(["x", "y", "z", "w"])) == 4 and len(s) == 7 and s.stats().disk_budget is None


def test_bad_keywords_release_the_lock(tmp_path):
    path = tmp_path / "kv"
    KVStore.create(path, H).close()
    with pytest.raises(UnknownNameError, match="eviction policy"):
        KVStore.open(path, H, disk_budget=BLOCK, eviction="mru")
    with pytest.raises(ValidationError, match="admit_after"):
        KVStore.open(path, H, admit_after=0)
    with pytest.raises(ValidationError, match="admit_window"):
        KVStore.open(path, H, admit_window=0)
    with pytest.raises(ValidationError, match="compact_slack"):
        KVStore.open(path, H, disk_budget=BLOCK, compact_slack=-1)
    with KVStore.open_or_create(path, H, disk_budget=BLOCK, eviction="fifo") as s:
        assert s.stats().disk_budget == BLOCK and s.eviction == "fifo"


# ----------------------------------------------------------------------------- readers


def _no_memmap_base(a: np.ndarray) -> bool:
    base = a
    while base is not None:
        if isinstance(base, np.memmap):
            return False
        base = getattr(base, "base", None)
        if not isinstance(base, np.ndarray):
            return True
    return True


@pytest.mark.parametrize("header, out_dtype", [(H, "float32"), (H, "float16"), (H8, "float32")])
def test_held_arrays_survive_eviction_and_compaction(tmp_path, header, out_dtype):
    path = tmp_path / "kv"
    block = header.entry_nbytes(T) + (-header.entry_nbytes(T) % 64)
    originals = [f"o{i}" for i in range(6)]
    s = KVStore.create(path, header, disk_budget=6 * block, cache_bytes=0, out_dtype=out_dtype)
    s.put_many(items(originals, header))
    held, _ = s.get_many(originals)
    expected = {k: (kk.copy(), vv.copy()) for k, (kk, vv) in held.items()}
    first_shard = path / "shard-000000.bin"
    assert first_shard.exists() and s.manifest._maps  # the shard is mapped by the reads
    maps = list(s.manifest._maps.values())
    for k, (kk, vv) in held.items():
        assert type(kk) is np.ndarray and type(vv) is np.ndarray
        assert _no_memmap_base(kk) and _no_memmap_base(vv)
        assert not any(np.shares_memory(kk, m) or np.shares_memory(vv, m) for m in maps)
    for i in range(4):  # evict every original; the dead bytes force reclaims
        s.put_many(items([f"n{i}-{j}" for j in range(3)], header))
    assert not any(k in s for k in originals) and s.stats().evictions >= 6
    assert not first_shard.exists()  # compacted away and unlinked
    s.close()  # the store lets go of every mapping
    for k in originals:
        np.testing.assert_array_equal(held[k][0], expected[k][0])
        np.testing.assert_array_equal(held[k][1], expected[k][1])
        assert held[k][0].dtype == np.dtype(out_dtype)
    ek, _ = arrays("o0", header)
    if header.dtype == "float16":
        np.testing.assert_array_equal(held["o0"][0], ek.astype(out_dtype))


def test_readers_during_evictions_get_exact_blocks_or_misses(tmp_path):
    keys = [f"r{i}" for i in range(30)]
    s = KVStore.create(tmp_path / "kv", H, disk_budget=10 * BLOCK, cache_bytes=4 * 2 * 4 * BLOCK)
    s.put_many(items(keys[:10]))
    errors: list[BaseException] = []
    done = threading.Event()

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        try:
            while not done.is_set():
                ask = rng.sample(keys, 5)
                found, missing = s.get_many(ask)
                assert sorted(list(found) + missing) == sorted(ask)
                for k, (kk, vv) in found.items():
                    ek, ev = arrays(k)
                    assert np.array_equal(kk, ek.astype(np.float32)) and np.array_equal(vv, ev.astype(np.float32))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    try:
        rng = random.Random(1)
        for _ in range(25):
            s.put_many(items(rng.sample(keys, 3)))
            assert s.stats().live_bytes <= 10 * BLOCK
    finally:
        done.set()
        for t in threads:
            t.join(timeout=30)
    assert not errors, errors
    in_sync(s)
    assert_exact(s, s.keys())
    s.close()

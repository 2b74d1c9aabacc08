"""The hook for a distributed document KV store build (``index kv build --engine ray``, not
wired yet): shards of document ids, each computed and stored into its own store, resumably.
No Ray needed: the hook is what a Ray task would run per shard."""

from __future__ import annotations

import numpy as np
import pytest

from heedrank.errors import ValidationError
from heedrank.eval.distributed import build_kv_shard, kv_shards
from heedrank.index.kv import KVHeader, KVStore

HEADER = KVHeader(model_hash="m" * 8, prompt_template_version="t1", instruction_hash="i" * 8, layer=1,
                  kv_heads=2, head_dim=4, max_doc_tokens=8)


def _compute(calls):
    def compute(ids):
        calls.append(list(ids))
        out = {}
        for d in ids:
            t = 1 + int(d[1:]) % HEADER.max_doc_tokens
            keys = np.full(HEADER.doc_shape(t), int(d[1:]), dtype=np.float32)
            out[d] = (keys, -keys)
        return out

    return compute


def test_kv_shards_split_evenly_and_drop_duplicates():
    ids = [f"d{i}" for i in range(10)] + ["d3"]
    shards = kv_shards(ids, 3)
    assert [len(s) for s in shards] == [4, 3, 3] and sum(shards, []) == ids[:10]
    assert kv_shards(["a"], 3) == [["a"], [], []]
    with pytest.raises(ValidationError):
        kv_shards(ids, 0)


def test_build_kv_shard_is_resumable_per_shard(tmp_path):
    ids = [f"d{i}" for i in range(7)]
    calls = []
    reports = [build_kv_shard(tmp_path / f"part-{i:05d}", HEADER, shard, _compute(calls), batch_size=2)
               for i, shard in enumerate(kv_shards(ids, 2))]
    assert [r["computed"] for r in reports] == [4, 3] and [r["shards"] for r in reports] == [2, 2]
    with KVStore.open(tmp_path / "part-00001", HEADER, readonly=True) as store:
        assert sorted(store.doc_ids()) == ["d4", "d5", "d6"]
        keys, values = store.get("d5")
        assert keys.shape == HEADER.doc_shape(6) and np.all(keys == 5) and np.all(values == -5)
    calls.clear()
    again = build_kv_shard(tmp_path / "part-00000", HEADER, ids[:4], _compute(calls))
    assert (again["skipped"], again["computed"], calls) == (4, 0, [])

"""The parts of a distributed document KV store build (``index kv build --engine ray``):
:func:`heedrank.engine.ray.split_parts` splits the block keys, :func:`heedrank.index.kv.build_part`
computes and stores one part into its own store, resumably. No Ray needed: ``build_part`` is
what a Ray actor runs per part."""

from __future__ import annotations

import numpy as np
import pytest

from heedrank.engine.ray import split_parts
from heedrank.errors import ValidationError
from heedrank.index.kv import KVHeader, KVStore, build_part

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


def test_split_parts_evenly_and_drop_duplicates():
    ids = [f"d{i}" for i in range(10)] + ["d3"]
    shards = split_parts(ids, 3)
    assert [len(s) for s in shards] == [4, 3, 3] and sum(shards, []) == ids[:10]
    assert split_parts(["a"], 3) == [["a"], [], []]
    with pytest.raises(ValidationError):
        split_parts(ids, 0)


def test_build_part_is_resumable_per_part(tmp_path):
    ids = [f"d{i}" for i in range(7)]
    calls = []
    reports = [build_part(tmp_path / f"part-{i:05d}", HEADER, shard, _compute(calls), batch_size=2)
               for i, shard in enumerate(split_parts(ids, 2))]
    assert [r["computed"] for r in reports] == [4, 3] and [r["shards"] for r in reports] == [2, 2]
    with KVStore.open(tmp_path / "part-00001", HEADER, readonly=True) as store:
        assert sorted(store.keys()) == ["d4", "d5", "d6"]
        keys, values = store.get("d5")
        assert keys.shape == HEADER.doc_shape(6) and np.all(keys == 5) and np.all(values == -5)
    calls.clear()
    again = build_part(tmp_path / "part-00000", HEADER, ids[:4], _compute(calls))
    assert (again["skipped"], again["computed"], calls) == (4, 0, [])

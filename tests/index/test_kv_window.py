"""The window store layout (issue #23): keys at the read layers and at ``m..l*-1``, values at
``m..l*-1`` only (the query pass attends to the candidates from layer ``m`` up).

The header's ``value_layers`` stays out of a full store's ``header.json``; the codecs
(float16, int8, int4) round-trip the keys and the values of a window block within their
bounds and at the documented sizes; the full store's durability tests (checksums,
truncation, full disk, kill -9 mid-write) run unchanged on a window header (they are
parametrised in ``test_kv_probe``); and a full
store reads as a window store (:class:`LayerView`), read-only.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import test_kvstore as base
from heedrank.index.kv import KVHeader, KVStore, LayerView
from heedrank.index.kv.codec import codec_for

from heedrank.errors import KVStoreError, KVStoreMismatchError, ValidationError

HW = KVHeader(**{**base.H.__dict__, "layers": (0, 1, 2), "value_layers": (1,)})
"""Keys of layers 0..2, values of layer 1 (attend = 1, read layers 0 and 2)."""


def window_arrays(doc_id: str, header: KVHeader = HW, tokens: int | None = None):
    """A window block ``(keys (3, ...), values (1, ...))`` of :data:`HW`'s shape."""
    k, v = base._doc_arrays(doc_id, HW.n_layers, HW.kv_heads, HW.head_dim, HW.max_doc_tokens, tokens)
    return k, v[: HW.n_value_layers]


def window_exact(store, ids) -> None:
    found, missing = store.get_many(ids)
    assert missing == []
    for d in ids:
        k, v = window_arrays(d)
        assert found[d][0].shape == k.shape and found[d][1].shape == v.shape == (1, HW.kv_heads, k.shape[2], HW.head_dim)
        np.testing.assert_array_equal(found[d][0], k.astype(np.float32))
        np.testing.assert_array_equal(found[d][1], v.astype(np.float32))


def test_window_header_json_and_layout() -> None:
    d = HW.to_dict()
    assert d["value_layers"] == [1] and d["layers"] == [0, 1, 2] and "keys_only" not in d
    assert KVHeader.from_dict(json.loads(json.dumps(d))) == HW
    assert "value_layers" not in base.H.to_dict() and HW.fingerprint() != base.H.fingerprint()
    assert (HW.layout, base.H.layout, KVHeader(**{**HW.__dict__, "value_layers": None, "keys_only": True}).layout) == (
        "window", "full", "probe")
    assert HW.stored_value_layers == (1,) and base.H.stored_value_layers == (0, 1, 2)


@pytest.mark.parametrize("dtype", ["float16", "int8", "int4"])
def test_window_codecs_round_trip_within_their_bound(dtype) -> None:
    codec = codec_for(KVHeader(**{**HW.__dict__, "dtype": dtype}))
    k, v = (a.astype(np.float32) for a in window_arrays("doc", tokens=11))
    T, parts = codec.encode("doc", k, v)
    buf = np.concatenate([np.ascontiguousarray(p).reshape(-1).view(np.uint8) for p in parts])
    assert T == 11 and buf.size == codec.nbytes(11)
    gk, gv = codec.decode(buf, 11)
    assert gk.shape == k.shape and gv.shape == v.shape
    if dtype == "float16":
        np.testing.assert_array_equal(gk, k)
        np.testing.assert_array_equal(gv, v)
        return
    if dtype == "int8":  # symmetric: keys per channel, values per token
        ks, vs = np.abs(k).max(axis=2, keepdims=True) / 127, np.abs(v).max(axis=3, keepdims=True) / 127
    else:  # asymmetric 4-bit: keys per channel, values per token
        ks = (k.max(axis=2, keepdims=True) - k.min(axis=2, keepdims=True)) / 15
        vs = (v.max(axis=3, keepdims=True) - v.min(axis=3, keepdims=True)) / 15
    assert (np.abs(gk - k) <= ks / 2 + 1e-5).all() and (np.abs(gv - v) <= vs / 2 + 1e-5).all()
    assert np.abs(gv - v).max() > 0  # lossy: a test that could not fail would prove nothing
    with pytest.raises(ValidationError, match="values"):
        codec.encode("doc", k, None)
    with pytest.raises(ValidationError, match="values"):
        codec.encode("doc", k, np.concatenate([v, v]))


def test_bytes_per_block_at_the_smollm2_window_shape() -> None:
    """Keys of layers 7, 8 and 9 and values of layer 8 (attend = 8) at 132 tokens."""
    h = KVHeader("m", "t", "i", layer=9, kv_heads=3, head_dim=64, max_doc_tokens=132, layers=(7, 8, 9), value_layers=(8,))
    sizes = {dt: codec_for(KVHeader(**{**h.__dict__, "dtype": dt})).nbytes(132) for dt in ("float16", "int8", "int4")}
    assert sizes == {"float16": 4 * 50_688, "int8": 4 * 25_344 + 4 * 3 * (3 * 64 + 132), "int4": 3 * 14_208 + 15_840}
    full = KVHeader("m", "t", "i", layer=15, kv_heads=3, head_dim=64, max_doc_tokens=132)
    assert codec_for(full).nbytes(132) == 1_622_016
    # the int8 full layout is the one stores were written with before window stores existed
    assert codec_for(KVHeader(**{**full.__dict__, "dtype": "int8"})).nbytes(132) == 2 * 16 * 3 * 132 * 64 + 4 * 16 * 3 * (64 + 132)


def test_window_store_round_trip_and_refusals(tmp_path) -> None:
    with KVStore.create(tmp_path / "window", HW) as s:
        s.put_many({d: window_arrays(d) for d in ("a", "b")})
        window_exact(s, ["a", "b"])
        with pytest.raises(ValidationError, match="values"):
            s.put_many({"c": base.arrays("c")})  # a full block: three value layers
    with pytest.raises(KVStoreMismatchError):
        KVStore.open(tmp_path / "window", base.H)


def test_a_full_store_reads_as_a_window_store(tmp_path) -> None:
    with KVStore.create(tmp_path / "kv", base.H) as full:
        full.put_many(base.items(["a", "b"]))
    full = KVStore.open(tmp_path / "kv", base.H, readonly=True)
    view = LayerView(full, KVHeader(**{**HW.__dict__, "layers": (0, 2), "value_layers": (2,), "dtype": "int4"}))
    found, missing = view.get_many(["a", "zz"])
    assert missing == ["zz"]
    k, v = base.arrays("a")
    np.testing.assert_array_equal(found["a"][0], k[[0, 2]].astype(np.float32))
    np.testing.assert_array_equal(found["a"][1], v[[2]].astype(np.float32))
    with pytest.raises(KVStoreError, match="window store"):
        view.put_many({"c": window_arrays("c")})
    view.close()


def test_an_index_keeps_its_window_store_beside_the_full_one(tmp_path) -> None:
    from heedrank.index.store import Index
    from test_kv_probe import index_with_full_store

    ix = Index.open(index_with_full_store(tmp_path))
    try:
        view = ix.block_store(HW)
        assert isinstance(view, LayerView) and view.get("a")[1].shape[0] == 1
        built = ix.block_store(KVHeader(**{**HW.__dict__, "dtype": "int8"}), full_fallback=False)
        assert isinstance(built, KVStore) and built.path == tmp_path / "ix" / "window"
        assert Index.store_dir(HW) == "window"
    finally:
        ix.close()

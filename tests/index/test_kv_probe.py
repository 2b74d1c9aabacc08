"""The probe store layout (issue #23): keys of the scoring layers only, no values.

The header's two new fields stay out of a full store's ``header.json`` (old stores keep
their fingerprint); the keys-only codecs (float16, int8, int4) round-trip within their
bounds; and the durability guarantees of the full store (checksums, truncation, full disk,
kill -9 mid-write) hold for the probe layout: the same tests of ``test_kvstore`` run on a
probe header, and on a window header. A full store reads as a probe store (:class:`ProbeView`), read-only.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import test_kvstore as base
from heedrank.index.kv import KVHeader, KVStore, ProbeView
from heedrank.index.kv.codec import codec_for

from heedrank.errors import KVStoreError, KVStoreMismatchError, ValidationError

HP = KVHeader(**{**base.H.__dict__, "layers": (0, 2), "keys_only": True})


def probe_arrays(doc_id: str, header: KVHeader = HP, tokens: int | None = None):
    """A probe block ``(keys, None)`` of :data:`HP`'s shape (``header`` is ignored: under the
    ``probe_layout`` fixture every store of ``test_kvstore`` is a probe store)."""
    k, _ = base._doc_arrays(doc_id, HP.n_layers, HP.kv_heads, HP.head_dim, HP.max_doc_tokens, tokens)
    return k, None


def probe_exact(store, ids) -> None:
    found, missing = store.get_many(ids)
    assert missing == []
    for d in ids:
        k, _ = probe_arrays(d)
        assert found[d][1] is None and found[d][0].dtype == np.float32
        np.testing.assert_array_equal(found[d][0], k.astype(np.float32))


@pytest.fixture(params=["probe", "window"])
def probe_layout(request, monkeypatch):
    """Run a test of ``test_kvstore`` on the probe layout, then on the window layout
    (``test_kv_window``: keys of three layers, values of one)."""
    import test_kv_window as window

    header, make, exact = (HP, probe_arrays, probe_exact) if request.param == "probe" else (
        window.HW, window.window_arrays, window.window_exact)
    monkeypatch.setattr(base, "H", header)
    monkeypatch.setattr(base, "arrays", make)
    monkeypatch.setattr(base, "assert_exact", exact)


def index_with_full_store(tmp_path):
    """An index at ``tmp_path/ix`` (one document, no dense vectors) whose full store
    (``base.H``) holds block ``a``: one built before the probe and window layouts."""
    from heedrank.index.builder import build_index

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"_id": "d1", "title": "", "text": "statins and cancer"}) + "\n", encoding="utf-8")
    build_index(corpus, tmp_path / "ix", dense=False, show_progress=False)
    with KVStore.create(tmp_path / "ix" / "kv", base.H) as full:
        full.put_many(base.items(["a"]))
    return tmp_path / "ix"


def test_full_header_json_is_unchanged_by_the_probe_fields() -> None:
    d = base.H.to_dict()
    assert "layers" not in d and "keys_only" not in d and d["n_layers"] == 3
    assert KVHeader.from_dict(d) == base.H
    p = HP.to_dict()
    assert p["layers"] == [0, 2] and p["keys_only"] is True and p["n_layers"] == 2
    assert KVHeader.from_dict(json.loads(json.dumps(p))) == HP
    assert HP.fingerprint() != base.H.fingerprint() and HP.stored_layers == (0, 2) and base.H.stored_layers == (0, 1, 2)


@pytest.mark.parametrize("bad, match", [
    ({"layers": (3,)}, "layers"), ({"layers": (2, 1)}, "layers"), ({"layers": ()}, "layers"),
    ({"keys_only": 1}, "keys_only"), ({"value_layers": (3,)}, "value_layers"),
    ({"layers": (0, 2), "value_layers": (1,)}, "value_layers"), ({"layers": (0, 2), "value_layers": ()}, "value_layers"),
])
def test_probe_header_validation(bad, match) -> None:
    with pytest.raises(ValidationError, match=match):
        KVHeader(**{**base.H.__dict__, **bad})


@pytest.mark.parametrize("dtype", ["float16", "int8", "int4"])
def test_keys_only_codecs_round_trip_within_their_bound(dtype) -> None:
    h = KVHeader(**{**HP.__dict__, "dtype": dtype})
    codec = codec_for(h)
    k, _ = probe_arrays("doc", tokens=11)
    k = k.astype(np.float32)
    T, parts = codec.encode("doc", k, None)
    buf = np.concatenate([np.ascontiguousarray(p).reshape(-1).view(np.uint8) for p in parts])
    assert T == 11 and buf.size == codec.nbytes(11)
    got, values = codec.decode(buf, 11)
    assert values is None and got.shape == k.shape
    if dtype == "float16":
        np.testing.assert_array_equal(got, k)  # the test arrays are float16 values
    else:  # |error| <= scale / 2: int8 symmetric (max |k| / 127), int4 asymmetric ((max - min) / 15) per channel
        if dtype == "int8":
            scale = np.abs(k).max(axis=2, keepdims=True) / 127
        else:
            scale = (k.max(axis=2, keepdims=True) - k.min(axis=2, keepdims=True)) / 15
        assert (np.abs(got - k) <= scale / 2 + 1e-5).all()
        assert np.abs(got - k).max() > 0  # lossy: a test that could not fail would prove nothing
    with pytest.raises(ValidationError, match="keys only"):
        codec.encode("doc", k, k)


def test_bytes_per_block_at_the_smollm2_probe_shape() -> None:
    h = KVHeader("m", "t", "i", layer=15, kv_heads=3, head_dim=64, max_doc_tokens=132, layers=(15,), keys_only=True)
    sizes = {dt: codec_for(KVHeader(**{**h.__dict__, "dtype": dt})).nbytes(132) for dt in ("float16", "int8", "int4")}
    assert sizes == {"float16": 50_688, "int8": 26_112, "int4": 14_208}
    full = KVHeader("m", "t", "i", layer=15, kv_heads=3, head_dim=64, max_doc_tokens=132)
    assert codec_for(full).nbytes(132) == 1_622_016  # 32x the float16 probe block


def test_probe_store_round_trip_and_refusals(tmp_path) -> None:
    with KVStore.create(tmp_path / "probe", HP) as s:
        s.put_many({d: probe_arrays(d) for d in ("a", "b")})
        probe_exact(s, ["a", "b"])
        with pytest.raises(ValidationError, match="keys only"):
            s.put_many({"c": base._doc_arrays("c", 2, 2, 8, 16)})
    with pytest.raises(KVStoreMismatchError):
        KVStore.open(tmp_path / "probe", base.H)


def test_corrupt_byte_is_a_miss(tmp_path, caplog, probe_layout) -> None:
    base.test_corrupt_byte_is_a_miss_with_warning_then_recomputed(tmp_path, caplog)


def test_truncated_shard_is_a_miss(tmp_path, caplog, probe_layout) -> None:
    base.test_truncated_shard_is_a_miss_on_open(tmp_path, caplog)


@pytest.mark.parametrize("fail_on", ["bin", "idx.json", "MANIFEST"])
def test_disk_full_commits_nothing(tmp_path, monkeypatch, probe_layout, fail_on) -> None:
    base.test_disk_full_raises_and_commits_nothing(tmp_path, monkeypatch, fail_on)


def test_kill9_mid_write_leaves_only_committed_shards(tmp_path, probe_layout) -> None:
    base.test_kill9_mid_write_leaves_only_committed_shards(tmp_path)


def test_a_full_store_reads_as_a_probe_store(tmp_path) -> None:
    with KVStore.create(tmp_path / "kv", base.H) as full:
        full.put_many(base.items(["a", "b"]))
    full = KVStore.open(tmp_path / "kv", base.H, readonly=True)
    view = ProbeView(full, KVHeader(**{**HP.__dict__, "dtype": "int8"}))  # any probe dtype: exact keys
    found, missing = view.get_many(["a", "zz", "b"])
    assert missing == ["zz"] and list(found) == ["a", "b"]
    k, _ = base.arrays("a")
    np.testing.assert_array_equal(found["a"][0], k[[0, 2]].astype(np.float32))
    assert found["a"][1] is None and view.readonly and view.contains("b") and len(view) == 2
    with pytest.raises(KVStoreError, match="heedrank index kv build"):
        view.put_many({"c": probe_arrays("c")})
    with pytest.raises(KVStoreMismatchError):
        ProbeView(full, KVHeader(**{**HP.__dict__, "layer": 5, "layers": (4,)}))
    with pytest.raises(KVStoreMismatchError):
        ProbeView(full, KVHeader(**{**HP.__dict__, "model_hash": "other"}))
    view.close()


def test_an_index_serves_the_probe_layout_from_its_full_store_until_the_probe_store_exists(tmp_path) -> None:
    """The upgrade path: an index built before the probe store has only ``kv/``; the probe
    scorer reads it (read-only), the build writes ``probe/`` beside it, and from then on the
    probe store serves."""
    from heedrank.index.store import Index

    ix = Index.open(index_with_full_store(tmp_path))
    try:
        view = ix.block_store(HP)
        assert isinstance(view, ProbeView) and view.get("a")[1] is None
        assert not (tmp_path / "ix" / "probe").exists()
    finally:
        ix.close()
    ix = Index.open(tmp_path / "ix")
    try:
        built = ix.block_store(HP, full_fallback=False)  # what `index kv build` opens
        assert isinstance(built, KVStore) and built.path == tmp_path / "ix" / "probe" and len(built) == 0
        built.put_many({"b": probe_arrays("b")})
    finally:
        ix.close()
    ix = Index.open(tmp_path / "ix")
    try:
        store = ix.block_store(HP)
        assert isinstance(store, KVStore) and store.contains("b") and not store.contains("a")
        assert Index.store_dir(HP) == "probe" and Index.store_dir(base.H) == "kv"
    finally:
        ix.close()

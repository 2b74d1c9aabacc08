"""``heedrank index kv build --engine ray`` (``build_index_blocks_ray``) with the real LM on
a handful of real NFCorpus documents (blocks of 32 tokens, layers 0..3): the Ray-built
store holds the local store's keys and blocks, an actor killed right after committing its
first shard is restarted and its part resumes, and a build stopped after one committed
shard resumes (here with the local engine) to a complete store. One local Ray instance for
the session (``ray_fakes.ray_local``).

Tolerance: both stores hold float16 keys/values; the actors compute them in other processes
(1 torch thread each) than the local build, so float32 rounding may move a value across a
float16 rounding boundary: equal within one float16 ulp, ``rtol = 2**-10``, plus
``atol = 1e-6`` for values near zero."""

from __future__ import annotations

import gzip
import itertools
import json

import numpy as np
import pytest
from typer.testing import CliRunner

pytest.importorskip("torch")

from heedrank.config import RerankerConfig  # noqa: E402
from heedrank.errors import KVStoreError  # noqa: E402
from ray_fakes import StopAfterFirstShard, ray_local  # noqa: E402,F401 - ray_local: a fixture

N_DOCS = 8
BATCH = 2
CONFIG = RerankerConfig(method="blockrank", max_doc_tokens=32,
                        options={"query_in_instruction": False, "layer": 3, "kv_dtype": "float16"})


@pytest.fixture(scope="module")
def corpus(nfcorpus_dir, tmp_path_factory):
    """The first 8 NFCorpus documents and a copy of the first under another id (same block)."""
    with gzip.open(nfcorpus_dir / "corpus.jsonl.gz", "rt", encoding="utf-8") as src:
        rows = [json.loads(line) for line in itertools.islice(src, N_DOCS)]
    rows.append({**rows[0], "_id": "copy-of-" + rows[0]["_id"]})
    path = tmp_path_factory.mktemp("nfcorpus-kv") / "corpus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def encoder():
    from heedrank.registry import build_reranker

    return build_reranker(CONFIG)


def _index(corpus, root):
    from heedrank.index.builder import build_index
    from heedrank.index.store import Index

    build_index(corpus, root, dense=False, show_progress=False)
    return Index.open(root)


def _blocks(store):
    found, missing = store.get_many(sorted(store.doc_ids()))
    assert not missing
    return {k: (np.asarray(kk, dtype=np.float32), np.asarray(vv, dtype=np.float32)) for k, (kk, vv) in found.items()}


@pytest.fixture(scope="module")
def local_blocks(corpus, encoder, tmp_path_factory):
    """The local engine's store of the corpus, as float32 arrays by block key."""
    from heedrank.index.kv import build_index_blocks

    ix = _index(corpus, tmp_path_factory.mktemp("local") / "ix")
    try:
        store, report = build_index_blocks(ix, encoder, batch_size=BATCH)
        assert (report.requested, report.computed) == (N_DOCS, N_DOCS)  # 9 documents, 8 blocks
        return _blocks(store)
    finally:
        ix.close()


def _assert_same_blocks(store, reference):
    got = _blocks(store)
    assert sorted(got) == sorted(reference)
    for key, (k, v) in reference.items():
        assert got[key][0].shape == k.shape
        np.testing.assert_allclose(got[key][0], k, rtol=2**-10, atol=1e-6, err_msg=f"keys of block {key}")
        np.testing.assert_allclose(got[key][1], v, rtol=2**-10, atol=1e-6, err_msg=f"values of block {key}")


def _parts_left(store):
    root = store.parts_dir()
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


@pytest.mark.usefixtures("ray_local")
def test_ray_build_equals_local_and_a_killed_actor_resumes(corpus, encoder, local_blocks, tmp_path):
    from heedrank.eval.distributed import RayOptions, build_index_blocks_ray

    flag = tmp_path / "killed"
    ix = _index(corpus, tmp_path / "ix")
    try:
        options = RayOptions(actors=2, worker_setup=StopAfterFirstShard(str(flag), "exit"))
        store, report = build_index_blocks_ray(ix, encoder, CONFIG, options, batch_size=BATCH)
        assert flag.exists(), "no actor was killed"
        assert (report.requested, report.skipped, report.computed) == (N_DOCS, 0, N_DOCS)
        _assert_same_blocks(store, local_blocks)
        assert _parts_left(store) == []  # every part adopted and removed
        again, report = build_index_blocks_ray(ix, encoder, CONFIG, options, batch_size=BATCH)
        assert (report.skipped, report.computed, report.shards) == (N_DOCS, 0, 0)  # nothing sent to Ray
    finally:
        ix.close()


@pytest.mark.usefixtures("ray_local")
def test_ray_build_stopped_after_one_shard_resumes(corpus, encoder, local_blocks, tmp_path):
    from heedrank.eval.distributed import RayOptions, build_index_blocks_ray
    from heedrank.index.kv import KVHeader, KVStore, build_index_blocks

    ix = _index(corpus, tmp_path / "ix")
    try:
        options = RayOptions(actors=1, worker_setup=StopAfterFirstShard(str(tmp_path / "stopped"), "raise"))
        with pytest.raises(KVStoreError, match="stopped after one committed shard"):
            build_index_blocks_ray(ix, encoder, CONFIG, options, batch_size=BATCH)
        store = ix.block_store(encoder.block_store_header())
        assert len(store) == 0 and _parts_left(store) == ["part-00000"]
        with KVStore.open(store.parts_dir() / "part-00000", KVHeader.from_dict(encoder.block_store_header()),
                          readonly=True) as part:
            assert len(part) == BATCH  # the one shard the actor committed
    finally:
        ix.close()
    from heedrank.index.store import Index

    ix = Index.open(tmp_path / "ix")  # a new run (another process would do the same)
    try:
        store, report = build_index_blocks(ix, encoder, batch_size=BATCH)  # either engine resumes
        assert (report.skipped, report.computed) == (BATCH, N_DOCS - BATCH)
        _assert_same_blocks(store, local_blocks)
        assert _parts_left(store) == []
    finally:
        ix.close()


def test_cli_engine_flags(tmp_path):
    from heedrank.cli import app

    runner = CliRunner()
    args = ["index", "kv", "build", "--index", str(tmp_path)]
    res = runner.invoke(app, [*args, "--actors", "2"])
    assert res.exit_code == 2 and "only apply with --engine ray" in res.output
    res = runner.invoke(app, [*args, "--engine", "spark"])
    assert res.exit_code == 2 and "unknown engine 'spark'" in res.output


PROBE_CONFIG = RerankerConfig(method="blockrank-cached", max_doc_tokens=32, options={
    "layer": 3, "scoring": "calibrated", "query_adapter": None, "attend": "none", "probe_layers": [1, 3],
    "kv_dtype": "int8"})
WINDOW_CONFIG = RerankerConfig(method="blockrank-cached", max_doc_tokens=32, options={
    "layer": 3, "scoring": "calibrated", "query_adapter": None, "attend": 2, "probe_layers": [1, 3],
    "kv_dtype": "int4"})


def _code_step(x, dtype, axis):
    """One code step of the codec (per channel for keys, ``axis=2``; per token for values, ``axis=3``)."""
    if dtype == "int8":
        return np.abs(x).max(axis=axis, keepdims=True) / 127
    return (x.max(axis=axis, keepdims=True) - x.min(axis=axis, keepdims=True)) / 15


@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize("config, folder, n_keys, n_values", [
    (PROBE_CONFIG, "probe", 2, 0),  # keys of layers 1 and 3
    (WINDOW_CONFIG, "window", 3, 1),  # keys of layers 1, 2 and 3, values of layer 2
])
def test_ray_build_of_a_probe_or_window_store_equals_the_local_one(corpus, tmp_path, config, folder, n_keys, n_values):
    """Issue #23: the keys-only probe layout (int8) and the window layout (int4) built by Ray
    actors hold the local build's blocks in ``INDEX/probe`` and ``INDEX/window``."""
    from heedrank.eval.distributed import RayOptions, build_index_blocks_ray
    from heedrank.index.kv import build_index_blocks
    from heedrank.registry import build_reranker

    dtype = config.options["kv_dtype"]
    enc = build_reranker(config)
    assert enc.block_store_header().layout == folder
    ix = _index(corpus, tmp_path / "local")
    try:
        store, _ = build_index_blocks(ix, enc, batch_size=BATCH)
        assert store.path == tmp_path / "local" / folder
        local = {k: (np.asarray(kk, dtype=np.float32), None if vv is None else np.asarray(vv, dtype=np.float32))
                 for k, (kk, vv) in store.get_many(sorted(store.doc_ids()))[0].items()}
        assert len(local) == N_DOCS and all(k.shape[0] == n_keys for k, _ in local.values())
        assert all((0 if v is None else v.shape[0]) == n_values for _, v in local.values())
    finally:
        ix.close()
    ix = _index(corpus, tmp_path / "ray")
    try:
        store, report = build_index_blocks_ray(ix, enc, config, RayOptions(actors=2), batch_size=BATCH)
        assert (report.requested, report.computed) == (N_DOCS, N_DOCS) and store.path == tmp_path / "ray" / folder
        found, missing = store.get_many(sorted(local))
        assert not missing
        for key, (k, v) in local.items():  # codes: equal up to one code step of float32 rounding
            got = np.asarray(found[key][0], dtype=np.float32)
            assert got.shape == k.shape
            assert (np.abs(got - k) <= _code_step(k, dtype, 2) + 1e-6).all(), key
            if v is None:
                assert found[key][1] is None
            else:
                gv = np.asarray(found[key][1], dtype=np.float32)
                assert (np.abs(gv - v) <= _code_step(v, dtype, 3) + 1e-6).all(), key
    finally:
        ix.close()

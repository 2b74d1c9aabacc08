"""``heedrank index kv build --engine ray`` (``build_index_blocks(..., engine=RayEngine(...))``) with the real LM on
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
from heedrank.engine import EngineOptions  # noqa: E402
from heedrank.errors import KVStoreError  # noqa: E402
from ray_fakes import StopAfterFirstShard, ray_local  # noqa: E402,F401 - ray_local: a fixture

N_DOCS = 8
BATCH = 2
CONFIG = RerankerConfig(method="blockrank-cached", max_doc_tokens=32,
                        options={"scoring": "signal", "query_adapter": None, "layer": 3, "kv_dtype": "float16"})


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
    found, missing = store.get_many(sorted(store.keys()))
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
    """Equal to fp16 rounding; atol 1e-5 for values near 0, where another batching's float32
    rounding moves a value by a few fp16 steps (the keys and values are O(1))."""
    got = _blocks(store)
    assert sorted(got) == sorted(reference)
    for key, (k, v) in reference.items():
        assert got[key][0].shape == k.shape
        np.testing.assert_allclose(got[key][0], k, rtol=2**-10, atol=1e-5, err_msg=f"keys of block {key}")
        np.testing.assert_allclose(got[key][1], v, rtol=2**-10, atol=1e-5, err_msg=f"values of block {key}")


def _build_on_ray(ix, encoder, config, options, **kw):
    """What ``heedrank index kv build --engine ray`` runs: the product's build with a Ray engine."""
    from heedrank.engine.ray import RayEngine
    from heedrank.index.kv import build_index_blocks

    return build_index_blocks(ix, encoder, engine=RayEngine(options), config=config, **kw)


def _parts_left(store):
    root = store.parts_dir()
    return sorted(p.name for p in root.iterdir()) if root.is_dir() else []


@pytest.mark.usefixtures("ray_local")
def test_ray_build_equals_local_and_a_killed_actor_resumes(corpus, encoder, local_blocks, tmp_path):
    flag = tmp_path / "killed"
    ix = _index(corpus, tmp_path / "ix")
    try:
        options = EngineOptions(engine="ray", actors=2, worker_setup=StopAfterFirstShard(str(flag), "exit"))
        store, report = _build_on_ray(ix, encoder, CONFIG, options, batch_size=BATCH)
        assert flag.exists(), "no actor was killed"
        assert (report.requested, report.skipped, report.computed) == (N_DOCS, 0, N_DOCS)
        _assert_same_blocks(store, local_blocks)
        assert _parts_left(store) == []  # every part adopted and removed
        again, report = _build_on_ray(ix, encoder, CONFIG, options, batch_size=BATCH)
        assert (report.skipped, report.computed, report.shards) == (N_DOCS, 0, 0)  # nothing sent to Ray
    finally:
        ix.close()


@pytest.mark.usefixtures("ray_local")
def test_ray_build_stopped_after_one_shard_resumes(corpus, encoder, local_blocks, tmp_path):
    from heedrank.index.kv import KVHeader, KVStore, build_index_blocks

    ix = _index(corpus, tmp_path / "ix")
    try:
        options = EngineOptions(engine="ray", actors=1, worker_setup=StopAfterFirstShard(str(tmp_path / "stopped"), "raise"))
        with pytest.raises(KVStoreError, match="stopped after one committed shard"):
            _build_on_ray(ix, encoder, CONFIG, options, batch_size=BATCH)
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


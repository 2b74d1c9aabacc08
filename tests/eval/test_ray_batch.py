"""rerank-batch on Ray (``--engine ray``, ``rerank_batch(..., engine=RayEngine(...))``):
byte-identical to the local engine, resumable
across engines, an actor killed mid-run restarted and its batch retried, typed errors from
workers raised on the driver, and the CLI's engine flags. A few DL19 queries, a fake
reranker, one local Ray instance for the session (``ray_fakes.ray_local``)."""

from __future__ import annotations

import json
import sys

import pytest
from typer.testing import CliRunner

from heedrank.engine import EngineOptions, LocalEngine
from heedrank.errors import MissingDependencyError, ModelLoadError
from heedrank.eval.batch import rerank_batch
from ray_fakes import HashFactory, broken_setup, dl19_batch_inputs, ray_local  # noqa: F401 - ray_local: a fixture


def _batch(inputs, out, factory, engine=None, **kw):
    topics, run, docs = inputs
    return rerank_batch(topics, run, docs, out, method="hash", candidates=10, factory=factory, engine=engine,
                        show_progress=False, **kw)


def _engine(actors=2, **kw):
    """The engine of ``heedrank rerank-batch --engine ray --actors N``."""
    from heedrank.engine.ray import RayEngine

    return RayEngine(EngineOptions(engine="ray", actors=actors, **kw))


def _records(out):
    """Progress records without their timing."""
    lines = (out.parent / (out.name + ".progress")).read_text().splitlines()
    recs = [json.loads(line) for line in lines]
    for r in recs[1:]:
        r.pop("seconds")
    return recs


@pytest.fixture
def inputs(dl19_dir, tmp_path):
    return dl19_batch_inputs(dl19_dir, tmp_path, queries=5, depth=30)


@pytest.fixture
def local_out(inputs, tmp_path):
    """The local engine's output for the same inputs (a failing document in query 2)."""
    out = tmp_path / "local.trec"
    summary = _batch(inputs, out, HashFactory(poison=_poison(inputs)), engine=LocalEngine())
    assert summary.done == 5 and summary.failed_documents
    return out, summary


def _poison(inputs):
    topics, run, _ = inputs
    qid = topics.read_text().splitlines()[1].split("\t")[0]
    return [next(line.split()[2] for line in run.read_text().splitlines() if line.startswith(qid + " "))]


@pytest.mark.usefixtures("ray_local")
def test_ray_output_is_byte_identical_to_local(inputs, local_out, tmp_path):
    """``rerank_batch(..., engine=RayEngine(...))``, as ``--engine ray`` calls it."""
    ref, ref_summary = local_out
    out = tmp_path / "ray.trec"
    engine = _engine(actors=2)
    summary = _batch(inputs, out, HashFactory(poison=_poison(inputs)), engine=engine)
    assert out.read_bytes() == ref.read_bytes()
    assert _records(out)[1:] == _records(ref)[1:]  # same statuses, failed documents, offsets
    assert (summary.done, summary.documents, summary.failed_documents, summary.first_stage_queries) == (
        ref_summary.done, ref_summary.documents, ref_summary.failed_documents, ref_summary.first_stage_queries)
    stats = engine.last_stats
    assert stats.queries == 5 and stats.run_seconds >= stats.first_result_seconds > 0
    # a rerun skips every finished query, sending nothing to Ray
    again = _batch(inputs, out, HashFactory(poison=_poison(inputs)), engine=_engine())
    assert (again.skipped, again.done) == (5, 0) and out.read_bytes() == ref.read_bytes()


@pytest.mark.usefixtures("ray_local")
def test_actor_killed_mid_run_is_restarted_and_batch_retried(inputs, local_out, tmp_path):
    ref, _ = local_out
    qid = inputs[0].read_text().splitlines()[2].split("\t")[0]
    flag = tmp_path / "crashed"
    out = tmp_path / "ray.trec"
    summary = _batch(inputs, out, HashFactory(poison=_poison(inputs), crash_on=qid, flag=str(flag)),
                     engine=_engine(actors=2))
    assert flag.exists(), "the actor did not crash"
    assert summary.done == 5
    assert out.read_bytes() == ref.read_bytes()


@pytest.mark.usefixtures("ray_local")
def test_typed_worker_error_stops_and_a_rerun_resumes(inputs, local_out, tmp_path):
    """A ModelLoadError in a worker stops the batch on the driver with the same typed error;
    the queries before it are committed; a rerun (on either engine) completes identically."""
    ref, _ = local_out
    qid = inputs[0].read_text().splitlines()[3].split("\t")[0]
    flag = tmp_path / "failed-once"
    out = tmp_path / "ray.trec"
    factory = HashFactory(poison=_poison(inputs), fail_load_on=qid, flag=str(flag))
    with pytest.raises(ModelLoadError, match="cannot be loaded"):
        _batch(inputs, out, factory, engine=_engine(actors=1))
    done = [r["qid"] for r in _records(out)[1:]]
    assert done == [line.split("\t")[0] for line in inputs[0].read_text().splitlines()[:3]]
    assert ref.read_bytes().startswith(out.read_bytes())
    resumed = _batch(inputs, out, factory)  # the local engine takes over
    assert (resumed.skipped, resumed.done) == (3, 2)
    assert out.read_bytes() == ref.read_bytes()


def test_missing_ray_names_the_extra(monkeypatch):
    from heedrank.engine.ray import RayEngine

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(MissingDependencyError, match=r"pip install -e '\.\[ray\]'"):
        RayEngine()


def test_cli_engine_flags(monkeypatch, tmp_path):
    from heedrank.cli import app

    runner = CliRunner()
    args = ["rerank-batch", "--topics", str(tmp_path / "t"), "--run", str(tmp_path / "r"), "--docs", str(tmp_path),
            "--out", str(tmp_path / "o.trec"), "--no-progress"]
    res = runner.invoke(app, [*args, "--actors", "2"])
    assert res.exit_code == 2 and "only apply with --engine ray" in res.output
    res = runner.invoke(app, [*args, "--engine", "spark"])
    assert res.exit_code == 2 and "unknown engine 'spark'" in res.output
    res = runner.invoke(app, [*args, "--engine", "ray", "--actors", "0"])
    assert res.exit_code == 2 and "actors must be an integer >= 1" in res.output
    monkeypatch.setitem(sys.modules, "ray", None)
    res = runner.invoke(app, [*args, "--engine", "ray"])
    assert res.exit_code == 2 and "pip install -e '.[ray]' (in the heedrank checkout)" in res.output
    res = runner.invoke(app, ["eval", "trec-dl", "--data", str(tmp_path), "--engine", "ray"])
    assert res.exit_code == 2 and "pip install -e '.[ray]' (in the heedrank checkout)" in res.output


@pytest.mark.slow
@pytest.mark.usefixtures("ray_local")
def test_cli_real_lm_on_ray_matches_local(dl19_dir, tmp_path):
    """The packaged LM (ICR, 8 candidates, 2 queries) through the CLI: one Ray actor builds its
    own reranker and loads the LM; the output is byte-identical to the local engine's."""
    from heedrank.cli import app

    topics, run, docs = dl19_batch_inputs(dl19_dir, tmp_path, queries=2, depth=12)
    runner = CliRunner()
    outs = {}
    for engine in ("local", "ray"):
        outs[engine] = tmp_path / f"{engine}.trec"
        args = ["rerank-batch", "--topics", str(topics), "--run", str(run), "--docs", str(docs), "--out",
                str(outs[engine]), "--method", "icr", "--candidates", "8", "--no-progress", "--engine", engine]
        res = runner.invoke(app, args)
        assert res.exit_code == 0, res.output
    assert outs["ray"].read_bytes() == outs["local"].read_bytes()
    assert len(outs["ray"].read_text().splitlines()) == 24



def _unimportable_setup():  # defined in this test module, which Ray workers cannot import
    pass


@pytest.mark.usefixtures("ray_local")
def test_untyped_worker_error_is_a_ray_error_with_the_traceback(inputs, tmp_path):
    from heedrank.engine.ray import RayExecutionError

    out = tmp_path / "ray.trec"
    with pytest.raises(RayExecutionError, match="no GPU driver on this node") as info:
        _batch(inputs, out, HashFactory(), engine=_engine(actors=1, worker_setup=broken_setup))
    assert "broken_setup" in str(info.value)  # the worker's traceback
    assert out.read_bytes() == b""


@pytest.mark.usefixtures("ray_local")
def test_a_worker_that_cannot_start_fails_the_run_with_a_hint(inputs, tmp_path):
    """What a node without heedrank looks like: the actor's constructor cannot be unpickled."""
    from heedrank.engine.ray import RayExecutionError

    with pytest.raises(RayExecutionError, match=r"(?s)Ray gave up after 0 of 5 queries.*every Ray node"):
        _batch(inputs, tmp_path / "ray.trec", HashFactory(),
               engine=_engine(actors=1, worker_setup=_unimportable_setup))

"""``heedrank eval trec-dl|beir --engine ray``: the queries reranked by a Ray actor pool,
the report identical to a local run's apart from timings (and ``params.engine``), the run
file byte-identical. A few DL19 queries; a tiny BEIR dataset; the fake reranker registered
in each worker through ``EngineOptions.worker_setup``."""

from __future__ import annotations

import json
from dataclasses import asdict

import pytest
from typer.testing import CliRunner

from heedrank.config import RerankerConfig
from heedrank.errors import ValidationError
from heedrank.eval.beir import evaluate_beir
from heedrank.eval.spec import EvalSpec
from heedrank.eval.trecdl import evaluate_trec_dl
from ray_fakes import ray_local, register_fake  # noqa: F401 - ray_local: a fixture

TIMING_FIELDS = ("timings", "latency", "timestamp", "argv", "reranker_load_seconds")


def _comparable(report):
    d = asdict(report)
    for key in TIMING_FIELDS:
        d.pop(key)
    d["params"] = {k: v for k, v in d["params"].items() if k != "engine"}
    d["params"].pop("out_dir", None)
    d.pop("run_file")
    return d


def _engine(actors=2):
    from heedrank.engine import EngineOptions
    from heedrank.engine.ray import RayEngine

    return RayEngine(EngineOptions(engine="ray", actors=actors, worker_setup=register_fake))


@pytest.mark.usefixtures("ray_local")
def test_trec_dl_fake_reranker_report_same_as_local(dl19_dir, tmp_path, fake_reranker):
    kw = dict(run_name="BM25", rerank="fake", candidates=10, max_queries=4, seed=2,
              reranker_config=RerankerConfig(max_doc_tokens=64), show_progress=False)
    local = evaluate_trec_dl(EvalSpec(dl19_dir, out_dir=tmp_path / "local", **kw))
    remote = evaluate_trec_dl(EvalSpec(dl19_dir, out_dir=tmp_path / "ray", engine=_engine(actors=2), **kw))
    assert _comparable(remote) == _comparable(local)
    assert remote.truncation["docs_reranked"] == 40 and remote.reranker == local.reranker
    assert remote.params["engine"]["engine"] == "ray" and remote.params["engine"]["actors"] == 2
    assert "engine" not in local.params
    assert remote.reranker_load_seconds is not None and set(remote.timings) == set(local.timings)
    assert (tmp_path / "ray" / f"{remote.name}.trec").read_bytes() == (tmp_path / "local" / f"{local.name}.trec").read_bytes()


@pytest.mark.usefixtures("ray_local")
def test_cli_trec_dl_rerank_none_on_ray(dl19_dir, tmp_path):
    from heedrank.cli import app

    local = evaluate_trec_dl(EvalSpec(dl19_dir, rerank="none", max_queries=3, seed=0, out_dir=tmp_path / "local",
                                      show_progress=False))
    res = CliRunner().invoke(app, ["eval", "trec-dl", "--data", str(dl19_dir), "--max-queries", "3",
                                   "--out", str(tmp_path / "ray"), "--engine", "ray", "--actors", "1"])
    assert res.exit_code == 0, res.output
    remote = json.loads((tmp_path / "ray" / f"{local.name}.json").read_text())
    assert remote["metrics"] == local.metrics and remote["per_query"] == local.per_query
    assert remote["params"]["engine"]["actors"] == 1 and remote["reranker"] is None
    assert (tmp_path / "ray" / f"{local.name}.trec").read_bytes() == (tmp_path / "local" / f"{local.name}.trec").read_bytes()


@pytest.mark.usefixtures("ray_local")
def test_beir_on_ray_same_as_local(tmp_path, monkeypatch, fake_reranker):
    d = tmp_path / "toy-beir"
    (d / "qrels").mkdir(parents=True)
    topics = ["apple orchard harvest", "banana plantation export", "cherry blossom festival"]
    with open(d / "corpus.jsonl", "w") as f:
        for t, topic in enumerate(topics):
            for i in range(6):
                text = " ".join(topic.split()[: 3 - min(i, 2)]) + f" filler text number {i} about things"
                f.write(json.dumps({"_id": f"t{t}-{i}", "title": topic.split()[0].title(), "text": text}) + "\n")
    with open(d / "queries.jsonl", "w") as f:
        f.writelines(json.dumps({"_id": f"q{t}", "text": topic}) + "\n" for t, topic in enumerate(topics))
    with open(d / "qrels" / "test.tsv", "w") as f:
        f.write("query-id\tcorpus-id\tscore\n")
        f.writelines(f"q{t}\tt{t}-0\t2\nq{t}\tt{t}-1\t1\n" for t in range(3))
    monkeypatch.setenv("HEEDRANK_CACHE_DIR", str(tmp_path / "cache"))
    kw = dict(rerank="fake", candidates=4, build_dense=False, show_progress=False)
    local = evaluate_beir(EvalSpec(d, out_dir=tmp_path / "local", **kw))
    remote = evaluate_beir(EvalSpec(d, out_dir=tmp_path / "ray", engine=_engine(actors=1), **kw))
    assert _comparable(remote) == _comparable(local)
    assert (tmp_path / "ray" / f"{remote.name}.trec").read_bytes() == (tmp_path / "local" / f"{local.name}.trec").read_bytes()


def test_dump_needs_the_local_engine(dl19_dir, tmp_path):
    class Engine:  # never reached: the check comes first
        def search(self, *a, **k):  # pragma: no cover
            raise AssertionError

    with pytest.raises(ValidationError, match="needs the local engine"):
        evaluate_trec_dl(EvalSpec(dl19_dir, rerank="icr", max_queries=1, out_dir=tmp_path, dump_dir=tmp_path / "dump",
                                  engine=Engine(), show_progress=False))

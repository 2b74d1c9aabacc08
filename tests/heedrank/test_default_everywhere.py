"""``default`` works everywhere a reranker method is named (the README and ``GET /info``
promise it): every CLI command and API route that takes a method, given ``default``,
succeeds, and the reranker that answers is the one ``default`` names (``blockrank-cached``).

A fake reranker is registered as ``blockrank-cached`` for each test (no LM is loaded); it
records the ``config.method`` of every instance built, so each test sees which registered
method ``default`` built. The tiny data sets, TREC files and fakes are the API and eval
tests' own (imported from their modules)."""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

_TESTS = Path(__file__).resolve().parents[1]
for _folder in (_TESTS / "api", _TESTS / "eval"):  # the helpers' folders (no packages: pytest's rootdir imports)
    if str(_folder) not in sys.path:
        sys.path.insert(0, str(_folder))

import test_trecdl  # noqa: E402
from api_fakes import FakeReranker, make_pipeline  # noqa: E402
from test_batch import inputs  # noqa: E402,F401 - fixture: topics, TREC run and passages of rerank-batch
from test_beir import beir_dir  # noqa: E402,F401 - fixture: a tiny BEIR-layout dataset

from heedrank import registry  # noqa: E402
from heedrank.cli import app  # noqa: E402
from heedrank.eval.report import load_report  # noqa: E402
from heedrank.settings import Settings  # noqa: E402

DEFAULT = "default"


def _target() -> str:
    return registry.reranker_aliases()[DEFAULT]


class DefaultFake(FakeReranker):
    """The API tests' fake reranker, registered as what ``default`` names; ``built`` lists
    the ``config.method`` of every instance built (reset per test)."""

    name = "blockrank-cached"
    built: list[str] = []

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        DefaultFake.built.append(config.method)

    def describe(self) -> dict[str, Any]:
        return {"method": self.config.method, "model": "fake-default", "max_doc_tokens": self.config.max_doc_tokens}


@pytest.fixture
def fake_default(monkeypatch):
    """``DefaultFake`` registered as ``default``'s target for one test; the original target
    is restored afterwards (monkeypatch undoes the entry)."""
    target = _target()
    original = registry._RERANKERS[target]
    monkeypatch.setitem(registry._RERANKERS, target, original)  # restored on teardown
    registry.register_reranker(target, DefaultFake)
    monkeypatch.setattr(DefaultFake, "built", [])
    monkeypatch.setattr(FakeReranker, "loads", 0)
    yield DefaultFake
    assert registry.reranker_class(DEFAULT) is DefaultFake  # nothing replaced it during the test


def test_default_names_blockrank_cached():
    assert _target() == "blockrank-cached"
    assert registry.resolve_method(DEFAULT) == "blockrank-cached"
    assert DEFAULT not in registry.reranker_names()  # an alias, not a registered method


def _invoke(args: list[str]):
    """``heedrank ARGS``, which must succeed; the root logger's handlers are put back after it
    (the CLI installs its own, on the runner's stream, which is closed once it returns)."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        result = CliRunner().invoke(app, args)
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
    assert result.exit_code == 0, f"{args}: {result.output}\n{result.exception!r}"
    return result


# ---------------------------------------------------------------------------- CLI
def test_cli_rerank_batch_method_default(fake_default, inputs, tmp_path):  # noqa: F811
    topics, run, docs = inputs
    out = tmp_path / "out.trec"
    result = _invoke(["rerank-batch", "--topics", str(topics), "--run", str(run), "--docs", str(docs),
                      "--out", str(out), "--method", DEFAULT, "--candidates", "5", "--no-progress"])
    summary = json.loads(result.stdout[result.stdout.index("{"):])
    assert summary["done"] == 4 and summary["documents"] == 20 and not summary["failed_documents"]
    assert fake_default.built and set(fake_default.built) == {"blockrank-cached"}
    lines = out.read_text().splitlines()
    assert len(lines) == 4 * 8 and all(line.split()[5] == "heedrank-default-c5" for line in lines)


def test_cli_eval_beir_rerank_default(fake_default, beir_dir, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setenv("HEEDRANK_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "runs"
    _invoke(["eval", "beir", "--data", str(beir_dir), "--rerank", DEFAULT, "--candidates", "3", "--out", str(out)])
    assert fake_default.built and set(fake_default.built) == {"blockrank-cached"}
    (path,) = [p for p in out.glob("*.json") if "-default-" in p.name]
    report = load_report(path)
    assert report.rerank == DEFAULT and report.truncation["docs_reranked"] == 3 * 3
    assert report.reranker["method"] == "blockrank-cached" and report.reranker["model"] == "fake-default"
    assert report.first_stage_metrics is not None


@pytest.mark.parametrize("fusion", [[], ["--fusion", DEFAULT]], ids=["fusion-unset", "fusion-default"])
def test_cli_eval_trec_dl_rerank_default(fake_default, tmp_path, fusion):
    d = test_trecdl._folder(tmp_path / "trecdl", "topics.dl19-passage.txt", "qrels.dl19-passage.txt",
                            "retrieve_results_BM25_dl19_top100.json.gz")
    out = tmp_path / "runs"
    _invoke(["eval", "trec-dl", "--data", str(d), "--rerank", DEFAULT, "--candidates", "2", "--out", str(out),
             *fusion])
    assert fake_default.built and set(fake_default.built) == {"blockrank-cached"}
    (path,) = out.glob("*.json")
    report = load_report(path)
    assert report.rerank == DEFAULT and report.truncation["docs_reranked"] == 2
    assert report.reranker["method"] == "blockrank-cached"
    # --fusion default: the default records no weight (its card's scorer serves it), read without loading a model
    from heedrank.config import RerankerConfig

    assert registry.recorded_fusion(RerankerConfig(method=DEFAULT)) is None and report.params.get("fusion") is None


def test_cli_serve_rerank_method_default(fake_default, beir_dir, tmp_path, monkeypatch):  # noqa: F811
    """``serve --rerank-method default`` without a server: uvicorn.run is replaced, and the app
    it was handed is started in a TestClient over a tiny BM25 index."""
    import uvicorn
    from fastapi.testclient import TestClient

    from heedrank.index.builder import build_index

    idx = tmp_path / "idx"
    build_index(beir_dir, idx, dense=False, show_progress=False)
    handed: dict[str, Any] = {}
    monkeypatch.setattr(uvicorn, "run", lambda app, **kw: handed.update(app=app, **kw))
    _invoke(["serve", "--index", str(idx), "--rerank-method", DEFAULT, "--port", "8123"])
    served = handed["app"]
    settings = served.state.settings
    assert settings.rerank_method == DEFAULT and settings.rerank_options == {} and handed["port"] == 8123
    assert settings.pipeline_config().reranker.method == "blockrank-cached"
    assert not fake_default.built  # nothing is built before start-up
    with TestClient(served) as client:
        assert client.app.state.runtime.wait_ready(10)
        assert fake_default.built == ["blockrank-cached"]  # preloaded at start-up
        info = client.get("/info").json()["reranker"]
        assert info["method"] == DEFAULT and info["model"]["method"] == "blockrank-cached"
        r = client.post("/search", json={"query": "apple orchard", "rerank": {"candidates": 3}})
        assert r.status_code == 200, r.text
        assert r.json()["rerank"]["candidates"] == 3
    assert fake_default.built == ["blockrank-cached"]  # one reranker served every request


# ---------------------------------------------------------------------------- API
@contextlib.contextmanager
def _service(rerank_method: str):
    """The API over the API tests' in-memory pipeline (its reranker factory's base config is
    ``RerankerConfig()``, the default method), serving ``rerank_method``, its reranker loaded."""
    from fastapi.testclient import TestClient

    from heedrank.api.app import create_app

    settings = Settings(index="unused", rerank_method=rerank_method, preload=True, max_top_k=20, max_candidates=8,
                        default_candidates=4, warmup=False)
    with TestClient(create_app(settings, pipeline=make_pipeline())) as c:
        assert c.app.state.runtime.wait_ready(10)
        yield c


@pytest.fixture
def default_client(fake_default):
    """The API serving ``default`` (``HEEDRANK_RERANK_METHOD=default``, the settings' default)."""
    with _service(DEFAULT) as c:
        yield c


def test_api_search_rerank_method_default(default_client, fake_default):
    r = default_client.post("/search", json={"query": "apples", "top_k": 5,
                                             "rerank": {"method": DEFAULT, "candidates": 4}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["rerank"]["candidates"] == 4 and len(body["results"]) == 5
    assert body["rerank"]["method"] == "blockrank-cached"  # the alias reported as what it names
    assert fake_default.built == ["blockrank-cached"]  # the preloaded reranker answered
    loaded = default_client.app.state.runtime.rerankers.loaded()
    assert set(loaded) == {"blockrank-cached"} and isinstance(loaded["blockrank-cached"], DefaultFake)
    # naming the method itself reaches the same reranker, with the same ranking
    same = default_client.post("/search", json={"query": "apples", "top_k": 5,
                                                "rerank": {"method": "blockrank-cached", "candidates": 4}})
    assert same.status_code == 200, same.text
    assert [h["doc_id"] for h in same.json()["results"]] == [h["doc_id"] for h in body["results"]]
    assert fake_default.built == ["blockrank-cached"]


def test_api_search_rerank_method_default_on_a_service_serving_another(fake_default, monkeypatch):
    """A service serving ``icr`` (a fake here too) reranks a /search that names ``default``
    with what ``default`` names."""
    monkeypatch.setitem(registry._RERANKERS, "icr", FakeReranker)
    with _service("icr") as c:
        assert not fake_default.built  # the service preloaded icr only
        r = c.post("/search", json={"query": "apples", "top_k": 5, "rerank": {"method": DEFAULT, "candidates": 4}})
        assert r.status_code == 200, r.text
        assert r.json()["rerank"]["method"] == "blockrank-cached"
        assert set(c.app.state.runtime.rerankers.loaded()) == {"icr", "blockrank-cached"}
    assert fake_default.built == ["blockrank-cached"]


def test_api_rerank_model_default(default_client, fake_default):
    from api_fakes import DOCS

    texts = [d.content for d in DOCS[:5]]
    r = default_client.post("/rerank", json={"model": DEFAULT, "query": "apples", "documents": texts})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["meta"]["reranked"] is True and sorted(x["index"] for x in body["results"]) == list(range(5))
    # meta names the registry method that answered: ``default`` resolves to blockrank-cached
    assert body["meta"]["method"] == "blockrank-cached"
    assert body["meta"]["model"].endswith("/blockrank-cached") and body["meta"]["warnings"] == []
    assert fake_default.built == ["blockrank-cached"]  # the preloaded reranker answered
    # the fake ranks shorter documents first (its raw scores are 1 / len)
    assert [x["index"] for x in body["results"]] == sorted(range(5), key=lambda i: (len(texts[i]), i))


@pytest.mark.parametrize("model", [DEFAULT, f"smollm2-135m-instruct/{DEFAULT}"])
def test_api_rerank_model_default_on_a_service_serving_blockrank_cached(fake_default, model):
    """``default`` also names the method of a service started with ``--rerank-method blockrank-cached``."""
    with _service("blockrank-cached") as c:
        assert {DEFAULT, f"smollm2-135m-instruct/{DEFAULT}"} <= set(c.get("/info").json()["reranker"]["model_ids"])
        r = c.post("/rerank", json={"model": model, "query": "apples", "documents": ["a longer one", "short"]})
        assert r.status_code == 200, r.text
        assert [x["index"] for x in r.json()["results"]] == [1, 0] and r.json()["meta"]["method"] == "blockrank-cached"
    assert fake_default.built == ["blockrank-cached"]


def test_api_info_names_what_default_resolves_to(default_client, fake_default):
    info = default_client.get("/info").json()["reranker"]
    assert info["method"] == DEFAULT
    assert info["default"]["name"] == DEFAULT and info["default"]["method"] == "blockrank-cached"
    assert info["model"] == {"method": "blockrank-cached", "model": "fake-default", "max_doc_tokens": None}
    assert {DEFAULT, "blockrank-cached"} <= set(info["methods"])
    assert DEFAULT in info["model_ids"]
    # the served method's options are listed under the name it is served as, the same as its target's
    assert info["options"][DEFAULT] == info["options"]["blockrank-cached"]
    assert {o["name"] for o in info["options"][DEFAULT]} >= {"scoring", "query_adapter"}
    assert fake_default.built == ["blockrank-cached"]

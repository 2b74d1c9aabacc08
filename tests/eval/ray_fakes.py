"""Shared pieces of the Ray tests: one local Ray instance per test session, small DL19
inputs, and deterministic fake rerankers that can fail in the ways the tests need (a
failing document, an actor process that dies once, a model that cannot load once).

The fakes are shipped to Ray workers by value (``register_pickle_by_value``), so workers
need not import this test module."""

from __future__ import annotations

import logging
import os
import sys
import zlib
from pathlib import Path

import pytest
from eval_fakes import FakeReranker

from heedrank.errors import ModelLoadError
from heedrank.protocols import RerankResult
from heedrank.types import Ranking

_STARTED = []


@pytest.fixture(scope="session")
def ray_local():
    """A local Ray instance (2 CPUs, no dashboard) shared by every Ray test of the session:
    Ray's start-up (~5 s) is paid once. Skips when Ray is not installed, except under CI
    (``CI`` set), where scripts/setup.sh installs it and a skip would hide a broken install."""
    try:
        import ray
        import ray.data  # noqa: F401
    except ImportError as exc:
        message = f"Ray is not installed ({exc}); pip install -e '.[ray]' (in the heedrank checkout)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    import eval_fakes

    for module in (sys.modules[__name__], eval_fakes):
        ray.cloudpickle.register_pickle_by_value(module)
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING)
        _STARTED.append(True)
    yield ray
    if _STARTED:
        _STARTED.clear()
        ray.shutdown()


class HashReranker:
    """Deterministic scores from crc32(query, text).

    Args:
        poison: Doc ids whose presence makes ``rerank`` raise (failure isolation path).
        crash_on: A query id on which the process ``os._exit``s, once: only while ``flag``
            does not exist (it is created first), so the retried batch succeeds.
        fail_load_on: A query id on which ``rerank`` raises ModelLoadError while ``flag``
            does not exist (created first): a typed error that stops the batch once.
        flag: The file of ``crash_on`` / ``fail_load_on``.
    """

    name = "hash"

    def __init__(self, poison=(), crash_on=None, fail_load_on=None, flag=None) -> None:
        self.poison = set(poison)
        self.crash_on = crash_on
        self.fail_load_on = fail_load_on
        self.flag = flag

    def _once(self) -> bool:
        if self.flag is None or os.path.exists(self.flag):
            return False
        Path(self.flag).write_text(str(os.getpid()))
        return True

    def rerank(self, query, candidates):
        if query.query_id == self.crash_on and self._once():
            os._exit(1)
        if query.query_id == self.fail_load_on and self._once():
            raise ModelLoadError("the fake model cannot be loaded (once)")
        if any(d.doc_id in self.poison for d in candidates):
            raise RuntimeError("cannot tokenise this document")
        scores = {d.doc_id: zlib.crc32(f"{query.text}|{d.text}".encode()) / 2**32 for d in candidates}
        return RerankResult(Ranking.from_scores(query.query_id, scores), prompt_tokens=len(candidates))

    def rerank_batch(self, queries, candidates):
        return [self.rerank(q, c) for q, c in zip(queries, candidates)]

    def describe(self):
        return {"method": "hash"}


class HashFactory:
    """A reranker factory (picklable) building :class:`HashReranker` with fixed arguments."""

    def __init__(self, **kwargs) -> None:
        self.kwargs = kwargs

    def __call__(self, method):
        return HashReranker(**self.kwargs)


def register_fake() -> None:
    """Worker setup: register the eval tests' ``fake`` reranker in this process's registry."""
    from heedrank import registry

    registry._RERANKERS["fake"] = FakeReranker


def broken_setup() -> None:
    """Worker setup that fails (an untyped error in a worker)."""
    raise RuntimeError("no GPU driver on this node")


def dl19_batch_inputs(dl19_dir: Path, tmp_path: Path, queries: int = 5, depth: int = 30):
    """(topics, run, docs) of the first ``queries`` DL19 topics with BM25 hits, the run cut to
    ``depth`` hits per query, and the rank_llm run JSON with the passages."""
    from heedrank.data import load_trec_run

    run = load_trec_run(dl19_dir / "trec_results_BM25_dl19_top100.txt.gz")
    lines = [line for line in (dl19_dir / "topics.dl19-passage.txt").read_text().splitlines() if line.strip()]
    chosen = [line for line in lines if line.split("\t")[0] in run][:queries]
    topics = tmp_path / "topics.tsv"
    topics.write_text("".join(line + "\n" for line in chosen))
    run_file = tmp_path / "run.trec"
    out = []
    for line in chosen:
        qid = line.split("\t")[0]
        hits = sorted(run[qid].items(), key=lambda kv: (-kv[1], kv[0]))[:depth]
        out.extend(f"{qid} Q0 {d} {r} {s!r} bm25\n" for r, (d, s) in enumerate(hits, 1))
    run_file.write_text("".join(out))
    return topics, run_file, dl19_dir / "retrieve_results_BM25_dl19_top100.json.gz"


class StopAfterFirstShard:
    """Worker setup of the distributed KV store build tests: in this actor process, the first
    shard committed by any actor (the flag file, created atomically, says which) is followed
    by a stop, once: ``mode="exit"`` kills the actor process (``os._exit``: Ray restarts it
    and retries its part), ``mode="raise"`` raises a typed KVStoreError (the driver stops)."""

    def __init__(self, flag: str, mode: str = "exit") -> None:
        self.flag, self.mode = flag, mode

    def __call__(self) -> None:
        from heedrank.errors import KVStoreError
        from heedrank.index import kv as kvstore

        original = kvstore.KVStore.put_many
        flag, mode = self.flag, self.mode

        def put_many(store, items, **kw):
            n = original(store, items, **kw)
            try:
                fd = os.open(flag, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            except FileExistsError:
                return n
            os.write(fd, f"{os.getpid()} {sorted(items)}".encode())
            os.close(fd)
            if mode == "exit":
                os._exit(1)
            raise KVStoreError("stopped after one committed shard (test)")

        kvstore.KVStore.put_many = put_many

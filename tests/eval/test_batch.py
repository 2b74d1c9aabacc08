"""rerank-batch: streaming output, resume after interruption (same bytes as an uninterrupted
run), torn tails, failure isolation, parameter checks. Fake reranker, tiny inline data."""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path

import pytest

from heedrank.errors import ContextOverflowError, ValidationError
from heedrank.protocols import RerankResult
from heedrank.types import Ranking
from heedrank.eval.batch import rerank_batch

QIDS = ["q3", "q1", "q4", "q2"]  # topics-file order (not sorted) is the processing order
DOCS = {f"p{i}": f"passage number {i} about topic {i % 3}" for i in range(12)}


class HashReranker:
    """Deterministic scores from crc32(query, text); raises on a document containing POISON,
    and KeyboardInterrupt on call number ``interrupt_at`` (1-based)."""

    name = "hash"

    def __init__(self, interrupt_at: int | None = None, max_fit: int | None = None) -> None:
        self.calls = 0
        self.interrupt_at = interrupt_at
        self.max_fit = max_fit

    def rerank(self, query, candidates):
        self.calls += 1
        if self.interrupt_at is not None and self.calls == self.interrupt_at:
            raise KeyboardInterrupt
        if any("POISON" in d.text for d in candidates):
            raise RuntimeError("cannot tokenise this document")
        if self.max_fit is not None and len(candidates) > self.max_fit:
            raise ContextOverflowError("too long", max_candidates=self.max_fit)
        scores = {d.doc_id: zlib.crc32(f"{query.text}|{d.text}".encode()) / 2**32 for d in candidates}
        return RerankResult(Ranking.from_scores(query.query_id, scores))

    def rerank_batch(self, queries, candidates):
        return [self.rerank(q, c) for q, c in zip(queries, candidates)]

    def describe(self):
        return {"method": "hash"}


@pytest.fixture
def inputs(tmp_path: Path):
    topics = tmp_path / "topics.tsv"
    topics.write_text("".join(f"{q}\tquery text {q}\n" for q in QIDS) + "q9\tno hits for this one\n")
    run = tmp_path / "run.trec"
    lines = []
    for j, q in enumerate(sorted(QIDS)):
        for r in range(8):
            lines.append(f"{q} Q0 p{(j * 3 + r) % 12} {r + 1} {10.0 - r} bm25\n")
    run.write_text("".join(lines))
    docs = tmp_path / "run.json.gz"
    entries = [{"query": f"query text {q}", "hits": [{"qid": q, "docid": d, "content": t, "rank": 1, "score": 1.0}
                                                     for d, t in DOCS.items()]} for q in QIDS]
    with gzip.open(docs, "wt") as f:
        json.dump(entries, f)
    return topics, run, docs


def _batch(inputs, out, reranker, **kw):
    topics, run, docs = inputs
    kw.setdefault("candidates", 5)
    return rerank_batch(topics, run, docs, out, method="hash", factory=lambda m: reranker, show_progress=False, **kw)


def test_output_format_and_order(inputs, tmp_path):
    out = tmp_path / "out.trec"
    summary = _batch(inputs, out, HashReranker())
    assert summary.done == 4 and summary.skipped == 0 and summary.documents == 20
    lines = out.read_text().splitlines()
    assert len(lines) == 4 * 8
    assert [ln.split()[0] for ln in lines[::8]] == QIDS  # streamed in topics order
    first = [ln.split() for ln in lines[:8]]
    assert [int(f[3]) for f in first] == list(range(1, 9))
    assert all(f[1] == "Q0" and f[5] == "heedrank-hash-c5" for f in first)
    scores = [float(f[4]) for f in first]
    assert scores == sorted(scores, reverse=True)
    progress = [json.loads(x) for x in out.with_name("out.trec.progress").read_text().splitlines()]
    assert progress[0]["header"]["candidates"] == 5
    assert [p["qid"] for p in progress[1:]] == QIDS
    assert progress[-1]["offset"] == out.stat().st_size


def test_interrupted_and_resumed_equals_uninterrupted(inputs, tmp_path):
    full = tmp_path / "full.trec"
    _batch(inputs, full, HashReranker())
    out = tmp_path / "resumed.trec"
    with pytest.raises(KeyboardInterrupt):
        _batch(inputs, out, HashReranker(interrupt_at=3))  # dies on the third query
    assert len(out.read_text().splitlines()) == 2 * 8
    reranker = HashReranker()
    summary = _batch(inputs, out, reranker)
    assert summary.skipped == 2 and summary.done == 2 and reranker.calls == 2  # no query redone
    assert out.read_bytes() == full.read_bytes()
    again = _batch(inputs, out, HashReranker())  # a finished batch: nothing to do
    assert again.done == 0 and again.skipped == 4 and out.read_bytes() == full.read_bytes()


def test_torn_output_and_progress_tails_are_dropped(inputs, tmp_path):
    full = tmp_path / "full.trec"
    _batch(inputs, full, HashReranker())
    out = tmp_path / "torn.trec"
    with pytest.raises(KeyboardInterrupt):
        _batch(inputs, out, HashReranker(interrupt_at=2))
    with open(out, "a") as f:  # a query half written when the process died
        f.write("q1 Q0 p3 1 0.9 heedrank-hash-c5\nq1 Q0 p4 2 0.")
    with open(out.with_name("torn.trec.progress"), "a") as f:
        f.write('{"qid": "q1", "off')
    _batch(inputs, out, HashReranker())
    assert out.read_bytes() == full.read_bytes()


def test_a_failing_document_is_isolated_and_the_query_completes(inputs, tmp_path, caplog):
    topics, run, _ = inputs
    docs = dict(DOCS)
    docs["p1"] = "POISON " + docs["p1"]
    poisoned = tmp_path / "poisoned.json.gz"
    with gzip.open(poisoned, "wt") as f:
        json.dump([{"query": "x", "hits": [{"qid": "q1", "docid": d, "content": t, "rank": 1, "score": 1.0}
                                           for d, t in docs.items()]}], f)
    out = tmp_path / "out.trec"
    with caplog.at_level("WARNING", logger="heedrank.eval.batch"):
        summary = rerank_batch(topics, run, poisoned, out, method="hash", candidates=5,
                               factory=lambda m: HashReranker(), show_progress=False)
    assert summary.done == 4
    hit_queries = [q for q, ids in summary.failed_documents.items() if ids == ["p1"]]
    assert hit_queries  # p1 is among the top 5 of some queries
    assert any("document p1 cannot be reranked" in r.message for r in caplog.records)
    lines = [ln.split() for ln in out.read_text().splitlines()]
    for q in hit_queries:
        ranked = [ln[2] for ln in lines if ln[0] == q]
        assert len(ranked) == 8 and "p1" in ranked
        assert ranked.index("p1") == 4  # below the 4 reranked candidates, first of the rest
    progress = [json.loads(x) for x in out.with_name("out.trec.progress").read_text().splitlines()[1:]]
    assert {p["status"] for p in progress if p["qid"] in hit_queries} == {"partial"}


def test_context_overflow_reranks_the_candidates_that_fit(inputs, tmp_path):
    out = tmp_path / "out.trec"
    summary = _batch(inputs, out, HashReranker(max_fit=3))
    assert summary.done == 4 and not summary.first_stage_queries
    progress = [json.loads(x) for x in out.with_name("out.trec.progress").read_text().splitlines()[1:]]
    assert {p["status"] for p in progress} == {"partial"}


def test_other_parameters_refuse_to_resume(inputs, tmp_path):
    out = tmp_path / "out.trec"
    with pytest.raises(KeyboardInterrupt):
        _batch(inputs, out, HashReranker(interrupt_at=2))
    with pytest.raises(ValidationError, match=r"differing: \['candidates', 'tag'\]"):
        _batch(inputs, out, HashReranker(), candidates=4)
    summary = _batch(inputs, out, HashReranker(), candidates=4, overwrite=True)
    assert summary.done == 4 and summary.skipped == 0


def test_output_without_progress_is_refused(inputs, tmp_path):
    out = tmp_path / "out.trec"
    out.write_text("q1 Q0 x 1 1.0 other\n")
    with pytest.raises(ValidationError, match="without its progress file"):
        _batch(inputs, out, HashReranker())


def test_max_queries_and_depth(inputs, tmp_path):
    out = tmp_path / "out.trec"
    summary = _batch(inputs, out, HashReranker(), max_queries=2, depth=3)
    assert summary.queries == 2
    lines = out.read_text().splitlines()
    assert len(lines) == 6 and [ln.split()[0] for ln in lines[::3]] == QIDS[:2]


def test_cli_command(inputs, tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from heedrank import registry
    from heedrank.cli import app

    class Registered(HashReranker):
        @classmethod
        def from_config(cls, config):
            return cls()

    monkeypatch.setitem(registry._RERANKERS, "hash", Registered)
    topics, run, docs = inputs
    out = tmp_path / "cli.trec"
    args = ["rerank-batch", "--topics", str(topics), "--run", str(run), "--docs", str(docs), "--out", str(out),
            "--method", "hash", "--candidates", "3", "--no-progress"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output[result.output.index("{"):])
    assert summary["done"] == 4 and summary["queries_per_second"] > 0
    again = CliRunner().invoke(app, args)
    assert json.loads(again.output[again.output.index("{"):])["skipped"] == 4
    bad = CliRunner().invoke(app, [*args[:-2], "4", "--no-progress"])
    assert bad.exit_code == 2 and "other parameters" in bad.output


def test_the_summary_counts_documents_missing_from_the_store(inputs, tmp_path):
    """A first-stage hit whose document the store lacks is neither reranked nor written, and the
    summary (and the progress line) names it per query."""
    topics, run, docs = inputs
    first = sorted(QIDS)[0]
    with open(run, "a") as f:
        f.write(f"{first} Q0 ghost-1 2 9.5 bm25\n{first} Q0 ghost-2 9 0.5 bm25\n")
    out = tmp_path / "out.trec"
    summary = _batch(inputs, out, HashReranker(), candidates=5)
    assert summary.missing_documents == {first: ["ghost-1", "ghost-2"]}
    assert summary.to_dict()["missing_documents"] == {first: ["ghost-1", "ghost-2"]}
    assert "ghost" not in out.read_text()
    progress = [json.loads(x) for x in out.with_name("out.trec.progress").read_text().splitlines()[1:]]
    assert [p.get("missing") for p in progress if p["qid"] == first] == [["ghost-1", "ghost-2"]]
    assert all("missing" not in p for p in progress if p["qid"] != first)

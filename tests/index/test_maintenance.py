"""The document-store contract of an Index (``WritableDocStore``) and its maintenance module:
every store method the index calls is declared, and one recovery path
(``maintenance.reconcile``) serves both the catch-up at open and compaction."""

from __future__ import annotations

import ast
import inspect
import json
from pathlib import Path

import numpy as np
import pytest

import heedrank.index.kv.build as kv_build
import heedrank.index.lookups as lookups
import heedrank.index.maintenance as maintenance
import heedrank.index.searching as searching
import heedrank.index.store as store_module
import heedrank.index.writing as writing
from heedrank.index.builder import build_index
from heedrank.index.dense import DenseParams
from heedrank.index.docstore import SQLiteDocStore
from heedrank.index.hashing import HashingEncoder
from heedrank.index.memory import InMemoryDocStore
from heedrank.index.store import Index
from heedrank.protocols import DocStore, WritableDocStore
from heedrank.retriever.bm25 import BM25Retriever
from heedrank.retriever.dense import DenseRetriever
from heedrank.types import Document, Query


def _docs(n: int = 30) -> list[Document]:
    return [Document(f"d{i:03d}", f"topic {i % 3} study {i} about apples", f"T{i}", {"cat": f"c{i % 3}"})
            for i in range(n)]


def _protocol_members(proto: type) -> set[str]:
    return {name for name in vars(proto) if not name.startswith("_") or name == "__len__"}


def _docstore_calls(module) -> set[str]:
    """Names of the attributes read on ``self.docstore`` / ``index.docstore`` in a module
    (the index and the modules its methods delegate to, its maintenance, the KV store build)."""
    out = set()
    for node in ast.walk(ast.parse(inspect.getsource(module))):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute)
                and node.value.attr == "docstore" and isinstance(node.value.value, ast.Name)
                and node.value.value.id in ("self", "index")):
            out.add(node.attr)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "len" and node.args
                and isinstance(node.args[0], ast.Attribute) and node.args[0].attr == "docstore"):
            out.add("__len__")
    return out


def test_the_protocol_declares_every_store_method_the_index_calls():
    declared = _protocol_members(WritableDocStore) | _protocol_members(DocStore)
    used = set().union(*map(_docstore_calls, (store_module, writing, searching, lookups, maintenance, kv_build)))
    assert used >= {"upsert", "delete", "vid_doc_pairs", "get_by_vids", "filter_vids", "pending_vectors",
                    "discard_vectors", "next_vid", "close", "__len__", "iter_documents"}
    assert used <= declared, sorted(used - declared)
    for name in declared - {"__len__"}:
        doc = inspect.getdoc(getattr(WritableDocStore, name))
        assert doc, f"WritableDocStore.{name} has no docstring"


def test_index_code_has_no_type_ignores_nor_getattr_probing():
    for module in (store_module, writing, searching, lookups, maintenance):
        source = inspect.getsource(module)
        assert "type: ignore" not in source, module.__name__
        assert "getattr(" not in source, module.__name__


def test_both_stores_implement_it_and_the_index_refuses_others(tmp_path: Path):
    with SQLiteDocStore(tmp_path / "docs.sqlite", create=True) as sqlite:
        assert isinstance(sqlite, WritableDocStore)
    assert isinstance(InMemoryDocStore(_docs(2)), WritableDocStore)

    class ReadOnly:
        def get_many(self, doc_ids):
            return {}

        def __len__(self):
            return 0

    assert isinstance(ReadOnly(), DocStore) and not isinstance(ReadOnly(), WritableDocStore)
    with pytest.raises(TypeError, match="WritableDocStore"):
        Index(path=None, params={}, docstore=ReadOnly(), bm25=None)  # type: ignore[arg-type]


def test_catch_up_follows_a_store_that_moved_ahead():
    """An in-memory index whose store changed behind its back (as a crash leaves an index
    directory): catching up masks, adds and re-encodes, like at open."""
    ix = Index.from_documents(_docs(), encoder=HashingEncoder(64), dense_params=DenseParams("hnsw", hnsw_m=8))
    ix.docstore.delete(["d001", "d002"])
    ix.docstore.upsert([Document("d003", "zebra savanna", "Z"), Document("new", "zebra herd", "")])
    done = maintenance.catch_up(ix)
    # d001, d002 and the old d003 gone; the new d003 and "new" added
    assert (done.bm25_deleted, done.bm25_added, done.vectors_deleted, done.vectors_added) == (3, 2, 3, 2)
    for cls in (BM25Retriever, DenseRetriever):
        (ranking,) = cls.from_index(ix).retrieve([Query("q", "zebra savanna herd")], 40)
        assert set(ranking.doc_ids[:2]) == {"d003", "new"}, cls
        assert not {"d001", "d002"} & set(ranking.doc_ids), cls
    assert maintenance.catch_up(ix).changes == 0  # in line now


def test_reconcile_with_nothing_to_do_changes_nothing():
    ix = Index.from_documents(_docs(), encoder=HashingEncoder(64))
    live, _ = ix.docstore.vid_doc_pairs()
    done = maintenance.reconcile(ix.bm25, ix.dense, live, ix.docstore, None, group_bits=ix.group_bits)
    assert done.changes == 0 and done.dense is ix.dense


def test_open_and_compaction_share_one_recovery_path(tmp_path: Path, monkeypatch):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    rows = [{"_id": d.doc_id, "title": d.title, "text": d.text, "metadata": dict(d.metadata)} for d in _docs()]
    (corpus / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "ix"
    build_index(corpus, out, encoder=HashingEncoder(64), dense_params=DenseParams("hnsw", hnsw_m=8), show_progress=False)

    calls: list[str] = []
    real = maintenance.reconcile

    def counting(*args, **kwargs):
        done = real(*args, **kwargs)
        calls.append(inspect.stack()[1].function)
        return done

    monkeypatch.setattr(maintenance, "reconcile", counting)
    enc = HashingEncoder(64)
    ix = Index.open(out, encoder=enc)
    assert calls == ["catch_up"]
    ix.add_documents([Document("zz", "zebra", "")])
    ix.delete_documents(["d004"])
    again = Index.open(out, encoder=enc)  # without close(): the files lag, SQLite is ahead
    assert calls == ["catch_up", "catch_up"]
    s = again.stats()
    assert (s["bm25_delta"], s["tombstones"], s["num_docs"]) == (1, 1, 30)
    summary = again.compact()
    assert calls == ["catch_up", "catch_up", "compact"]
    assert summary["tombstones_dropped"] == 1 and summary["bm25_delta_folded"] == 1
    again.close()
    ix.docstore.close()  # not ix.close(): its stale vector file would overwrite the compacted one
    third = Index.open(out, encoder=enc)
    s = third.stats()
    assert (s["bm25_delta"], s["bm25_deleted_rows"], s["tombstones"], s["num_docs"]) == (0, 0, 0, 30)
    assert third.filter_vids({"must": [{"has_id": ["zz", "d004"]}]}).tolist() == [30]
    assert not [p.name for p in out.iterdir() if p.name.startswith(".")]
    third.close()


def test_interrupted_swap_is_finished_or_undone(tmp_path: Path):
    (tmp_path / ".bm25.new").mkdir()
    (tmp_path / ".bm25.new" / "vids.npy").write_bytes(np.zeros(1).tobytes())
    maintenance.recover_swapped_dir(tmp_path, "bm25")
    assert (tmp_path / "bm25" / "vids.npy").is_file() and not (tmp_path / ".bm25.new").exists()
    (tmp_path / "bm25").rename(tmp_path / ".bm25.old")
    (tmp_path / ".bm25.new").mkdir()  # incomplete: no vids.npy, the old folder comes back
    maintenance.recover_swapped_dir(tmp_path, "bm25")
    assert (tmp_path / "bm25" / "vids.npy").is_file()

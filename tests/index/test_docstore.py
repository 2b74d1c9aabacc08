"""SQLiteDocStore and InMemoryDocStore."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from heedrank.errors import NotFoundError, ValidationError
from heedrank.protocols import DocStore
from heedrank.types import Document
from heedrank.index.docstore import SQLiteDocStore
from heedrank.index.memory import InMemoryDocStore

DOCS = [
    Document("d1", "Bones need vitamin D.", "Vitamin D", {"year": 2020, "tags": ["bone", "diet"], "nested": {"a": 1}}),
    Document("d2", "Statins and cancer.", "", {}),
    Document("é-3", "Unicode ✓ text", "Tïtle", {"url": "http://x/ü"}),
]


@pytest.fixture
def store(tmp_path: Path) -> SQLiteDocStore:
    s = SQLiteDocStore(tmp_path / "docs.sqlite", create=True)
    assert s.add_many(DOCS) == 3
    yield s
    s.close()


def test_round_trip_with_metadata(store: SQLiteDocStore) -> None:
    assert isinstance(store, DocStore)
    assert len(store) == 3
    got = store.get_many(["é-3", "missing", "d1", "d1"])
    assert list(got) == ["é-3", "d1"]  # request order, missing absent, deduplicated
    assert got["d1"] == DOCS[0]
    assert got["d1"].metadata["tags"] == ["bone", "diet"]
    assert got["d1"].metadata["nested"] == {"a": 1}
    assert got["é-3"] == DOCS[2]
    assert store.get("d2") == DOCS[1]
    with pytest.raises(NotFoundError):
        store.get("nope")
    assert store.get_many([]) == {}


def test_vid_is_insertion_position(store: SQLiteDocStore) -> None:
    store.add_many([Document("d4", "four")])
    assert store.doc_ids() == ["d1", "d2", "é-3", "d4"]
    assert store.vids_of(["d4", "d1", "zz"]) == {"d4": 3, "d1": 0}
    assert [d.doc_id for d in store.iter_documents(batch_size=2)] == ["d1", "d2", "é-3", "d4"]
    assert "d4" in store and "zz" not in store


def test_duplicate_id_rolls_back(store: SQLiteDocStore) -> None:
    with pytest.raises(ValidationError, match="duplicate"):
        store.add_many([Document("d5", "five"), Document("d1", "again")])
    assert len(store) == 3 and "d5" not in store


def test_reopen_and_wal(tmp_path: Path, store: SQLiteDocStore) -> None:
    store.close()
    again = SQLiteDocStore(tmp_path / "docs.sqlite")
    assert again.get_many(["d1"])["d1"] == DOCS[0]
    mode = again._conn().execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
    again.close()
    with pytest.raises(ValidationError, match="closed"):
        len(again)


def test_missing_or_foreign_file(tmp_path: Path) -> None:
    with pytest.raises(NotFoundError):
        SQLiteDocStore(tmp_path / "nope.sqlite")
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database at all" * 100)
    with pytest.raises(NotFoundError):
        SQLiteDocStore(junk)


def test_many_chunks_and_threads(tmp_path: Path) -> None:
    s = SQLiteDocStore(tmp_path / "big.sqlite", create=True)
    s.add_many(Document(f"id{i:04d}", f"text {i}") for i in range(1200))
    ids = [f"id{i:04d}" for i in range(0, 1200, 1)]
    errors: list[BaseException] = []

    def reader(offset: int) -> None:
        try:
            for _ in range(5):
                got = s.get_many(ids[offset:] + ids[:offset])
                assert len(got) == 1200 and got[f"id{offset:04d}"].text == f"text {offset}"
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(i * 100,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(s._all) >= 2  # one connection per reading thread
    s.close()


def test_in_memory_store() -> None:
    store = InMemoryDocStore(DOCS)
    assert isinstance(store, DocStore)
    assert len(store) == 3 and store.doc_ids() == ["d1", "d2", "é-3"]
    assert list(store.get_many(["d2", "x", "d1"])) == ["d2", "d1"]
    assert store.get("d1").metadata["year"] == 2020
    with pytest.raises(ValidationError):
        InMemoryDocStore([DOCS[0], DOCS[0]])
    with pytest.raises(NotFoundError):
        store.get("x")

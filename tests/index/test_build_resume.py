"""A build killed during its dense encoding resumes from the chunks already encoded
(:class:`heedrank.index.builder.VectorCheckpoint`): only the rest is encoded, and the index equals
one built in one go. Inline corpus, hashing encoder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from heedrank.index.builder import VectorCheckpoint, build_index
from heedrank.index.hashing import HashingEncoder
from heedrank.index.store import Index

N = 2600  # three chunks of 1,000 documents


class Killed(BaseException):
    """Stands for kill -9 / Ctrl-C: not an input error, so the checkpoint stays."""


class Counting(HashingEncoder):
    def __init__(self, fail_after: int | None = None) -> None:
        super().__init__(64)
        self.calls: list[int] = []
        self.fail_after = fail_after

    def encode_documents(self, texts, *, show_progress: bool = False):  # type: ignore[no-untyped-def]
        if self.fail_after is not None and len(self.calls) == self.fail_after:
            raise Killed()
        self.calls.append(len(texts))
        return super().encode_documents(texts, show_progress=show_progress)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    words = ["vitamin", "statin", "fish", "oil", "bone", "milk", "colon", "heart", "risk", "diet"]
    rng = np.random.default_rng(0)
    rows = [{"_id": f"d{i}", "title": "", "text": " ".join(rng.choice(words, 8))} for i in range(N)]
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_killed_build_encodes_only_what_is_left(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "ix"
    with pytest.raises(Killed):
        build_index(corpus, out, encoder=Counting(fail_after=2), show_progress=False)
    assert not out.exists()
    (folder,) = tmp_path.glob(".ix.vectors-*")
    assert VectorCheckpoint(folder).done() == 2
    again = Counting()
    params = build_index(corpus, out, encoder=again, show_progress=False)
    assert again.calls == [600]  # the third chunk only
    assert not list(tmp_path.glob(".ix.*")) and params["num_docs"] == N
    assert set(params["build_stages"]) == {"read", "docstore", "bm25", "encode", "faiss"}
    whole = tmp_path / "whole"
    build_index(corpus, whole, encoder=HashingEncoder(64), show_progress=False)
    a, b = Index.open(out, encoder=HashingEncoder(64)), Index.open(whole, encoder=HashingEncoder(64))
    q = HashingEncoder(64).encode_queries(["fish oil and heart risk"])[0]
    for x, y in zip(a.dense.search(q[None, :], 20), b.dense.search(q[None, :], 20)):
        np.testing.assert_array_equal(x, y)
    assert (out / "vectors.faiss").read_bytes() == (whole / "vectors.faiss").read_bytes()
    a.close(), b.close()


def test_a_build_failing_on_its_input_leaves_no_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "dup.jsonl"
    path.write_text(json.dumps({"_id": "a", "text": "one"}) + "\n" + json.dumps({"_id": "a", "text": "two"}) + "\n")
    with pytest.raises(Exception, match="duplicate"):
        build_index(path, tmp_path / "ix", encoder=HashingEncoder(16), show_progress=False)
    assert list(tmp_path.iterdir()) == [path]


def test_a_build_without_dense_params_picks_the_index_type_by_size(corpus: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """``build_index`` with no ``dense_params`` builds ``auto``: flat up to ``FLAT_MAX`` vectors, else
    IVF (the API default once built flat at any size: a 1M index searched 1M vectors per query)."""
    from heedrank.index import dense_build

    assert build_index(corpus, tmp_path / "small", encoder=HashingEncoder(16), show_progress=False)["dense"][
        "index_type"].endswith("IndexFlatIP)")
    monkeypatch.setattr(dense_build, "FLAT_MAX", 1000)
    params = build_index(corpus, tmp_path / "big", encoder=HashingEncoder(16), show_progress=False)
    assert params["dense"]["params"]["index_type"] == "ivf" and params["dense"]["params"]["nlist"] == 51


def test_a_build_removes_what_killed_builds_left_and_keeps_a_live_ones(corpus: Path, tmp_path: Path) -> None:
    """A build killed with -9 leaves its temporary folder (``.<name>.tmp-*``, the SQLite store and
    BM25 half-written); the next build removes it, but never the folder of a build still running."""
    import os
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = tmp_path / ".ix.tmp-deadbeef"
    left.mkdir()
    (left / "build.pid").write_text(dead.stdout.strip())
    (left / "docs.sqlite").write_bytes(b"half written")
    live = tmp_path / ".ix.tmp-0a11ce00"
    live.mkdir()
    (live / "build.pid").write_text(str(os.getpid()))
    fresh = tmp_path / ".ix.tmp-5ea15ea1"  # no owner file yet, just made: kept
    fresh.mkdir()
    build_index(corpus, tmp_path / "ix", encoder=HashingEncoder(16), show_progress=False)
    assert not left.exists() and live.is_dir() and fresh.is_dir()
    assert sorted(p.name for p in tmp_path.glob(".ix.tmp-*")) == [".ix.tmp-0a11ce00", ".ix.tmp-5ea15ea1"]

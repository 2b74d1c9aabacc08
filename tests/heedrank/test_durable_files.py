"""heedrank.files' durable writes (every durable file of an index and its KV store goes through
them): an atomic replace leaves the old content or the new one and no temporary file, also
when the write fails; a path writer (faiss) works the same way; the RAM budgets have one
definition, read by the service's Settings and by code built without them."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from heedrank import registry
from heedrank.config import BLOCK_CACHE_BUDGET, KV_CACHE_BUDGET
from heedrank.errors import ValidationError
from heedrank.files import write_atomic, write_new


def test_write_atomic_replaces_or_leaves_the_file(tmp_path: Path) -> None:
    target = tmp_path / "params.json"
    write_atomic(target, b"old\n")
    write_atomic(target, memoryview(b"new\n"))
    assert target.read_bytes() == b"new\n" and os.listdir(tmp_path) == ["params.json"]

    def full(fd: int, data: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        write_atomic(target, b"lost\n", write=full)
    assert target.read_bytes() == b"new\n" and os.listdir(tmp_path) == ["params.json"]

    def by_path(tmp: Path) -> None:  # a writer that takes a path, as faiss.write_index does
        tmp.write_bytes(b"from a path\n")

    write_atomic(target, by_path)
    write_atomic(tmp_path / "fast", b"x", durable=False)
    assert target.read_bytes() == b"from a path\n" and sorted(os.listdir(tmp_path)) == ["fast", "params.json"]

    def broken(tmp: Path) -> None:
        tmp.write_bytes(b"half")
        raise RuntimeError("writer failed")

    with pytest.raises(RuntimeError):
        write_atomic(target, broken)
    assert target.read_bytes() == b"from a path\n" and sorted(os.listdir(tmp_path)) == ["fast", "params.json"]
    with pytest.raises(FileExistsError):
        write_new(target, b"never")


def test_the_index_params_go_through_it(tmp_path: Path) -> None:
    from heedrank.index.maintenance import write_json

    write_json(tmp_path / "params.json", {"b": 1, "a": [1, 2]})
    assert (tmp_path / "params.json").read_text() == '{\n  "b": 1,\n  "a": [\n    1,\n    2\n  ]\n}\n'
    assert os.listdir(tmp_path) == ["params.json"]


def test_byte_budgets_have_one_definition(monkeypatch) -> None:
    from heedrank.settings import Settings

    assert (KV_CACHE_BUDGET.env, KV_CACHE_BUDGET.default) == ("HEEDRANK_KV_CACHE_BYTES", 512 * 2**20)
    assert (BLOCK_CACHE_BUDGET.env, BLOCK_CACHE_BUDGET.default) == ("HEEDRANK_BLOCK_CACHE_BYTES", 1 << 30)
    assert [KV_CACHE_BUDGET.parse(v) for v in (None, " ", "12_345", " 7 ", 0)] == [512 * 2**20, 512 * 2**20, 12345, 7, 0]
    for bad in ("lots", "-1", 1.5, True):
        with pytest.raises(ValidationError, match="HEEDRANK_KV_CACHE_BYTES"):
            KV_CACHE_BUDGET.parse(bad)
    monkeypatch.setenv("HEEDRANK_BLOCK_CACHE_BYTES", "1_000")
    assert BLOCK_CACHE_BUDGET.from_env() == 1000
    settings = Settings(kv_cache_bytes="2_048")
    assert (settings.kv_cache_bytes, settings.block_cache_bytes) == (2048, 1000)
    config = settings.pipeline_config("ix")
    assert (config.kv_cache_bytes, config.block_cache_bytes) == (2048, 1000)
    with pytest.raises(ValueError, match="HEEDRANK_KV_CACHE_BYTES"):
        Settings(kv_cache_bytes="lots")


def test_only_a_reranker_with_a_block_tier_gets_its_budget(monkeypatch) -> None:
    built: dict[str, object] = {}

    class Plain:
        @classmethod
        def from_config(cls, config: object) -> str:
            built["plain"] = config
            return "plain"

    class Tiered:
        build_resources = ("block_cache_bytes",)

        @classmethod
        def from_config(cls, config: object, *, block_cache_bytes: int | None = None) -> str:
            built["tiered"] = block_cache_bytes
            return "tiered"

    monkeypatch.setitem(registry._RERANKERS, "plain", Plain)
    monkeypatch.setitem(registry._RERANKERS, "tiered", Tiered)

    class Config:
        def __init__(self, method: str) -> None:
            self.method = method

    assert registry.build_reranker(Config("plain"), block_cache_bytes=5) == "plain"
    assert registry.build_reranker(Config("tiered"), block_cache_bytes=5) == "tiered" and built["tiered"] == 5


def test_replace_dir_puts_a_complete_folder_in_place(tmp_path, monkeypatch) -> None:
    """Training checkpoints: the new folder replaces the old one; a save that stops between its
    two renames leaves the old one findable as ``.old``; every file is fsynced first."""
    import os

    from heedrank.files import existing_dir, replace_dir

    final = tmp_path / "checkpoint"
    assert existing_dir(final) is None
    for step in (1, 2):
        tmp = tmp_path / "checkpoint.tmp"
        (tmp / "adapter").mkdir(parents=True)
        (tmp / "state.json").write_text(f'{{"step": {step}}}')
        (tmp / "adapter" / "w.bin").write_bytes(b"x" * step)
        replace_dir(tmp, final)
        assert (final / "state.json").read_text() == f'{{"step": {step}}}' and not tmp.exists()
        assert not (tmp_path / "checkpoint.old").exists() and existing_dir(final) == final
    synced: list[str] = []
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), real(fd)))
    tmp = tmp_path / "checkpoint.tmp"
    tmp.mkdir()
    (tmp / "state.json").write_text('{"step": 3}')
    real_rename = type(tmp).rename
    calls = []

    def stop_at_second_rename(self, target):
        calls.append(target)
        if len(calls) == 2:
            raise OSError("killed between the renames (test)")
        return real_rename(self, target)

    monkeypatch.setattr(type(tmp), "rename", stop_at_second_rename)
    try:
        replace_dir(tmp, final)
    except OSError:
        pass
    assert any(s.endswith("checkpoint.tmp/state.json") for s in synced)  # fsynced before any rename
    found = existing_dir(final)
    assert found == tmp_path / "checkpoint.old" and (found / "state.json").read_text() == '{"step": 2}'

"""Fixtures of the evaluation tests."""

from __future__ import annotations

import pytest

from heedrank import registry
from eval_fakes import FakeReranker


@pytest.fixture
def fake_reranker(monkeypatch):
    monkeypatch.setitem(registry._RERANKERS, "fake", FakeReranker)
    return FakeReranker

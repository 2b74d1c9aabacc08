"""Importing the index and retriever packages must not import heavy libraries."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ["torch", "faiss", "sentence_transformers", "transformers", "bm25s", "datasets", "Stemmer"]
MODULES = [
    "attnrank.data", "attnrank.index.bm25", "attnrank.index.builder", "attnrank.index.dense", "attnrank.index.docstore", "attnrank.index.encoder",
    "attnrank.index.filters", "attnrank.index.hashing", "attnrank.index.memory", "attnrank.index.passages", "attnrank.index.planner", "attnrank.index.rwlock",
    "attnrank.index.store", "attnrank.retriever.bm25", "attnrank.retriever.dense", "attnrank.retriever.fusion", "attnrank.retriever.hybrid", "attnrank.retriever.run",
]


def test_no_heavy_import_at_module_import() -> None:
    code = (
        "import importlib, json, sys\n"
        f"for m in {MODULES!r}: importlib.import_module(m)\n"
        f"print(json.dumps([h for h in {HEAVY!r} if h in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []

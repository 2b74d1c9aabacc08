"""Importing the index and retriever packages must not import heavy libraries."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ["torch", "faiss", "sentence_transformers", "transformers", "bm25s", "datasets", "Stemmer"]
MODULES = [
    "attnrank.data", "index.bm25", "index.builder", "index.dense", "index.docstore", "index.encoder",
    "index.filters", "index.hashing", "index.memory", "index.passages", "index.planner", "index.rwlock",
    "index.store", "retriever.bm25", "retriever.dense", "retriever.fusion", "retriever.hybrid", "retriever.run",
]


def test_no_heavy_import_at_module_import() -> None:
    code = (
        "import importlib, json, sys\n"
        f"for m in {MODULES!r}: importlib.import_module(m)\n"
        f"print(json.dumps([h for h in {HEAVY!r} if h in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []

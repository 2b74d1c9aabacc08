"""Importing the index and retriever packages must not import heavy libraries."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ["torch", "faiss", "sentence_transformers", "transformers", "bm25s", "datasets", "Stemmer"]
MODULES = [
    "heedrank.data", "heedrank.index.bm25", "heedrank.index.builder", "heedrank.index.dense", "heedrank.index.docstore", "heedrank.index.encoder",
    "heedrank.index.filters", "heedrank.index.hashing", "heedrank.index.memory", "heedrank.index.passages", "heedrank.index.planner", "heedrank.index.rwlock",
    "heedrank.index.store", "heedrank.retriever.bm25", "heedrank.retriever.dense", "heedrank.retriever.hybrid", "heedrank.retriever.run",
]


def test_no_heavy_import_at_module_import() -> None:
    code = (
        "import importlib, json, sys\n"
        f"for m in {MODULES!r}: importlib.import_module(m)\n"
        f"print(json.dumps([h for h in {HEAVY!r} if h in sys.modules]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []

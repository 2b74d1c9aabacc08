"""Readers of the real data in ``../shared/data`` that tests share (the fixtures are in conftest.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def read_nfcorpus(nfcorpus_dir: Path, n: int) -> list[Any]:
    """The first ``n`` NFCorpus documents (corpus file order), as :class:`heedrank.types.Document`."""
    import gzip
    import json

    from heedrank.types import Document

    docs = []
    with gzip.open(nfcorpus_dir / "corpus.jsonl.gz", "rt") as f:
        for line in f:
            d = json.loads(line)
            docs.append(Document(d["_id"], d["text"], d.get("title", "")))
            if len(docs) == n:
                break
    return docs

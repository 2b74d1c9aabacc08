"""Attention dumps: per query, the calibrated per-head token attention of one ICR pass
(float16, all layers), the prompt's token ids and document spans, the candidates with their
first-stage scores and qrels grades (docs/design/algorithms.md section 2). Written by the evaluator
(``eval --dump``) and by :func:`heedrank.lab.head_study.dump_attention`; read by head detection and
weight fitting (:mod:`heedrank.lab.train.icr_heads`) and the ablation (:mod:`heedrank.lab.head_study`). Depends on nothing else in
``eval``, so the harness can write dumps without importing the heads study.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from heedrank.errors import NotFoundError, ValidationError
from heedrank.types import Qrels

logger = logging.getLogger(__name__)

DUMP_FORMAT = 1
"""Version of the dump layout (``meta.json`` + one file per query)."""


def save_dump_item(out: Path, item: Mapping[str, Any]) -> None:
    """Write one query's dump item atomically."""
    import torch

    path = out / f"{_safe(item['query_id'])}.pt"
    tmp = path.with_suffix(".tmp")
    torch.save(dict(item), tmp)
    tmp.replace(path)


def save_dump_from_results(
    out_dir: str | Path, results: Sequence[Any], qrels: Qrels, reranker_info: Mapping[str, Any],
    info: Mapping[str, Any] | None = None,
) -> Path:
    """Attention dump from pipeline search results whose reranker kept its attention
    (ICR option ``keep_attention``); candidates are in first-stage order."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"format": DUMP_FORMAT, "reranker": reranker_info, "shuffle": False, "seed": None, **(info or {})}
    (out / "meta.json").write_text(json.dumps(meta, indent=1, default=str))
    n = 0
    for r in results:
        if r.rerank is None or "attention" not in r.rerank.details:
            continue
        att = r.rerank.details["attention"]
        if len(att["layers"]) != len(att["calibrated"]) or att["layers"] != list(range(len(att["layers"]))):
            raise ValidationError("attention dumps need every layer from 0 (heads='all')")
        k = len(att["spans"])
        cands = r.first_stage.top(k)
        docs = {h.doc_id: h.document for h in r.ranking.hits}
        ids = cands.doc_ids
        save_dump_item(out, {
            "query_id": r.query.query_id, "query": r.query.text, "doc_ids": ids,
            "texts": [docs[d].content if docs.get(d) else "" for d in ids],
            "first_stage_scores": [h.score for h in cands.hits],
            "labels": [int(qrels.get(r.query.query_id, {}).get(d, 0)) for d in ids],
            "spans": att["spans"], "context_ids": att["context_ids"], "calibrated": att["calibrated"],
            "seconds": r.timings.get("rerank", 0.0),
        })
        n += 1
    logger.info("wrote attention dump of %d queries to %s", n, out)
    return out


def dump_file_name(qid: str) -> str:
    """File stem of a query's dump item: the query id with characters other than
    letters, digits, ``-_.`` replaced by ``_``."""
    return _safe(qid)


def _safe(qid: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in qid)


def load_dump(dump_dir: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """``(meta, items)`` of a dump, items sorted by query id. Raises NotFoundError."""
    import torch

    d = Path(dump_dir)
    if not (d / "meta.json").exists():
        raise NotFoundError(f"{d} is not an attention dump (no meta.json); create it with `heedrank lab heads dump`")
    meta = json.loads((d / "meta.json").read_text())
    items = [torch.load(p, weights_only=False) for p in sorted(d.glob("*.pt"))]
    return meta, sorted(items, key=lambda x: x["query_id"])


# ---------------------------------------------------------------------------- detection

"""Shared by the candidate-mask and probe oracles (``test_candidate_mask.py``, ``test_probe.py``)."""

from __future__ import annotations

from typing import Any

MASK_LAYER = 5
"""The shallow ``l*`` the oracles compare paths at (fast, and every layer counts)."""


def calibrated_cached(lm: Any) -> Any:
    """A cached BlockRank at ``l* = MASK_LAYER`` with 40-token blocks, calibrated scoring and no adapter."""
    from heedrank.config import RerankerConfig
    from heedrank.reranker.cached import CachedBlockRankReranker

    return CachedBlockRankReranker(RerankerConfig(method="blockrank-cached", max_doc_tokens=40, options={
        "layer": MASK_LAYER, "scoring": "calibrated", "query_adapter": None}), lm=lm)

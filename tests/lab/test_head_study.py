"""The ICR attention dump and the ablation on a tiny real slice of NFCorpus train (head
detection and the weight fit: tests/lab/train/test_icr_heads.py)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from heedrank.eval.report import load_dump  # noqa: E402
from heedrank.lab.head_study import ablation  # noqa: E402
from heedrank.reranker.heads import HeadSet  # noqa: E402


def test_dump_holds_every_layer_and_head(icr_slice_dump, nfcorpus_train_slice, default_lm):
    meta, items = load_dump(icr_slice_dump)
    assert len(items) == len(nfcorpus_train_slice[0])
    L, H = default_lm.num_layers, default_lm.num_heads
    assert items[0]["calibrated"].shape[:2] == (L, H)
    assert sum(items[0]["labels"]) >= 1
    assert meta["shuffle"] is True


def test_ablation_scores_every_variant(icr_slice_dump, default_lm, tmp_path):
    L, H = default_lm.num_layers, default_lm.num_heads
    heads = ((L - 1, 0), (L - 2, 1))
    weights = tuple(tuple(1.0 if (l, h) in heads else 0.0 for h in range(H)) for l in range(L))
    path = HeadSet(model=default_lm.identity, heads=heads, method="qrscore",
                   scores=tuple(tuple(0.0 for _ in range(H)) for _ in range(L)), weights=weights).save(tmp_path / "h.json")
    result = ablation(icr_slice_dump, path, trials=200)
    assert {"all/none/none", "qr/both/rrf", "learned/none/none"} <= set(result["variants"])
    assert result["deltas"]["all/none/none"]["nDCG@10 vs icr"]["delta"] == 0.0
    assert result["queries"] == 5

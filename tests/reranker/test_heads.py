"""Per-head scores, head selection and head-set files."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from heedrank.errors import NotFoundError, ValidationError  # noqa: E402
from heedrank.reranker.heads import (  # noqa: E402
    HeadSet,
    ndcg_at_k,
    packaged_headset_path,
    per_head_document_scores,
    qrscore,
    resolve_heads,
    select_heads,
)


def test_per_head_scores_mask_each_head_separately():
    c = torch.zeros(1, 2, 8)
    c[0, 0, :7] = torch.tensor([1.0, 1, 1, 1, 1, 1, -10])  # head 0, doc 0: outlier dropped
    c[0, 1, :7] = 1.0  # head 1: constant, all kept
    c[0, :, 7] = 3.0  # doc 1: one token
    s = per_head_document_scores(c, [(0, 7), (7, 8)])
    assert s.shape == (1, 2, 2)
    assert s[0, 0].tolist() == pytest.approx([6.0, 3.0])
    assert s[0, 1].tolist() == pytest.approx([7.0, 3.0])


def test_qrscore_and_ndcg():
    s = torch.tensor([[[3.0, 1.0, 2.0], [0.0, 5.0, 1.0]]])  # (1 layer, 2 heads, 3 docs)
    assert qrscore(s, [True, False, True]).tolist() == [[5.0, 1.0]]
    nd = ndcg_at_k(s, [1, 0, 0])
    assert nd[0, 0] == pytest.approx(1.0)  # head 0 ranks the gold doc first
    assert nd[0, 1] == pytest.approx(0.5)  # gold at rank 3: 1/log2(4)
    assert select_heads([[0.1, 0.9], [0.5, 0.9]], 2) == [(0, 1), (1, 1)]


def test_headset_round_trip_and_resolution(tmp_path):
    hs = HeadSet(model={"name": "m", "sha256": "abc"}, heads=((2, 1), (5, 0)), method="qrscore",
                 scores=((0.0, 1.0), (0.5, 0.2)), detection={"split": "train"})
    path = hs.save(tmp_path / "h.json")
    assert HeadSet.load(path) == hs
    heads, weights = resolve_heads(str(path), {"name": "m", "sha256": "abc"})
    assert heads == [(2, 1), (5, 0)] and weights is None
    with pytest.raises(ValidationError):
        resolve_heads(str(path), {"name": "other", "sha256": "def"})
    with pytest.raises(NotFoundError):
        resolve_heads(str(tmp_path / "missing.json"), {"name": "m"})
    with pytest.raises(NotFoundError):
        resolve_heads("qr", {"name": "no-such-model"})
    assert resolve_heads("all", {}) == (None, None)
    assert resolve_heads([[1, 2], [0, 0]], {}) == ([(0, 0), (1, 2)], None)


def test_the_default_lm_ships_a_qr_head_set(default_lm):
    heads, weights = resolve_heads("qr", default_lm.identity)
    assert len(heads) == 16 and weights is None
    assert all(0 <= l < default_lm.num_layers and 0 <= h < default_lm.num_heads for l, h in heads)
    hs = HeadSet.load(packaged_headset_path(default_lm.identity["name"]))
    assert hs.detection["split"] == "train" and hs.method == "qrscore"


def test_the_shipped_learned_weights_reweight_qr_heads_only(default_lm):
    qr, _ = resolve_heads("qr", default_lm.identity)
    heads, weights = resolve_heads("learned", default_lm.identity)
    assert heads and set(heads) <= set(qr)  # heads with a zero weight are dropped (shallower early exit)
    nonzero = {(l, h) for l, row in enumerate(weights) for h, w in enumerate(row) if w != 0}
    assert nonzero == set(heads) and all(w >= 0 for row in weights for w in row)
    hs = HeadSet.load(packaged_headset_path(default_lm.identity["name"]))
    assert hs.detection["queries"] == 128 and hs.weights_info["support"] == "qr"

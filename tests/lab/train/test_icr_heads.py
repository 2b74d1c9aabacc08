"""ICR head detection and the per-head weight fit (:mod:`heedrank.lab.train.icr_heads`) on a
tiny real slice of NFCorpus train (the dump: tests/conftest.py's ``icr_slice_dump``)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from heedrank.errors import ValidationError  # noqa: E402
from heedrank.reranker.heads import HeadSet, resolve_heads  # noqa: E402
from heedrank.lab.train.icr_heads import detect_heads, fit_head_weights  # noqa: E402


def test_detection_writes_a_valid_head_file_and_the_fit_weights_it(tmp_path, icr_slice_dump, nfcorpus_train_slice,
                                                                    default_lm):
    dump = icr_slice_dump
    L, H = default_lm.num_layers, default_lm.num_heads
    hs = detect_heads(dump, method="qrscore", top_k=4)
    path = hs.save(tmp_path / "heads.json")
    loaded = HeadSet.load(path)
    assert len(loaded.heads) == 4 and len(set(loaded.heads)) == 4
    assert len(loaded.scores) == L and all(len(r) == H for r in loaded.scores)
    best = max((loaded.scores[l][h], l, h) for l in range(L) for h in range(H))
    assert loaded.heads[0] == (best[1], best[2])
    assert loaded.model["sha256"] == default_lm.identity["sha256"]
    assert loaded.detection["split"] is None or loaded.detection["queries"] == len(nfcorpus_train_slice[0])
    heads, _ = resolve_heads(str(path), default_lm.identity)
    assert sorted(heads) == sorted(loaded.heads)
    nd = detect_heads(dump, method="ndcg", top_k=2)
    assert all(0.0 <= x <= 1.0 for row in nd.scores for x in row)
    with pytest.raises(ValidationError, match="method"):
        detect_heads(dump, method="mean")

    fitted = fit_head_weights(dump, path, epochs=5, holdout=0.25)
    assert fitted.weights is not None and len(fitted.weights) == L
    nonzero = {(l, h) for l in range(L) for h in range(H) if fitted.weights[l][h] != 0.0}
    assert nonzero <= set(loaded.heads) and all(w >= 0 for row in fitted.weights for w in row)  # support=qr, nonneg
    wide = fit_head_weights(dump, path, epochs=5, holdout=0.25, support="all", nonneg=False)
    assert wide.weights_info["weighted_heads"] == (max(l for l, _ in loaded.heads) + 1) * H
    with pytest.raises(ValidationError, match="support"):
        fit_head_weights(dump, path, support="some")
    fit_head_weights(dump, path, epochs=5, holdout=0.25)
    assert HeadSet.load(path).weights_info["queries_train"] >= 3

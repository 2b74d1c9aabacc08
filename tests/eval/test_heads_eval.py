"""Head detection and the ablation on a tiny real slice of NFCorpus train."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from heedrank.config import RerankerConfig  # noqa: E402
from heedrank.data import iter_beir_documents, load_beir_qrels, load_beir_queries  # noqa: E402
from heedrank.errors import ValidationError  # noqa: E402
from heedrank.eval.dump import load_dump  # noqa: E402
from heedrank.eval.heads import ablation, detect_heads, dump_attention, fit_head_weights  # noqa: E402
from heedrank.reranker.heads import HeadSet, resolve_heads  # noqa: E402


@pytest.fixture(scope="module")
def tiny_slice(nfcorpus_dir):
    qrels = load_beir_qrels(nfcorpus_dir, "train")
    queries = load_beir_queries(nfcorpus_dir)
    qids = [q for q in sorted(qrels) if q in queries and sum(g > 0 for g in qrels[q].values()) >= 2][:5]
    wanted = {d for q in qids for d in sorted(qrels[q])[:2]}
    docs = {}
    for doc in iter_beir_documents(nfcorpus_dir):
        if doc.doc_id in wanted or len(docs) < 3:
            docs[doc.doc_id] = doc
    cands, scores = {}, {}
    negatives = [d for d in list(docs)[:3] if all(d not in qrels[q] for q in qids)]
    for q in qids:
        pos = [docs[d] for d in sorted(qrels[q])[:2] if d in docs]
        cands[q] = pos + [docs[negatives[0]]]
        scores[q] = [3.0, 2.0, 1.0]
    return [queries[q] for q in qids], cands, scores, qrels


def test_detection_writes_a_valid_head_file(tmp_path, tiny_slice, default_lm):
    qs, cands, scores, qrels = tiny_slice
    dump = dump_attention(tmp_path / "dump", qs, cands, scores, qrels,
                          reranker_config=RerankerConfig(max_doc_tokens=24), shuffle=True, show_progress=False)
    meta, items = load_dump(dump)
    assert len(items) == len(qs)
    L, H = default_lm.num_layers, default_lm.num_heads
    assert items[0]["calibrated"].shape[:2] == (L, H)
    assert sum(items[0]["labels"]) >= 1
    hs = detect_heads(dump, method="qrscore", top_k=4)
    path = hs.save(tmp_path / "heads.json")
    loaded = HeadSet.load(path)
    assert len(loaded.heads) == 4 and len(set(loaded.heads)) == 4
    assert len(loaded.scores) == L and all(len(r) == H for r in loaded.scores)
    best = max((loaded.scores[l][h], l, h) for l in range(L) for h in range(H))
    assert loaded.heads[0] == (best[1], best[2])
    assert loaded.model["sha256"] == default_lm.identity["sha256"]
    assert loaded.detection["split"] is None or loaded.detection["queries"] == len(qs)
    heads, _ = resolve_heads(str(path), default_lm.identity)
    assert sorted(heads) == sorted(loaded.heads)
    nd = detect_heads(dump, method="ndcg", top_k=2)
    assert all(0.0 <= x <= 1.0 for row in nd.scores for x in row)

    fitted = fit_head_weights(dump, path, epochs=5, holdout=0.25)
    assert fitted.weights is not None and len(fitted.weights) == L
    nonzero = {(l, h) for l in range(L) for h in range(H) if fitted.weights[l][h] != 0.0}
    assert nonzero <= set(loaded.heads) and all(w >= 0 for row in fitted.weights for w in row)  # support=qr, nonneg
    wide = fit_head_weights(dump, path, epochs=5, holdout=0.25, support="all", nonneg=False)
    assert wide.weights_info["weighted_heads"] == (max(l for l, _ in loaded.heads) + 1) * H
    with pytest.raises(ValidationError, match="support"):
        fit_head_weights(dump, path, support="some")
    fitted = fit_head_weights(dump, path, epochs=5, holdout=0.25)
    assert HeadSet.load(path).weights_info["queries_train"] >= 3
    result = ablation(dump, path, trials=200)
    assert {"all/none/none", "qr/both/rrf", "learned/none/none"} <= set(result["variants"])
    assert result["deltas"]["all/none/none"]["nDCG@10 vs icr"]["delta"] == 0.0

"""The training and fusion study's offline part: dump round trip, listwise fit, variants,
dev-only choices (synthetic features with a known informative head)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from heedrank.eval.study import (  # noqa: E402
    QueryItem, design, fit_listwise, format_study, load_items, run_study, save_items, variant_run, variant_scores,
)


def _items(n_queries: int, seed: int, n: int = 12, L: int = 4, H: int = 3) -> tuple[list[QueryItem], dict]:
    rng = np.random.default_rng(seed)
    items, qrels = [], {}
    for q in range(n_queries):
        labels = np.zeros(n, dtype=np.int64)
        labels[rng.choice(n, size=2, replace=False)] = 1
        cal = rng.normal(size=(n, L, H)).astype(np.float32)
        cal[:, 2, 1] += 3.0 * labels  # the informative head: layer 2, head 1
        first = rng.normal(size=n) + 0.5 * labels  # a weaker first stage
        order = np.argsort(-first, kind="stable")
        qid = f"q{seed}-{q}"
        ids = [f"{qid}-d{i}" for i in range(n)]
        items.append(QueryItem(qid, [ids[i] for i in order], first[order], labels[order], {
            "calibrated": cal[order], "raw": cal[order], "signal": rng.normal(size=(n, H)).astype(np.float32)[order],
            "masked": cal[order].sum(axis=(1, 2))}))
        qrels[qid] = {ids[i]: int(labels[i]) for i in range(n) if labels[i]}
    return items, qrels


def test_dump_round_trip(tmp_path) -> None:
    items, qrels = _items(3, seed=1)
    save_items(tmp_path / "d.npz", items, {"qrels": qrels, "layer": 3})
    meta, back = load_items(tmp_path / "d.npz")
    assert meta["layer"] == 3 and meta["qrels"] == qrels
    assert [b.query_id for b in back] == [i.query_id for i in items]
    for a, b in zip(items, back):
        assert a.doc_ids == b.doc_ids and np.array_equal(a.labels, b.labels)
        assert np.array_equal(a.features["calibrated"], b.features["calibrated"])


def test_design_is_standardised_per_query() -> None:
    items, _ = _items(1, seed=2)
    X = design(items[0], "heads+first")
    assert X.shape == (12, 4 * 3 + 2)
    assert np.allclose(X.mean(axis=0), 0.0, atol=1e-5)


def test_fit_finds_the_informative_head_and_beats_the_first_stage() -> None:
    train, _ = _items(40, seed=3)
    w = fit_listwise(train, "heads", l2=1e-3, epochs=100)
    assert int(np.argmax(w)) == 2 * 3 + 1  # (layer 2, head 1) in the flattened (L, H) layout
    test, qrels = _items(30, seed=4)
    learned = {"kind": "linear", "spec": "heads", "weights": w.tolist()}
    hits_learned = np.mean([variant_scores(it, learned)[it.labels > 0].min() > np.median(variant_scores(it, learned))
                            for it in test])
    hits_first = np.mean([it.first_stage[it.labels > 0].min() > np.median(it.first_stage) for it in test])
    assert hits_learned > hits_first + 0.3
    run = variant_run(test, learned)
    assert set(run) == {it.query_id for it in test} and all(len(v) == 12 for v in run.values())


@pytest.mark.parametrize("loss", ["pairwise", "lambdarank"])
def test_pairwise_losses_find_the_informative_head(loss) -> None:
    train, _ = _items(40, seed=3)
    w = fit_listwise(train, "heads", l2=1e-3, epochs=100, loss=loss)
    assert int(np.argmax(w)) == 2 * 3 + 1
    assert w[2 * 3 + 1] > 3 * np.abs(np.delete(w, 2 * 3 + 1)).max()
    with pytest.raises(ValueError, match="lambdarank"):
        fit_listwise(train, "heads", loss="hinge")


def test_run_study_chooses_on_dev_and_reports_tests() -> None:
    train, _ = _items(30, seed=5)
    dev, dev_qrels = _items(15, seed=6)
    test, test_qrels = _items(15, seed=7)
    report = run_study(train, dev, dev_qrels, {"synthetic": (test, test_qrels)}, epochs=60, l2s=(1e-3, 1e-1))
    rows = report["tests"]["synthetic"]
    assert rows["first stage"]["p"] is None
    learned = rows["learned head weights (pure reranker)"]
    assert learned["ndcg@10"] > rows["first stage"]["ndcg@10"] + 10 and learned["p"] < 0.05
    assert report["chosen_on_dev"]["learned head weights (pure reranker)"]["l2"] in (1e-3, 1e-1)
    assert "| first stage |" in format_study(report)


def test_fixed_weights_are_scored_as_given_without_training() -> None:
    dev, dev_qrels = _items(15, seed=6)
    test, test_qrels = _items(15, seed=7)
    onehot = [0.0] * 12
    onehot[2 * 3 + 1] = 1.0  # the informative head alone
    report = run_study([], dev, dev_qrels, {"synthetic": (test, test_qrels)}, fixed={"card": onehot, "wrong": [0.0] * 12})
    rows = report["tests"]["synthetic"]
    assert "learned head weights (pure reranker)" not in rows  # nothing was fitted
    assert report["variants"]["card (pure reranker)"]["weights"] == onehot
    assert rows["card (pure reranker)"]["ndcg@10"] > rows["first stage"]["ndcg@10"] + 10
    assert rows["card (pure reranker)"]["ndcg@10"] > rows["wrong (pure reranker)"]["ndcg@10"]
    assert "alpha" in report["chosen_on_dev"]["interpolation: first stage + card (fused)"]

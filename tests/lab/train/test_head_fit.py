"""The study's head-weight fit (:mod:`heedrank.lab.train.head_fit`): the listwise, pairwise and
LambdaRank fits find the informative head, the study chooses on dev only and reports the
test sets, fixed weights are scored as given (synthetic features with a known informative head)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")

from heedrank.lab.study import variant_run, variant_scores  # noqa: E402
from heedrank.lab.train.head_fit import fit_listwise, format_study, run_study  # noqa: E402
from study_items import study_items  # noqa: E402


def test_fit_finds_the_informative_head_and_beats_the_first_stage() -> None:
    train, _ = study_items(40, seed=3)
    w = fit_listwise(train, "heads", l2=1e-3, epochs=100)
    assert int(np.argmax(w)) == 2 * 3 + 1  # (layer 2, head 1) in the flattened (L, H) layout
    test, qrels = study_items(30, seed=4)
    learned = {"kind": "linear", "spec": "heads", "weights": w.tolist()}
    hits_learned = np.mean([variant_scores(it, learned)[it.labels > 0].min() > np.median(variant_scores(it, learned))
                            for it in test])
    hits_first = np.mean([it.first_stage[it.labels > 0].min() > np.median(it.first_stage) for it in test])
    assert hits_learned > hits_first + 0.3
    run = variant_run(test, learned)
    assert set(run) == {it.query_id for it in test} and all(len(v) == 12 for v in run.values())


@pytest.mark.parametrize("loss", ["pairwise", "lambdarank"])
def test_pairwise_losses_find_the_informative_head(loss) -> None:
    train, _ = study_items(40, seed=3)
    w = fit_listwise(train, "heads", l2=1e-3, epochs=100, loss=loss)
    assert int(np.argmax(w)) == 2 * 3 + 1
    assert w[2 * 3 + 1] > 3 * np.abs(np.delete(w, 2 * 3 + 1)).max()
    with pytest.raises(ValueError, match="lambdarank"):
        fit_listwise(train, "heads", loss="hinge")


def test_run_study_chooses_on_dev_and_reports_tests() -> None:
    train, _ = study_items(30, seed=5)
    dev, dev_qrels = study_items(15, seed=6)
    test, test_qrels = study_items(15, seed=7)
    report = run_study(train, dev, dev_qrels, {"synthetic": (test, test_qrels)}, epochs=60, l2s=(1e-3, 1e-1))
    rows = report["tests"]["synthetic"]
    assert rows["first stage"]["p"] is None
    learned = rows["learned head weights (pure reranker)"]
    assert learned["ndcg@10"] > rows["first stage"]["ndcg@10"] + 10 and learned["p"] < 0.05
    assert report["chosen_on_dev"]["learned head weights (pure reranker)"]["l2"] in (1e-3, 1e-1)
    assert "| first stage |" in format_study(report)


def test_fixed_weights_are_scored_as_given_without_training() -> None:
    dev, dev_qrels = study_items(15, seed=6)
    test, test_qrels = study_items(15, seed=7)
    onehot = [0.0] * 12
    onehot[2 * 3 + 1] = 1.0  # the informative head alone
    report = run_study([], dev, dev_qrels, {"synthetic": (test, test_qrels)}, fixed={"card": onehot, "wrong": [0.0] * 12})
    rows = report["tests"]["synthetic"]
    assert "learned head weights (pure reranker)" not in rows  # nothing was fitted
    assert report["variants"]["card (pure reranker)"]["weights"] == onehot
    assert rows["card (pure reranker)"]["ndcg@10"] > rows["first stage"]["ndcg@10"] + 10
    assert rows["card (pure reranker)"]["ndcg@10"] > rows["wrong (pure reranker)"]["ndcg@10"]
    assert "alpha" in report["chosen_on_dev"]["interpolation: first stage + card (fused)"]

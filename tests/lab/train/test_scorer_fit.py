"""The default's scorer fit (:mod:`heedrank.lab.train.scorer_fit`) on tiny inline dumps: a model
per subset of the signals, the full one ranking above each signal alone, its weights read back
by the product's reader (:class:`heedrank.scorer.Scorer`) to the same scores."""

from __future__ import annotations


import numpy as np
import pytest

from heedrank.lab.study import QueryItem, save_items
from heedrank.lab.train.scorer_fit import candidates_digest, dense_cosines, fit_scorer, format_fit, signals, subsets
from heedrank.reranker.cached.independent import GROUPS, IndependentWeights
from heedrank.scorer import Scorer
from heedrank.signals.rank import feature as rank_feature

CARD = {"independent": {"layers": 1, "heads": 1, "groups": list(GROUPS), "bias": -1.0, "threshold": 0.5,
                        "weights": [1.0] + [0.0] * (len(GROUPS) - 1)}}


def _dump(path, seed: int, n_queries: int = 30, n: int = 10):  # type: ignore[no-untyped-def]
    """Relevance seen by attention (group 0) and dense, each noisily; first-stage order weakly informative."""
    rng = np.random.default_rng(seed)
    items, dense, qrels = [], {}, {}
    for q in range(n_queries):
        labels = (rng.random(n) < 0.25).astype(np.int64)
        first = rng.normal(size=n) + 0.7 * labels
        order = np.argsort(-first, kind="stable")
        F = rng.normal(size=(n, 1, 1, len(GROUPS))).astype(np.float32)
        F[:, 0, 0, 0] += 1.5 * labels
        cos = 0.3 + 0.1 * rng.normal(size=n) + 0.15 * labels
        qid = f"s{seed}q{q}"
        ids = [f"{qid}d{i}" for i in range(n)]
        items.append(QueryItem(qid, [ids[i] for i in order], first[order], labels[order], {"independent": F[order]}))
        dense[qid] = cos[order]
        qrels[qid] = {ids[i]: 1 for i in range(n) if labels[i]}
    save_items(path, items, {"data": "inline", "split": "train", "qrels": qrels})
    digest = candidates_digest({"data": "inline"}, items)
    np.savez(path.with_name(path.name.removesuffix(".npz") + ".dense.npz"), __sha__=np.asarray(digest), **dense)
    return items, dense


def test_fit_scorer_on_inline_dumps(tmp_path) -> None:  # type: ignore[no-untyped-def]
    paths = {name: tmp_path / f"{name}.npz" for name in ("train", "dev", "test")}
    made = {name: _dump(p, seed) for seed, (name, p) in enumerate(paths.items())}
    entry = fit_scorer([(paths["train"], 1)], paths["dev"], {"test": (paths["test"], 1)}, card=CARD)
    # a model per subset of the three signals, the largest first
    three = subsets(("attention", "dense", "rank"))
    assert sorted(tuple(m["uses"]) for m in entry["models"]) == sorted(three) and len(three) == 6
    assert entry["models"][0]["uses"] == ["attention", "dense", "rank"]
    fig = entry["figures"]["test"]
    assert fig["attention+dense+rank"] > max(fig["attention"], fig["dense"], fig["first stage"]) + 3.0
    assert 0.75 < fig["auc"] <= 1.0 and fig["ece"] < 0.1
    assert 0.05 <= entry["threshold"] <= 0.95 and "| test |" in format_fit(entry)
    # the product reads the entry back to the same logits (the weights are per raw unit)
    scorer = Scorer.from_card({"scorer": entry})
    items, dense = made["test"]
    it = items[0]
    x = signals(it, dense[it.query_id], IndependentWeights.from_card(CARD))
    full = entry["models"][0]
    offline = full["bias"] + sum(w * x[u] for u, w in zip(full["uses"], full["weights"]))
    served = [scorer.logit({"attention": x["attention"][i], "dense": x["dense"][i],  # type: ignore[union-attr]
                            "rank": rank_feature(i)})[0] for i in range(len(it.doc_ids))]
    assert served == pytest.approx(list(offline))
    assert x["attention"][0] == pytest.approx(float(it.features["independent"][0, 0, 0, 0]) - 1.0)


def test_an_index_serves_only_the_dumps_of_its_own_collection(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A SciFact dump beside an NFCorpus index has its texts encoded, not the index's vectors read."""
    import json

    from heedrank.lab.train.scorer_fit import index_for

    index = tmp_path / "index"
    index.mkdir()
    (index / "params.json").write_text(json.dumps({"corpus": {"path": str(tmp_path / "nfcorpus")}}))
    assert index_for({"data": str(tmp_path / "nfcorpus")}, index) == index
    assert index_for({"data": str(tmp_path / "scifact")}, index) is None
    assert index_for({"data": str(tmp_path / "dl21"), "run": "BM25"}, index) is None
    assert index_for({"data": str(tmp_path / "nfcorpus")}, None) is None


def test_a_dump_of_the_same_lists_reads_its_siblings_cosines(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The cosines depend on the candidates, not on the features: the same lists dumped again (e.g.
    with another adapter) read the first dump's cache, never the embedder; other lists do not."""
    from heedrank.lab.study import load_items, save_items

    items, dense = _dump(tmp_path / "qa-set.npz", 0)
    meta, _ = load_items(tmp_path / "qa-set.npz")
    again = [type(it)(it.query_id, it.doc_ids, it.first_stage, it.labels,
                      {"independent": it.features["independent"] + 1.0}) for it in items]
    save_items(tmp_path / "web-set.npz", again, meta)  # other bytes, the same candidates
    got = dense_cosines(tmp_path / "web-set.npz")  # data "inline": computing them would fail
    assert all(np.array_equal(got[q], dense[q]) for q in dense)
    assert (tmp_path / "web-set.dense.npz").is_file()
    save_items(tmp_path / "other.npz", again[1:], meta)  # other lists: no sibling matches
    with pytest.raises(Exception):
        dense_cosines(tmp_path / "other.npz")

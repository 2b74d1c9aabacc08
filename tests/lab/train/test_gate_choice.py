"""The scorer's query gate chosen on a long-query source (:mod:`heedrank.lab.train.gate_choice`), on
tiny inline sources: short sources are served unchanged, and a long source whose attention is
noise chooses the gate that drops it."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from test_source_choice import _source

from heedrank.lab.train.gate_choice import choose_gate, format_gate, gate_entry, gated, served
from heedrank.scorer import Scorer, SubsetModel


def _with_words(source, words: int):  # type: ignore[no-untyped-def]
    values = [{**v, "query_words": np.full(len(v["dense"]), float(words))} for v in source.values]
    return replace(source, values=values, query_words=tuple(words for _ in source.items))


def test_short_sources_are_unchanged_and_a_long_source_of_noisy_attention_drops_it() -> None:
    short = [_with_words(_source("a", 1, 3.0), 12), _with_words(_source("b", 2, 3.0), 20)]
    # long queries: the attention is noise that points the wrong way (anti-correlated with relevance)
    long = _with_words(_source("long", 3, -3.0), 200)
    scorer = Scorer((SubsetModel(("attention", "dense", "rank"), (1.0, 10.0, -0.2), -4.0),
                     SubsetModel(("dense", "rank"), (12.0, -0.3), -4.5), SubsetModel(("dense",), (12.5,), -4.6)), 0.5)
    report = choose_gate(scorer, short, long)
    assert report["limit"] == 20.0
    for s in short:  # no query past the limit: every gate serves them as the ungated scorer
        assert np.array_equal(served(gated(scorer, 20, 1.0), s), served(scorer, s))
        rows = report["sets"][s.name]["rows"]
        assert rows["gate toward embedder, power 1"] == rows["default, no gate"]
    rows = report["sets"]["long"]["rows"]
    assert rows["gate toward embedder, power inf"] > rows["default, no gate"]
    assert report["power"] is not None and math.isinf(report["power"])
    entry = gate_entry(report)
    assert entry is not None and entry["limit"] == 20.0 and entry["power"] == 64.0
    back = Scorer.from_card({"scorer": {"threshold": 0.5, "models": [
        {"uses": list(m.uses), "weights": list(m.weights), "bias": m.bias} for m in scorer.models], "gate": entry}})
    assert back is not None and back.gate == gated(scorer, 20, math.inf, tuple(report["toward"])).gate
    assert "gate toward embedder, power inf" in format_gate(report)


def test_no_gate_when_no_power_helps() -> None:
    short = [_with_words(_source("a", 1, 3.0), 12)]
    long = _with_words(_source("long", 4, 3.0), 12)  # no query past the limit: nothing changes
    scorer = Scorer((SubsetModel(("attention", "dense", "rank"), (1.0, 10.0, -0.2), -4.0),
                     SubsetModel(("dense", "rank"), (12.0, -0.3), -4.5), SubsetModel(("dense",), (12.5,), -4.6)), 0.5)
    report = choose_gate(scorer, short, long)
    assert report["power"] is None and gate_entry(report) is None

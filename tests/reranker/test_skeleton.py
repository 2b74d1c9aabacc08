"""The shared rerank skeleton on the real small LM: identical texts share a score,
windows and query budgets keep requests inside the advertised limits working,
options are parsed at construction and checked against the model."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from heedrank.config import RerankerConfig  # noqa: E402
from heedrank.errors import ContextOverflowError, ValidationError  # noqa: E402
from heedrank.reranker.blockrank import BlockRankReranker  # noqa: E402
from heedrank.reranker.icr import ICRReranker  # noqa: E402
from heedrank.reranker.windows import plan_windows  # noqa: E402
from heedrank.types import Document, Query  # noqa: E402

QUERY = Query("q", "What is the boiling point of water at sea level?")
DOCS = [
    Document("d-water", "At sea level, pure water boils at 100 degrees Celsius."),
    Document("d-cat", "Cats are small domesticated carnivorous mammals kept as pets."),
    Document("d-rome", "Rome is the capital city of Italy."),
    Document("d-guitar", "The guitar is a fretted musical instrument with six strings."),
    Document("d-volcano", "A volcano is a rupture in the crust of a planet."),
    Document("d-bread", "Bread is a staple food prepared from a dough of flour and water."),
    Document("d-tennis", "Tennis is a racket sport played between two players."),
    Document("d-ice", "Ice melts at 0 degrees Celsius under normal pressure."),
    Document("d-moon", "The Moon is Earth's only natural satellite."),
    Document("d-tea", "Tea is brewed by pouring hot or boiling water over leaves."),
]


# ---------------------------------------------------------------- identical texts
def test_icr_scores_identical_texts_once_and_alike(default_lm):
    icr = ICRReranker(RerankerConfig(method="icr", max_doc_tokens=48), lm=default_lm)
    docs = DOCS[:3] + [Document("copy-of-water", DOCS[0].text)] + DOCS[3:5]
    res = icr.rerank(QUERY, docs)
    scores = res.ranking.to_dict()
    assert sorted(scores) == sorted(d.doc_id for d in docs)  # every id comes back
    assert scores["copy-of-water"] == scores["d-water"]
    assert res.details["duplicates"] == {"d-water": "copy-of-water"}  # the smallest id stands for its text
    assert any("share its score" in w for w in res.warnings)
    # the duplicate is not in the prompt: the others score as without it
    plain = icr.rerank(QUERY, DOCS[:5]).ranking.to_dict()
    assert {d: s for d, s in scores.items() if d != "copy-of-water"} == pytest.approx(plain, abs=1e-6)


@pytest.fixture(scope="module")
def blockrank(default_lm):
    return BlockRankReranker(RerankerConfig(method="blockrank", max_doc_tokens=48), lm=default_lm)


def test_blockrank_is_permutation_invariant(blockrank):
    docs = DOCS[:6]
    forward = blockrank.rerank(QUERY, docs).ranking.to_dict()
    backward = blockrank.rerank(QUERY, docs[::-1]).ranking.to_dict()
    assert forward.keys() == backward.keys()
    assert max(abs(forward[d] - backward[d]) for d in forward) < 1e-5
    assert sum(forward.values()) == pytest.approx(1.0, abs=1e-5)
    # labels follow doc ids, not places: the same blocks whatever the order
    p1, p2 = blockrank.build_prompt(QUERY.text, docs), blockrank.build_prompt(QUERY.text, docs[::-1])
    assert sorted(p1.doc_ids) == sorted(p2.doc_ids) and p1.labels == p2.labels[::-1]
    assert p1.labels == [5, 1, 3, 2, 4, 0]  # doc id ranks: bread 0, cat 1, guitar 2, rome 3, volcano 4, water 5
    dup = blockrank.rerank(QUERY, docs + [Document("again", docs[2].text)]).ranking.to_dict()
    assert dup["again"] == dup[docs[2].doc_id]


# ---------------------------------------------------------------- layer and head checks
def test_layer_scores_refuse_a_layer_past_the_model(blockrank):
    n = blockrank.lm.num_layers
    for bad in ([3, n], [n + 5], [-1, 3]):
        with pytest.raises(ValidationError, match=rf"layer must be in \[0, {n - 1}\]"):
            blockrank.layer_scores(QUERY.text, DOCS[:2], bad)
    with pytest.raises(ValidationError, match="head"):
        BlockRankReranker(RerankerConfig(method="blockrank", options={"heads": [[2, 99]]}),
                          lm=blockrank.lm).rerank(QUERY, DOCS[:2])


def test_options_are_parsed_at_construction_and_reported(default_lm):
    with pytest.raises(ValidationError, match="unknown blockrank option 'lyaer'"):
        BlockRankReranker(RerankerConfig(method="blockrank", options={"lyaer": 18}), lm=default_lm)
    r = BlockRankReranker(RerankerConfig(method="blockrank", options={"layer": 12}), lm=default_lm)
    d = r.describe()
    assert d["layer"] == 12 and d["options"]["layer"] == 12
    assert d["options"]["doc_labels"] == "sorted" and d["options"]["n_signal"] == 2  # defaults filled in
    icr = ICRReranker(RerankerConfig(method="icr", options={"heads": [[3, 1]]}), lm=default_lm).describe()
    assert icr["options"]["heads"] == [[3, 1]] and icr["options"]["mask_std"] == 2.0 and icr["heads_spec"] == "list"


# ---------------------------------------------------------------- limits
def test_icr_windows_rank_every_candidate_aligned_on_the_anchor(default_lm):
    limit = 220
    icr = ICRReranker(RerankerConfig(method="icr", max_doc_tokens=32, options={"window_tokens": limit}), lm=default_lm)
    with pytest.raises(ContextOverflowError):
        icr.build_prompt(QUERY.text, DOCS)  # one prompt does not fit
    res = icr.rerank(QUERY, DOCS)
    info = res.details["windows"]
    assert sorted(res.ranking.doc_ids) == sorted(d.doc_id for d in DOCS)
    assert info["count"] >= 2 and info["anchors"] == ["d-water"] and info["positions"] == limit
    assert sum(info["candidates"]) == len(DOCS) + info["count"] - 1  # the anchor rides along in every window
    assert any(f"{info['count']} windows" in w for w in res.warnings)
    # recompute: each window fits and its scores are shifted so that the anchor agrees with window 0
    full = icr.build_prompt(QUERY.text, DOCS, check_context=False)
    sep = len(icr.lm.tokenizer("\n\n", add_special_tokens=False).input_ids)
    marker = max(len(icr.lm.tokenizer(f"[{k}]", add_special_tokens=False).input_ids) for k in range(1, 11))
    costs = [len(c) + marker + sep for c in icr.encode_documents(DOCS)[0]]
    plan = plan_windows(costs, full.total_tokens - sum(e - s for s, e in full.spans) - sep * len(DOCS), limit)
    assert [len(w) for w in plan.windows] == info["candidates"]
    raw = []
    for idx in plan.windows:
        prompt = icr.build_prompt(QUERY.text, [DOCS[i] for i in idx])
        assert prompt.total_tokens <= limit
        raw.append(icr.score_prompt(prompt, QUERY.text).scores)
    got = res.ranking.to_dict()
    for w, idx in enumerate(plan.windows):
        shift = raw[0][0] - raw[w][0]
        assert info["shifts"][w] == pytest.approx(shift, abs=1e-6)
        for pos, i in enumerate(idx):
            if w == 0 or pos > 0:
                assert got[DOCS[i].doc_id] == pytest.approx(raw[w][pos] + shift, abs=1e-6)
    with pytest.raises(ContextOverflowError):
        ICRReranker(RerankerConfig(method="icr", max_doc_tokens=32, options={"window_tokens": limit, "windows": False}),
                    lm=default_lm).rerank(QUERY, DOCS)


def test_a_query_over_its_budget_is_cut_not_refused(default_lm):
    long_query = Query("long", "boiling point of water " * 200)  # ~1,000 tokens, 4,600 characters
    icr = ICRReranker(RerankerConfig(method="icr", max_doc_tokens=32, options={"window_tokens": 256}), lm=default_lm)
    assert icr.query_budget(DOCS[:3]) == 64  # a quarter of the window
    text, warnings = icr.fit_query(long_query.text, DOCS[:3])
    tok = icr.lm.tokenizer
    assert 60 <= len(tok(" " + text, add_special_tokens=False).input_ids) <= 64 and text.startswith("boiling point")
    res = icr.rerank(long_query, DOCS[:3])
    assert sorted(res.ranking.doc_ids) == sorted(d.doc_id for d in DOCS[:3])
    assert any("query cut to its first 64 of" in w for w in res.warnings)
    br = BlockRankReranker(RerankerConfig(method="blockrank", max_doc_tokens=32, options={"max_query_tokens": 6}),
                           lm=default_lm)
    res = br.rerank(long_query, DOCS[:3])
    assert sorted(res.ranking.doc_ids) == sorted(d.doc_id for d in DOCS[:3])
    assert any("query cut to its first 6 of" in w for w in res.warnings)


def test_blockrank_query_budget_keeps_the_query_block_inside_the_context(default_lm):
    br = BlockRankReranker(RerankerConfig(method="blockrank", max_doc_tokens=4096), lm=default_lm)
    docs = [Document("big", "word " * 5000)]
    budget = br.query_budget(docs)
    assert budget < default_lm.max_positions // 4  # the query sits in two blocks next to a 4,096-token block
    text, _ = br.fit_query("water " * 3000, docs)
    prompt = br.build_prompt(text, docs)  # fits: no ContextOverflowError
    assert prompt.query_offset + len(prompt.query_ids) <= default_lm.max_positions


def test_info_states_per_method_limits_the_model_holds(default_lm):
    pytest.importorskip("fastapi")
    from heedrank.api.routes.info import method_limits
    from heedrank.settings import Settings

    settings = Settings(max_candidates=100, max_documents=100)
    icr = ICRReranker(RerankerConfig(method="icr"), lm=default_lm)
    limits = method_limits({"icr": icr}, settings, ["blockrank", "icr"])
    assert limits["icr"]["context"] == limits["blockrank"]["context"] == 8192
    assert limits["icr"]["max_query_tokens"] == 64  # DEFAULT_MAX_QUERY_TOKENS, below a quarter of the context
    assert 30 <= limits["icr"]["candidates_per_window"] < 100  # 100 candidates need windows on SmolLM2
    for method in ("icr", "blockrank"):
        assert limits[method]["max_candidates"] == 100 and limits[method]["max_documents"] == 100
    assert method_limits({}, settings, ["icr"]) == {}  # nothing loaded: nothing stated


def test_evidence_with_windows_covers_every_candidate_and_keeps_the_scores(default_lm):
    icr = ICRReranker(RerankerConfig(method="icr", max_doc_tokens=32, options={"window_tokens": 220}), lm=default_lm)
    docs = DOCS + [Document("copy-of-tea", DOCS[-1].text)]
    plain = icr.rerank(QUERY, docs)
    res = icr.rerank_with_evidence(QUERY, docs, max_spans=2)
    assert res.ranking.to_dict() == plain.ranking.to_dict() and res.details["windows"]["count"] >= 2
    evidence = res.evidence
    assert set(evidence) == {d.doc_id for d in docs}
    assert evidence["copy-of-tea"] == evidence["d-tea"]  # same text, same attention, same spans
    by_id = {d.doc_id: d for d in docs}
    for doc_id, spans in evidence.items():
        for s in spans:
            assert by_id[doc_id].text[s.start:s.end] == s.text and s.score > 0
    assert "boil" in " ".join(s.text.lower() for s in evidence["d-water"])


def test_kept_attention_spans_follow_every_candidate(default_lm):
    icr = ICRReranker(RerankerConfig(method="icr", max_doc_tokens=32, options={"keep_attention": True}), lm=default_lm)
    docs = [DOCS[0], DOCS[1], Document("again", DOCS[0].text)]
    att = icr.rerank(QUERY, docs).details["attention"]
    assert len(att["spans"]) == 3 and att["spans"][2] == att["spans"][0] != att["spans"][1]
    assert att["calibrated"].shape[:2] == (default_lm.num_layers, default_lm.num_heads)
    with pytest.raises(ContextOverflowError):  # a dump needs one prompt: no windows
        ICRReranker(RerankerConfig(method="icr", max_doc_tokens=32, options={"keep_attention": True, "window_tokens": 128}),
                    lm=default_lm).rerank(QUERY, DOCS)

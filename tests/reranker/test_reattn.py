"""ReAttn re-weighting (docs/design/algorithms.md section 4)."""

from __future__ import annotations

import math

import pytest

from heedrank.errors import ValidationError
from heedrank.reranker.reattn import ReAttnConfig, idf_weights, normalised_entropy, reattn_scores, surface_form


def test_surface_form_strips_prefix_marks_and_case():
    assert surface_form("ĠVitamin") == "vitamin"
    assert surface_form("▁Bone,") == "bone"
    assert surface_form("##ing") == "ing"


def test_idf_weight_of_a_token_in_every_candidate_is_below_one_in_a_single_candidate():
    docs = [["vitamin", "d", "bone"], ["vitamin", "milk"], ["vitamin", "cat"], ["vitamin", "dog"]]
    w = idf_weights(docs, {"vitamin", "bone"})
    common, rare = w[0][0], w[0][2]
    assert common < rare
    # log((N+1)/(df+0.5)) before normalisation: vitamin df=4, bone df=1
    assert rare / common == pytest.approx(math.log(5 / 1.5) / math.log(5 / 4.5))
    # non-overlapping tokens keep weight 1
    assert w[1][1] == 1.0 and w[0][1] == 1.0
    # mean over overlapping occurrences is 1
    occ = [w[i][0] for i in range(4)] + [w[0][2]]
    assert sum(occ) / len(occ) == pytest.approx(1.0)


def test_entropy_prefers_spread_attention_over_the_same_mass_on_one_token():
    spread = [0.25, 0.25, 0.25, 0.25]
    peaked = [1.0, 0.0, 0.0, 0.0]
    assert normalised_entropy(spread) == pytest.approx(1.0)
    assert normalised_entropy(peaked) == pytest.approx(0.0)
    forms = [["a", "b", "c", "d"]] * 2
    scores = reattn_scores([peaked, spread], forms, set(), ReAttnConfig(idf=False, entropy=True, gamma=0.5))
    assert scores[1] > scores[0]
    assert scores[1] == pytest.approx(1.0)
    # without entropy the two have the same total mass
    flat = reattn_scores([peaked, spread], forms, set(), ReAttnConfig(idf=False, entropy=False))
    assert flat[0] == pytest.approx(flat[1])


def test_negative_attention_is_clipped():
    assert reattn_scores([[-1.0, 2.0]], [["x", "y"]], set(), ReAttnConfig(idf=False, entropy=False)) == [2.0]


def test_parse():
    assert ReAttnConfig.parse(None) is None and ReAttnConfig.parse(False) is None
    assert ReAttnConfig.parse(True) == ReAttnConfig()
    assert ReAttnConfig.parse({"idf": False}) == ReAttnConfig(idf=False, entropy=True)
    with pytest.raises(ValidationError):
        ReAttnConfig.parse({"idf": True, "bogus": 1})

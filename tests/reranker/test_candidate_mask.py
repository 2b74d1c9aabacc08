"""The probe-store experiment's mask (issue #23): layers ``< below`` of the query pass do not
attend to the candidates, while its captures still probe their keys.

Oracles: the fast path (split attention, skipped context range, log-sum-exp probe) equals
the exact path (SDPA under a per-layer mask, explicit capture) key by key; with
``below = l* + 1`` nothing the rows carry upward depends on the candidates, so changing the
candidates' *values* changes no feature, while changing them at ``below = 0`` does.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from probe_helpers import MASK_LAYER, calibrated_cached  # noqa: E402
from heedrank.reranker.attention import CandidateMask  # noqa: E402
from heedrank.reranker.blockrank import calibrated_forward  # noqa: E402

LAYER = MASK_LAYER


@pytest.fixture(scope="module")
def setup(default_lm, nfcorpus_head):
    r = calibrated_cached(default_lm)
    prompt = r.build_prompt("do statins reduce cancer risk", nfcorpus_head[:8])
    return r, prompt


def _forward(r, prompt, below: int, fast: bool, noise: int | None = None):
    """Features of one calibrated pass; ``noise``: a seed for random candidate values."""
    layers = list(range(LAYER + 1))
    L0 = len(prompt.instruction_ids)
    with torch.inference_mode():
        kv = r.cached_context(prompt).kv  # views into the reranker's buffer, with room for the fast path
        if not fast:
            kv = [(k.clone(), v.clone()) for k, v in kv]
        if noise is not None:
            g = torch.Generator().manual_seed(noise)
            for _, v in kv:
                v[:, :, L0:] = torch.randn(v[:, :, L0:].shape, generator=g)
        return calibrated_forward(r.lm, prompt, LAYER, read_layers=layers, kv=kv, fast=fast, candidates_below=below)


def test_candidate_mask_applies_only_below() -> None:
    m = CandidateMask(10, 50, 3)
    assert [m.applies(l) for l in range(5)] == [True, True, True, False, False]
    assert not CandidateMask(10, 10, 3).applies(0)


@pytest.mark.parametrize("below", [0, 3, LAYER + 1])
def test_fast_path_equals_exact_path_under_the_mask(setup, below) -> None:
    r, prompt = setup
    qf, cf, _ = _forward(r, prompt, below, fast=True)
    qe, ce, _ = _forward(r, prompt, below, fast=False)
    for l in range(LAYER + 1):
        assert qf[l].shape == qe[l].shape
        assert torch.allclose(qf[l], qe[l], atol=1e-6), (l, float((qf[l] - qe[l]).abs().max()))
        assert torch.allclose(cf[l], ce[l], atol=1e-6)
        # the probe is a distribution over every key, candidates included
        assert torch.allclose(qf[l].sum(-1), torch.ones_like(qf[l].sum(-1)), atol=1e-5)


def test_mask_changes_what_the_rows_carry(setup) -> None:
    r, prompt = setup
    q0, _, _ = _forward(r, prompt, 0, fast=False)
    qn, _, _ = _forward(r, prompt, LAYER + 1, fast=False)
    assert torch.allclose(q0[0], qn[0], atol=1e-6)  # layer 0 reads the same keys either way
    assert not torch.allclose(q0[LAYER], qn[LAYER], atol=1e-4)


@pytest.mark.parametrize("fast", [True, False])
def test_no_layer_reading_candidates_makes_features_independent_of_their_values(setup, fast) -> None:
    r, prompt = setup
    a, ca, _ = _forward(r, prompt, LAYER + 1, fast)
    b, cb, _ = _forward(r, prompt, LAYER + 1, fast, noise=0)
    for l in range(LAYER + 1):
        assert torch.allclose(a[l], b[l], atol=1e-6) and torch.allclose(ca[l], cb[l], atol=1e-6)
    c, _, _ = _forward(r, prompt, 0, fast, noise=0)
    d, _, _ = _forward(r, prompt, 0, fast)
    assert not torch.allclose(c[LAYER], d[LAYER], atol=1e-4)

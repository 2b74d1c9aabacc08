"""``lab/token_keep.py``: which positions a rule keeps, and the reduced context and prompt."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from heedrank.lab.token_keep import SINKS, kept, reduced  # noqa: E402
from heedrank.reranker.blockforward import BlockPrompt  # noqa: E402


def _kv(K: int, layers: int = 2):
    g = torch.Generator().manual_seed(0)
    return [(torch.randn(1, 2, K, 4, generator=g), torch.randn(1, 2, K, 4, generator=g)) for _ in range(layers)]


def test_rules_keep_the_sinks_and_r_positions() -> None:
    kv = _kv(20)
    keys = [k for k, _ in kv]
    keys[0][0, :, 15] *= 100.0  # the largest key norm of the block at 10..19
    first = kept(keys, 10, 10, 4, "first")
    norm = kept(keys, 10, 10, 4, "norm")
    assert first == [10, 11, 12, 13]
    assert len(norm) == 4 and norm[:SINKS] == [10, 11] and 15 in norm and norm == sorted(norm)
    assert kept(keys, 10, 3, 4, "norm") == [10, 11, 12]  # a block shorter than R keeps everything


def test_reduced_context_matches_its_prompt() -> None:
    prompt = BlockPrompt([1, 2, 3], [[10, 11, 12, 13, 14], [20, 21]], [5, 6], [7], 1, [False, False], 10)
    kv = _kv(3 + 7)
    small, p = reduced(kv, prompt, 3, "first")
    assert p.doc_ids == [[10, 11, 12], [20, 21]] and p.doc_lengths == [3, 2]
    assert small[0][0].shape[2] == 3 + 5
    assert torch.equal(small[1][1][:, :, 3:6], kv[1][1][:, :, 3:6])
    full, same = reduced(kv, prompt, None, "first")
    assert same is prompt and full[0][0].shape[2] == 10

"""Oracle: query-row attention captured from the cached fast path equals eager attention."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from heedrank.reranker.attention import AttentionCapture, run_with_capture  # noqa: E402


def test_query_rows_match_eager_full_attention(default_lm):
    from transformers import DynamicCache

    model, tok = default_lm.model, default_lm.tokenizer
    ids = tok("Paris is the capital of France. Berlin is the capital of Germany. Rome is in", return_tensors="pt").input_ids
    n_q = 5
    with torch.inference_mode():
        model.config._attn_implementation = "eager"
        try:
            ref = model(input_ids=ids, output_attentions=True)
        finally:
            model.config._attn_implementation = "heedrank"
        cache = DynamicCache(config=model.config)
        model(input_ids=ids[:, :-n_q], cache=cache, use_cache=True)
        cap = AttentionCapture(mode="probs")
        out = run_with_capture(model, cap, input_ids=ids[:, -n_q:], cache=cache, use_cache=True)
    assert sorted(cap.out) == list(range(default_lm.num_layers))
    for layer, att in enumerate(ref.attentions):
        expected = att[0, :, -n_q:, :]
        got = cap.out[layer][0]
        assert got.shape == expected.shape == (default_lm.num_heads, n_q, ids.shape[1])
        assert torch.allclose(got, expected, atol=1e-5), f"layer {layer}"
        # causal: the first query row sees no key after itself
        assert float(got[:, 0, ids.shape[1] - n_q + 1 :].abs().max()) == 0.0
    assert torch.allclose(out.logits[0], ref.logits[0, -n_q:], atol=1e-3)


def test_stop_after_skips_upper_layers(default_lm):
    model, tok = default_lm.model, default_lm.tokenizer
    ids = tok("a short probe sentence", return_tensors="pt").input_ids
    cap = AttentionCapture(layers={2, 4}, mode="mean", stop_after=4)
    with torch.inference_mode():
        out = run_with_capture(model.base_model, cap, input_ids=ids)
    assert out is None  # stopped early
    assert sorted(cap.out) == [2, 4]
    assert cap.out[4].shape == (1, default_lm.num_heads, ids.shape[1])
    # each row's attention is a distribution; the mean over rows sums to 1 too
    assert torch.allclose(cap.out[4].sum(-1), torch.ones(1, default_lm.num_heads), atol=1e-5)

"""A KV store mismatch that options can fix names those options first (no rebuild)."""

from __future__ import annotations

from heedrank.blocks import store_hint as _store_hint
from heedrank.seam import RerankerServing

BASE = {"model_hash": "m", "prompt_template_version": "v1", "instruction_hash": "a", "layer": 15, "kv_heads": 3,
        "head_dim": 64, "max_doc_tokens": 133, "dtype": "float16", "adapter_hash": None}


class _Budget:
    def __init__(self, max_doc_tokens: int) -> None:
        self.max_doc_tokens = max_doc_tokens

    def serving(self) -> RerankerServing:
        return RerankerServing(max_doc_tokens=self.max_doc_tokens)


def test_layer_block_length_and_dtype_are_read_back_as_options() -> None:
    reranker = _Budget(160)
    expected = {**BASE, "layer": 18, "max_doc_tokens": 165, "instruction_hash": "b", "dtype": "int8"}
    stored = {**BASE, "format_version": 1, "n_layers": 16}
    hint = _store_hint(reranker, expected, stored)
    # block length = budget + 5 marker tokens: a 133-token stored block is a budget of 128
    assert hint == "To read this store as built, run the reranker with --opt layer=15 --max-doc-tokens 128 " \
                   "--opt kv_dtype=float16 (no rebuild). "


def test_another_model_gets_no_option_hint() -> None:
    reranker = _Budget(128)
    assert _store_hint(reranker, {**BASE, "model_hash": "other"}, BASE) == ""
    assert _store_hint(reranker, BASE, {}) == ""

"""A KV store mismatch that options can fix names those options first (no rebuild)."""

from __future__ import annotations

from types import SimpleNamespace

from heedrank.blocks import store_hint as _store_hint

BASE = {"model_hash": "m", "prompt_template_version": "v1", "instruction_hash": "a", "layer": 15, "kv_heads": 3,
        "head_dim": 64, "max_doc_tokens": 133, "dtype": "float16", "adapter_hash": None}


def test_layer_block_length_and_dtype_are_read_back_as_options() -> None:
    reranker = SimpleNamespace(config=SimpleNamespace(max_doc_tokens=160))
    expected = {**BASE, "layer": 18, "max_doc_tokens": 165, "instruction_hash": "b", "dtype": "int8"}
    stored = {**BASE, "format_version": 1, "n_layers": 16}
    hint = _store_hint(reranker, expected, stored)
    # block length = budget + 5 marker tokens: a 133-token stored block is a budget of 128
    assert hint == "To read this store as built, run the reranker with --opt layer=15 --max-doc-tokens 128 " \
                   "--opt kv_dtype=float16 (no rebuild). "


def test_another_model_gets_no_option_hint() -> None:
    reranker = SimpleNamespace(config=SimpleNamespace(max_doc_tokens=128))
    assert _store_hint(reranker, {**BASE, "model_hash": "other"}, BASE) == ""
    assert _store_hint(reranker, BASE, {}) == ""


def test_a_store_keeping_another_number_of_positions_is_read_back_with_block_positions() -> None:
    from heedrank.reranker.doccache import BlockLayout

    full = BlockLayout((1, 2, 3), (4, 5, 6), (7, 8), 128, 136, True)  # blocks of 3 + 128 + 2 = 133
    kept = BlockLayout((1, 2, 3), (4, 5, 6), (7, 8), 128, 136, True, 64)
    reranker = SimpleNamespace(config=SimpleNamespace(max_doc_tokens=128), layout=kept)
    expected = {**BASE, "max_doc_tokens": 64, "instruction_hash": kept.fingerprint(), "dtype": "int4"}
    stored = {**BASE, "instruction_hash": full.fingerprint(), "dtype": "int8"}
    assert _store_hint(reranker, expected, stored) == (
        "To read this store as built, run the reranker with --opt block_positions=null --opt kv_dtype=int8 (no rebuild). ")
    reranker.layout = full  # a reranker keeping all positions, a store keeping 64
    swapped = _store_hint(reranker, {**stored, "dtype": "int4"}, {**expected, "dtype": "int4"})
    assert swapped == "To read this store as built, run the reranker with --opt block_positions=64 (no rebuild). "

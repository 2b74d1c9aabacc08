"""A saved query adapter with random (non-zero) LoRA B, for the adapter tests."""

from __future__ import annotations

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")


def random_query_adapter(tmp_path, identity, *, layer: int, tokens: int, name: str = "adapter"):
    """``(folder, carrier)``: a query adapter saved under ``tmp_path / name`` (LoRA r 4 on
    :data:`TARGETS` of layers ``0..layer``, ``step`` 7) and the LM it was built in."""
    import torch

    from heedrank.reranker.adapters import inject_lora, save_adapter
    from heedrank.reranker.doccache import CACHE_TEMPLATE_VERSION
    from heedrank.reranker.lm import load_trainable_lm

    carrier = load_trainable_lm()
    inject_lora(carrier.model, 4, 8, TARGETS, range(layer + 1))
    torch.manual_seed(0)
    with torch.no_grad():
        for n, p in carrier.model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05)
    card = {"model": identity, "layer": layer, "max_doc_tokens": tokens, "template": CACHE_TEMPLATE_VERSION,
            "lora": {"r": 4, "alpha": 8, "target_modules": list(TARGETS), "layers": list(range(layer + 1))}, "step": 7}
    return save_adapter(tmp_path / name, carrier.model, card), carrier

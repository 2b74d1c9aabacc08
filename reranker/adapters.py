"""Query adapters on disk and in the model: LoRA layers injected in place, switched off for
document blocks (they are always the base model's), saved and loaded.

A query-side adapter (trained by :mod:`heedrank.lab.train.query_adapter`) is injected in
place into the LM; block 0 and candidate blocks (:mod:`heedrank.reranker.doccache`) are
encoded with it switched off, so the document KV store built without it stays valid.
Depends on nothing else of the reranker (it sits below blockrank, doccache and the trainer).

Files of an adapter (``DIR``): ``adapter.safetensors`` (LoRA tensors and, optionally,
``scorer.weights`` float32 ``(l* + 1) * heads``), ``adapter.json`` (LoRA config, model
identity, ``l*``, block length, layout version, data and figures).
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from heedrank.errors import ValidationError
from heedrank.files import file_sha256

ADAPTER_FORMAT = 1


def lora_layers(model: Any) -> list[Any]:
    """The LoRA layers of ``model`` (none when peft was never imported: only peft adds them)."""
    import sys

    if model is None or "peft" not in sys.modules:
        return []
    from peft.tuners.lora import LoraLayer

    return [m for m in model.modules() if isinstance(m, LoraLayer)]


@contextlib.contextmanager
def adapter_disabled(model: Any) -> Iterator[None]:
    """Run the base model: LoRA layers (if any) are switched off inside the block (candidate
    and block-0 encoding must never see the query adapter); nests, restoring each layer's
    previous state on exit."""
    layers = lora_layers(model)
    before = [bool(m.disable_adapters) for m in layers]
    for m in layers:
        m.enable_adapters(False)
    try:
        yield
    finally:
        for m, off in zip(layers, before):
            m.enable_adapters(not off)


def inject_lora(model: Any, r: int, alpha: int, targets: Sequence[str], layers: Sequence[int] | None = None) -> int:
    """Add LoRA layers in place (the model keeps its class, so ``model.base_model`` is
    still the decoder) to ``targets`` of decoder ``layers`` (all when ``None``; the query
    passes never run above ``l*``) and freeze everything else. Returns the trainable
    parameter count."""
    from peft import LoraConfig, inject_adapter_in_model

    cfg = LoraConfig(r=r, lora_alpha=alpha, lora_dropout=0.0, target_modules=list(targets), bias="none",
                     layers_to_transform=None if layers is None else list(layers))
    inject_adapter_in_model(cfg, model)
    n = 0
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name)
        n += p.numel() if p.requires_grad else 0
    return n


def has_adapter(model: Any) -> bool:
    """Whether ``model`` carries LoRA layers."""
    return bool(lora_layers(model))


def adapter_state(model: Any) -> dict[str, Any]:
    """The LoRA tensors of ``model`` (names as in ``named_parameters``), detached."""
    return {n: p.detach().contiguous().clone() for n, p in model.named_parameters() if "lora_" in n}


def save_adapter(path: str | Path, model: Any, card: dict[str, Any], weights: Any = None) -> Path:
    """Write ``adapter.safetensors`` and ``adapter.json`` to ``path`` atomically (a temporary
    folder renamed into place)."""
    from safetensors.torch import save_file

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    tensors = adapter_state(model)
    if weights is not None:
        tensors["scorer.weights"] = weights.detach().float().contiguous().clone()
    save_file(tensors, str(tmp / "adapter.safetensors"))
    (tmp / "adapter.json").write_text(json.dumps({"format": ADAPTER_FORMAT, **card}, indent=1))
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    return path


def resolve_adapter(value: str, identity: dict[str, Any]) -> Path:
    """The folder of a query adapter option value: ``"packaged"`` is the adapter installed for
    the model (``reranker/data/<model>.query-adapter``, else the user card folder's
    ``<model-name>.query-adapter``, trained for the model's sha256:
    :func:`heedrank.reranker.cards.find_adapter_dir`), anything else a path.

    Raises:
        NotFoundError: no adapter is installed for the model, or the folder lacks its files.
    """
    from heedrank.errors import NotFoundError

    if value == "packaged":
        from heedrank.reranker.cards import find_adapter_dir

        path = find_adapter_dir(identity)
        if path is None:
            raise NotFoundError(f"no query adapter ships for model {identity.get('name')!r}; train one with "
                                "`heedrank lab train query-adapter` and pass --opt query_adapter=DIR")
        return path
    path = Path(value).expanduser()
    if not (path / "adapter.json").is_file():
        raise NotFoundError(f"{path} is not a query adapter (adapter.json and adapter.safetensors expected); "
                            "train one with `heedrank lab train query-adapter`")
    return path


def adapter_hash(path: str | Path) -> str:
    """sha256 of an adapter's tensors file: the ``adapter`` field of a KV store header and
    of reports (a store stays valid under a query adapter: blocks use the base model)."""
    return file_sha256(Path(path) / "adapter.safetensors")


def load_adapter(path: str | Path, model: Any, identity: dict[str, Any] | None = None) -> tuple[dict[str, Any], Any]:
    """Inject and load a saved query adapter into ``model`` (in place).

    Returns:
        ``(card, weights)``: the JSON card and the trained head weights (float32 tensor
        ``((l* + 1) * heads,)``) or ``None`` when the adapter has none.

    Raises:
        NotFoundError: ``path`` lacks ``adapter.json`` or ``adapter.safetensors``.
        ValidationError: the adapter was trained for another model.
    """
    from safetensors.torch import load_file

    from heedrank.errors import NotFoundError

    path = Path(path)
    if not (path / "adapter.json").is_file() or not (path / "adapter.safetensors").is_file():
        raise NotFoundError(f"{path} is not a query adapter (adapter.json and adapter.safetensors expected); "
                            "train one with `heedrank lab train query-adapter`")
    card = json.loads((path / "adapter.json").read_text())
    sha = (card.get("model") or {}).get("sha256")
    if identity is not None and sha and sha != identity.get("sha256"):
        raise ValidationError(f"adapter {path} was trained for model {sha}, not {identity.get('sha256')}: "
                              "load it with the model it was trained on")
    lora = card["lora"]
    inject_lora(model, lora["r"], lora["alpha"], lora["target_modules"], lora.get("layers"))
    tensors = load_file(str(path / "adapter.safetensors"))
    weights = tensors.pop("scorer.weights", None)
    missing = set(adapter_state(model)) - set(tensors)
    if missing:
        raise ValidationError(f"adapter {path} lacks {len(missing)} LoRA tensors (e.g. {sorted(missing)[0]}): retrain it")
    params = dict(model.named_parameters())
    import torch

    with torch.no_grad():
        for n, t in tensors.items():
            params[n].copy_(t)
    for p in model.parameters():
        p.requires_grad_(False)
    return card, weights

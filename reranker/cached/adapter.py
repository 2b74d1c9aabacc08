"""The query adapter of cached BlockRank: resolved, checked and loaded in one step.

A query adapter (``heedrank lab train query-adapter``, :mod:`heedrank.lab.train.query_adapter`)
is LoRA on the query and ``N/A`` passes only. The reranker runs those passes on a private
copy of the shared LM carrying it (the block encoders switch its LoRA layers off,
:func:`heedrank.reranker.adapters.adapter_disabled`), so stored blocks stay valid and the
shared LM is never changed. :func:`load_query_adapter` is the one place that makes the copy.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from heedrank.errors import NotFoundError, ValidationError
from heedrank.reranker.options import AUTO


@dataclass(frozen=True)
class AdapterFit:
    """What a query adapter must have been trained for to serve a reranker.

    Attributes:
        layer: The reranker's ``l*``.
        max_doc_tokens: Its block content budget.
        template: Its cached layout version.
    """

    layer: int
    max_doc_tokens: int | None
    template: str

    def problem(self, card: Mapping[str, Any]) -> str | None:
        """Why the adapter of ``card`` (its ``adapter.json``) does not serve, or ``None``. An
        adapter trained at a deeper ``l*`` serves a shallower one (the query pass is causal in
        depth: its layers up to ``l*`` are the ones it was trained with)."""
        want = {"layer": self.layer, "max_doc_tokens": self.max_doc_tokens, "template": self.template}
        got = {k: card.get(k) for k in want}
        if isinstance(got["layer"], int) and got["layer"] >= self.layer:
            got["layer"] = self.layer
        return None if got == want else f"was trained for {got}; this reranker is {want}"


@dataclass(frozen=True)
class QueryAdapter:
    """A loaded query adapter.

    Attributes:
        path: Its folder.
        sha256: sha256 of its tensors (:func:`heedrank.reranker.adapters.adapter_hash`).
        weights: Its trained head weights, float32 tensor ``((l* + 1) * heads,)``, or ``None``.
        step: The training step it was saved at (``adapter.json``), or ``None``.
        lm: The private copy of the shared LM carrying it (:class:`heedrank.reranker.lm.LoadedLM`).
    """

    path: Path
    sha256: str
    weights: Any
    step: int | None
    lm: Any

    def describe(self) -> dict[str, Any]:
        """``{"path", "sha256", "step"}`` for reports."""
        return {"path": str(self.path), "sha256": self.sha256, "step": self.step}


def adapter_path(value: str | None, identity: dict[str, Any], fit: AdapterFit) -> Path | None:
    """Folder of the query adapter of option ``query_adapter``: ``None`` = none; ``'auto'`` =
    the packaged one when it ships for the model and ``fit`` accepts it, else none;
    ``'packaged'`` or a path: that one.

    Raises:
        NotFoundError: ``'packaged'`` for a model without one, or a path that is not an adapter.
    """
    from heedrank.reranker.adapters import resolve_adapter

    if value is None:
        return None
    if value != AUTO:
        return resolve_adapter(str(value), identity)
    try:
        path = resolve_adapter("packaged", identity)
    except NotFoundError:
        return None
    card = json.loads((path / "adapter.json").read_text(encoding="utf-8"))
    return path if fit.problem(card) is None else None


def load_query_adapter(value: str | None, base: Any, fit: AdapterFit) -> QueryAdapter | None:
    """The query adapter of option ``value`` (:func:`adapter_path`) loaded into a deep copy of
    ``base`` (the shared :class:`heedrank.reranker.lm.LoadedLM`), or ``None`` without one.

    Raises:
        NotFoundError: see :func:`adapter_path`.
        ValidationError: an adapter trained for another model, ``l*``, block length or layout.
    """
    import copy

    from heedrank.reranker.adapters import adapter_hash, load_adapter
    from heedrank.reranker.lm import LoadedLM

    path = adapter_path(value, base.identity, fit)
    if path is None:
        return None
    model = copy.deepcopy(base.model)
    card, weights = load_adapter(path, model, base.identity)
    model.eval()
    problem = fit.problem(card)
    if problem is not None:
        raise ValidationError(f"query adapter {path} {problem}: use the adapter's options or retrain it")
    lm = LoadedLM(model, base.tokenizer, base.identity, base.device, base.load_seconds)
    return QueryAdapter(path, adapter_hash(path), weights, card.get("step"), lm)

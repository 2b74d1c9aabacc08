"""The weights card of cached BlockRank's learned scorer: one frozen record, one reader.

A card is a JSON file written by ``heedrank lab fit --export`` (the one shipped for a
packaged LM is ``reranker/data/<model>.blockrank-cached.json``; one installed by a recipe for
any other model is ``<card dir>/<model-name>.blockrank-cached.json``, :func:`user_card_dir`,
:func:`model_card_name`). It holds the learned
per-(layer, head) weights with what they were fitted for (``layer`` = ``l*``,
``max_doc_tokens``, ``template``, ``spec``, ``model_sha256``), the fusion weight with the
first stage (``fusion.alpha``), the relevance cut-off's maps (``calibration``, written by
``heedrank lab calibrate``) and the dev and test nDCG@10 of the configuration it ships.

:func:`read_card` is the only reader: the reranker (:func:`find_card`),
:func:`heedrank.reranker.options.packaged_card` and
:func:`heedrank.reranker.options.recorded_fusion` all go through it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from heedrank.errors import NotFoundError, ValidationError
from heedrank.reranker.datafiles import model_card_name, packaged_data_dir, user_card_dir

logger = logging.getLogger(__name__)

CARD_SUFFIX = ".blockrank-cached.json"
"""File name suffix of a shipped card: ``<model>.blockrank-cached.json``."""
ADAPTER_SUFFIX = ".query-adapter"
"""Folder name suffix of a query adapter installed beside a card: ``<model>.query-adapter``."""
FIGURE_KEYS = ("configuration", "fusion", "dev_ndcg@10", "test_ndcg@10")
"""The card's entries that report figures (:attr:`WeightsCard.figures`)."""


@dataclass(frozen=True)
class WeightsCard:
    """A weights card as read (:func:`read_card`).

    Attributes:
        path: The file it was read from (as given).
        layer: ``l*`` the weights were fitted at (``None`` when the card lacks it).
        max_doc_tokens: Block content budget they were fitted with.
        template: Cached layout version (:data:`heedrank.reranker.doccache.CACHE_TEMPLATE_VERSION`).
        spec: Feature spec (``"heads"``: one weight per (layer, head) of ``0..l*``).
        model_sha256: The model they were fitted on, or ``None``.
        weights: ``(l* + 1) * heads`` weights, layer-major (unitless), or ``None``.
        fusion_alpha: Fusion weight with the first stage chosen on dev, or ``None``.
        calibration: The ``"calibration"`` entry (:meth:`heedrank.calibration.Calibration.from_json`)
            or ``None``.
        figures: The entries of :data:`FIGURE_KEYS` the card has.
        data: The whole card, read-only.
    """

    path: str
    layer: int | None
    max_doc_tokens: int | None
    template: str | None
    spec: str | None
    model_sha256: str | None
    weights: tuple[float, ...] | None
    fusion_alpha: float | None
    calibration: Mapping[str, Any] | None
    figures: Mapping[str, Any]
    data: Mapping[str, Any]

    @classmethod
    def from_json(cls, data: Mapping[str, Any], path: str) -> WeightsCard:
        """The record of a parsed card read from ``path``."""
        alpha = (data.get("fusion") or {}).get("alpha")
        weights = data.get("weights")
        return cls(
            path=path, layer=data.get("layer"), max_doc_tokens=data.get("max_doc_tokens"),
            template=data.get("template"), spec=data.get("spec"), model_sha256=data.get("model_sha256"),
            weights=None if weights is None else tuple(weights),
            fusion_alpha=None if alpha is None else float(alpha),
            calibration=data.get("calibration") or None,
            figures=MappingProxyType({k: data[k] for k in FIGURE_KEYS if k in data}),
            data=MappingProxyType(dict(data)),
        )

    def weights_for(self, want: Mapping[str, Any], model_sha256: str | None, shape: tuple[int, int]) -> Any:
        """The weights as float64 ``shape`` = ``(l* + 1, heads)``, checked against the reranker.

        Args:
            want: The reranker's ``{"layer", "max_doc_tokens", "template", "spec"}``.
            model_sha256: The reranker's model hash.
            shape: ``(l* + 1, heads)``.

        Raises:
            ValidationError: a card fitted for another model, ``l*``, block length or layout,
                or one without weights.
        """
        import numpy as np

        got = {k: self.data.get(k) for k in want}
        sha = self.model_sha256
        if got != dict(want) or (sha and sha != model_sha256):
            raise ValidationError(f"weights card {self.path} was fitted for {got} (model {sha}); this reranker is "
                                  f"{dict(want)} (model {model_sha256}): refit or change the options")
        if self.weights is None:
            raise ValidationError(f"weights card {self.path} has no weights: refit it")
        return np.asarray(self.weights, dtype=np.float64).reshape(shape)


def read_card(path: str | Path) -> WeightsCard:
    """The weights card at ``path``.

    Raises:
        NotFoundError: no file at ``path``.
    """
    if not Path(path).is_file():
        raise NotFoundError(f"weights card {path} not found; write one with `heedrank lab fit --export`")
    return WeightsCard.from_json(json.loads(Path(path).read_text(encoding="utf-8")), str(path))


def packaged_card_path(model_name: str) -> Path:
    """Where the card shipped for the packaged LM ``model_name`` lies (it may not exist)."""
    return packaged_data_dir() / f"{model_name}{CARD_SUFFIX}"


def card_dirs() -> tuple[Path, ...]:
    """The folders searched for a model's card and query adapter, in order: the package's
    data folder (``reranker/data``), then :func:`user_card_dir`."""
    return (packaged_data_dir(), user_card_dir())


def _for_model(card: WeightsCard, sha: str | None) -> bool:
    """Whether ``card`` may serve the model of hash ``sha``: it records no model, or that one."""
    return not (card.model_sha256 and sha and card.model_sha256 != sha)


def find_card(model: Mapping[str, Any] | str, scorer_weights: str | None) -> WeightsCard | None:
    """The card of a reranker: ``scorer_weights`` when given (checked later, a mismatch is an
    error), else the first ``<model-name>.blockrank-cached.json`` (:func:`model_card_name`) in
    :func:`card_dirs` fitted for the model (its ``model_sha256`` absent or the model's; one for
    another model is skipped with a warning), else ``None``.

    Args:
        model: The loaded model's :func:`heedrank.reranker.lm.model_identity` (``name``,
            ``source``, ``sha256``), or a bare name (no hash check).
        scorer_weights: Option ``scorer_weights``, or ``None``.

    Raises:
        NotFoundError: ``scorer_weights`` names a missing file.
    """
    if scorer_weights is not None:
        return read_card(scorer_weights)
    sha = None if isinstance(model, str) else model.get("sha256")
    name = model_card_name(model)
    for folder in card_dirs():
        path = folder / f"{name}{CARD_SUFFIX}"
        if not path.is_file():
            continue
        card = read_card(path)
        if _for_model(card, sha):
            return card
        logger.warning("weights card %s was fitted for model %s, not this one (%s): not used", path,
                       card.model_sha256, sha)
    return None


def find_adapter_dir(identity: Mapping[str, Any]) -> Path | None:
    """The query adapter folder installed for the model: the first
    ``<model-name>.query-adapter`` (:func:`model_card_name`) in :func:`card_dirs` that holds an
    ``adapter.json`` trained for it (its ``model.sha256`` absent or the model's), else ``None``."""
    name, sha = model_card_name(identity), identity.get("sha256")
    for folder in card_dirs():
        path = folder / f"{name}{ADAPTER_SUFFIX}"
        if not (path / "adapter.json").is_file():
            continue
        want = (json.loads((path / "adapter.json").read_text(encoding="utf-8")).get("model") or {}).get("sha256")
        if not (want and sha and want != sha):
            return path
        logger.warning("query adapter %s was trained for model %s, not this one (%s): not used", path, want, sha)
    return None


def describe_card(card: WeightsCard | None) -> dict[str, Any] | None:
    """Which card answered, for ``/info`` and reports: ``{"path", "packaged", "model",
    "model_sha256", "layer"}`` (``path``: the file name for a packaged card, else the path as
    read), or ``None`` without a card."""
    if card is None:
        return None
    path = Path(card.path)
    packaged = path.parent.resolve() == packaged_data_dir().resolve()
    return {"path": path.name if packaged else card.path, "packaged": packaged, "model": card.data.get("model"),
            "model_sha256": card.model_sha256, "layer": card.layer}

"""The reranker's card shelf: where a model's data files lie, which weights card and query
adapter serve it, and the card's entries as typed records, read once.

Files (:func:`packaged_data_dir`, :func:`user_card_dir`, :func:`model_card_name`): the package's
data folder ``reranker/data`` (head sets, weights cards, query adapters) and the user card
folder where the recipes install the files of a model that ships none, each filed under the
model's name (a local directory's name plus its hash).

A weights card is a JSON file written by ``heedrank lab fit --export`` and completed by the
recipe (``recipes/default``): the card shipped for a packaged LM is
``reranker/data/<model>.blockrank-cached.json``; one installed for any other model is
``<card dir>/<model-name>.blockrank-cached.json``. It holds the learned per-(layer, head) weights
with what they were fitted for (``layer`` = ``l*``, ``max_doc_tokens``, ``template``, ``spec``,
``model_sha256``), the fusion weight with the first stage (``fusion.alpha``), the relevance
cut-off's maps (``calibration``), the list-independent scorer's weights and cut-offs
(``independent``: :class:`IndependentEntry`), the default's scorer over every signal (``scorer``:
:class:`heedrank.scorer.Scorer`) and the figures of the configuration it ships.

:func:`read_card` is the only reader of a card file and :meth:`WeightsCard.from_json` the only
reader of its entries; which card serves a model is decided here only (:func:`find_card`,
:func:`packaged_card`).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from heedrank.errors import NotFoundError, ValidationError
from heedrank.scorer import Scorer

logger = logging.getLogger(__name__)

DATA_DIR = Path(__file__).resolve().parent / "data"
"""The package's data folder."""

CARD_DIR_ENV = "HEEDRANK_CARD_DIR"
"""Environment variable naming the user card folder (default ``$HEEDRANK_CACHE_DIR/cards``)."""


def packaged_data_dir() -> Path:
    """Folder of the data shipped with the reranker (head sets, weights cards)."""
    return DATA_DIR


def user_card_dir() -> Path:
    """The user card folder: ``$HEEDRANK_CARD_DIR``, else ``<cache>/cards``
    (:func:`heedrank.files.cache_dir`: ``$HEEDRANK_CACHE_DIR`` or ``~/.cache/heedrank``). Cards
    and query adapters of models that ship none are installed here (``recipes/default``
    ``install``), never into the package. Not created here."""
    from heedrank.files import cache_dir

    env = os.environ.get(CARD_DIR_ENV)
    return Path(env).expanduser() if env else cache_dir() / "cards"


def model_card_name(identity: Mapping[str, Any] | str) -> str:
    """The name a model's card and adapter are filed under: a packaged LM's name
    (``smollm2-135m-instruct``); for a local directory (``identity["source"] == "directory"``)
    its folder name lower-cased to ``[a-z0-9._-]`` plus the first 12 hex digits of its sha256
    (``my-model-0123456789ab``), so that two folders of the same name do not share one.

    Args:
        identity: :func:`heedrank.reranker.lm.model_identity` of the model, or a bare name.
    """
    if isinstance(identity, str):
        return identity
    name = str(identity.get("name") or "model")
    if identity.get("source") != "directory":
        return name
    slug = re.sub(r"[^a-z0-9._-]+", "-", name.lower()).strip("-.") or "model"
    sha = str(identity.get("sha256") or "")
    return f"{slug}-{sha[:12]}" if sha else slug

CARD_SUFFIX = ".blockrank-cached.json"
"""File name suffix of a shipped card: ``<model>.blockrank-cached.json``."""
ADAPTER_SUFFIX = ".query-adapter"
"""Folder name suffix of a query adapter installed beside a card: ``<model>.query-adapter``."""
FIGURE_KEYS = ("configuration", "fusion", "dev_ndcg@10", "test_ndcg@10")
"""The card's entries that report figures (:attr:`WeightsCard.figures`)."""


@dataclass(frozen=True)
class IndependentEntry:
    """The card's ``independent`` entry (list-independent scoring,
    :mod:`heedrank.reranker.cached.independent`), as read (:meth:`from_json`).

    Attributes:
        layers: Layers read, ``0..layers - 1`` (``l* + 1``).
        heads: Query heads per layer.
        groups: Row groups of the features' last axis (checked against the scorer's by
            :class:`heedrank.reranker.cached.independent.IndependentWeights`).
        weights: ``layers * heads * len(groups)`` weights per unit of feature, layer-major.
        bias: Log-odds intercept.
        threshold: The ``"auto"`` cut-off's probability, chosen on dev.
        fusion_alpha: Fusion weight with the first stage chosen on dev, or ``None``.
        fused_map: ``(a, b)``: the probability of a score fused at ``fusion_alpha`` is
            ``sigmoid(a f + b)``, or ``None``.
        fused_threshold: The cut-off of that fused probability, or ``None``.
    """

    layers: int
    heads: int
    groups: tuple[str, ...]
    weights: tuple[float, ...]
    bias: float
    threshold: float
    fusion_alpha: float | None
    fused_map: tuple[float, float] | None
    fused_threshold: float | None

    @classmethod
    def from_json(cls, entry: Mapping[str, Any], path: str = "the weights card") -> IndependentEntry:
        """The record of a card's parsed ``independent`` entry.

        Raises:
            ValidationError: a missing field, or a weight count that is not
                ``layers * heads * len(groups)``: refit the entry (``recipes/default``).
        """
        try:
            layers, heads, groups = int(entry["layers"]), int(entry["heads"]), tuple(entry["groups"])
            weights, bias, threshold = tuple(float(w) for w in entry["weights"]), float(entry["bias"]), \
                float(entry["threshold"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValidationError(f"{path}: its 'independent' entry lacks or garbles {e}: refit it with "
                                  "`bash recipes/default/run.sh independent`") from e
        if len(weights) != layers * heads * len(groups):
            raise ValidationError(f"{path}: its independent weights hold {len(weights)} values, not "
                                  f"{layers} x {heads} x {len(groups)}: refit it")
        pair = entry.get("fused_map")
        alpha, fused = entry.get("fusion_alpha"), entry.get("fused_threshold")
        return cls(layers, heads, groups, weights, bias, threshold,
                   None if alpha is None else float(alpha),
                   None if not pair else (float(pair[0]), float(pair[1])),
                   None if not pair or fused is None else float(fused))


def independent_entry(data: Mapping[str, Any], path: str = "the weights card") -> IndependentEntry | None:
    """A parsed card's ``independent`` entry (:class:`IndependentEntry`), or ``None`` when it has none.

    Raises:
        ValidationError: as :meth:`IndependentEntry.from_json`.
    """
    entry = data.get("independent")
    return IndependentEntry.from_json(entry, path) if isinstance(entry, Mapping) else None


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
        independent: The ``"independent"`` entry (:class:`IndependentEntry`), or ``None``.
        scorer: The ``"scorer"`` entry (:meth:`heedrank.scorer.Scorer.from_card`), or ``None``.
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
    independent: IndependentEntry | None
    scorer: Scorer | None
    figures: Mapping[str, Any]
    data: Mapping[str, Any]

    @property
    def serves_scorer(self) -> bool:
        """Whether the card holds the default's scorer over the list-independent attention
        (``scorer`` and ``independent`` entries): ``scoring='auto'`` is then ``'independent'``."""
        return self.scorer is not None and self.independent is not None

    @classmethod
    def from_json(cls, data: Mapping[str, Any], path: str) -> WeightsCard:
        """The record of a parsed card read from ``path``.

        Raises:
            ValidationError: a garbled ``independent`` or ``scorer`` entry
                (:meth:`IndependentEntry.from_json`, :meth:`heedrank.scorer.Scorer.from_card`).
        """
        alpha = (data.get("fusion") or {}).get("alpha")
        weights = data.get("weights")
        return cls(
            path=path, layer=data.get("layer"), max_doc_tokens=data.get("max_doc_tokens"),
            template=data.get("template"), spec=data.get("spec"), model_sha256=data.get("model_sha256"),
            weights=None if weights is None else tuple(weights),
            fusion_alpha=None if alpha is None else float(alpha),
            calibration=data.get("calibration") or None,
            independent=independent_entry(data, path),
            scorer=Scorer.from_card(data),
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


def packaged_card(model: str | None) -> WeightsCard | None:
    """The weights card installed for the LM ``model`` (``None`` = the default LM), or ``None``:
    for a packaged LM the card shipped for it (or one in the user card folder); for a local model
    directory the card installed for its identity (:func:`find_card`: name plus sha256, the
    folder hashed once per change of its files); ``None`` when no card is installed. Reads no model."""
    from heedrank.config import DEFAULT_LM
    from heedrank.reranker.lm import packaged_models

    name = DEFAULT_LM if model is None else model
    path = Path(name).expanduser()
    if name in packaged_models() or ("/" not in name and not path.is_dir()):
        return find_card(name, None)  # a packaged name (model_identity's order), or no model at all
    if not path.is_dir():
        return None
    stamp = tuple((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in sorted(path.iterdir()) if f.is_file())
    return find_card(_directory_identity(str(path.resolve()), stamp), None)


@functools.lru_cache(maxsize=8)
def _directory_identity(path: str, stamp: tuple[tuple[str, int, int], ...]) -> dict[str, Any]:
    """:func:`heedrank.reranker.lm.model_identity` of the model folder ``path``, kept while its
    files' names, sizes and times (``stamp``) stay the same (it hashes the weights)."""
    from heedrank.reranker.lm import model_identity

    return model_identity(path)


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


def fusion_weight(card: WeightsCard | None, scoring: str) -> float | None:
    """The fusion weight ``alpha`` with the first stage that ``card`` records for the scorer
    ``scoring`` (``alpha z(first stage) + (1 - alpha) z(reranker)``, chosen on dev), or ``None``:
    no card, a card whose default's scorer serves ``'independent'`` (:mod:`heedrank.scorer`: no
    fusion weight), or a scorer other than ``learned`` and ``independent``. The one rule read by
    the loaded reranker (:attr:`heedrank.reranker.cached.CachedBlockRankReranker.default_fusion`)
    and by ``/info`` without loading one (:func:`heedrank.reranker.cached.state.recorded_fusion`)."""
    if card is None or (scoring == "independent" and card.serves_scorer):
        return None
    if scoring == "independent":
        return None if card.independent is None else card.independent.fusion_alpha
    return card.fusion_alpha if scoring == "learned" else None


def signal_scorer(signal: str, model: str | None = None) -> Scorer | None:
    """The packaged card's model of the signal ``signal`` alone (the embedder's cosine, for the
    method ``dense``), with the card's cut-off, or ``None`` when the card (of the LM ``model``;
    ``None``: the default LM) holds none."""
    card = packaged_card(model)
    return None if card is None or card.scorer is None else card.scorer.only([signal])


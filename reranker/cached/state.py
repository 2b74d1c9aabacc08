"""What cached BlockRank resolves once, when it loads (:func:`load_state`).

From the options and the shared LM: the weights card (:mod:`heedrank.reranker.cards`),
the scorer in use (``scoring='auto'`` = ``'independent'`` served by the card's default scorer when
the card holds one (:func:`auto_scoring`), else ``'learned'``, when ``scorer_weights`` is given or a card
for the model (packaged, or installed in the user card folder, matched by name and sha256:
:func:`heedrank.reranker.cards.find_card`) fits the ``l*`` and block length asked for,
else ``'calibrated'``, with a warning when there is no card), ``l*``, the cached layout, the query
adapter (:mod:`heedrank.reranker.cached.adapter`), the scorer object
(:mod:`heedrank.reranker.cached.scorers`; ``'independent'``'s in
:mod:`heedrank.reranker.cached.independent`) and the relevance cut-off's maps (``'learned'`` only).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from heedrank.config import RerankerConfig
from heedrank.errors import NotFoundError, ValidationError
from heedrank.reranker.cached.adapter import AdapterFit, QueryAdapter, load_query_adapter
from heedrank.reranker.cards import WeightsCard, card_dirs, find_card
from heedrank.reranker.cached.independent import IndependentScorer, IndependentWeights
from heedrank.reranker.cached.scorers import CalibratedScorer, LearnedScorer, Scorer, SignalScorer
from heedrank.reranker.doccache import CACHE_TEMPLATE_VERSION, BlockLayout, build_layout
from heedrank.reranker.options import AUTO, CachedBlockRankOptions

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CachedState:
    """A loaded cached BlockRank reranker's resources and resolved choices.

    Attributes:
        base_lm: The shared LM (never carries the adapter): blocks are always encoded with it.
        lm: The LM the query passes run on: the query adapter's private copy, else ``base_lm``.
        layout: The cached prompt's fixed part.
        card: The weights card (option ``scorer_weights``, else the one shipped for the
            model), or ``None``.
        scoring: The scorer in use, ``'auto'`` resolved.
        layer: ``l*``, the scoring layer and depth of the stored blocks.
        adapter: The query adapter, or ``None``.
        scorer: The scorer object of ``scoring``.
        calibration: The relevance cut-off's maps (:class:`heedrank.calibration.Calibration`), or ``None``.
    """

    base_lm: Any
    lm: Any
    layout: BlockLayout
    card: WeightsCard | None
    scoring: str
    layer: int
    adapter: QueryAdapter | None
    scorer: Scorer
    calibration: Any


def resolve_layer(option: int | None, scoring: str, card: WeightsCard | None, n_layers: int) -> int:
    """``l*``: option ``layer``; else the card's layer with learned or independent scoring; else
    ``round(0.6 * L)``.

    Raises:
        ValidationError: the layer is not below the model's depth.
    """
    layer = option
    if layer is None and scoring in ("learned", "independent") and card is not None:
        layer = int(card.data["layer"])
    if layer is None:
        layer = round(0.6 * n_layers)
    if not 0 <= layer < n_layers:
        raise ValidationError(f"layer must be in [0, {n_layers - 1}] for this model, got {layer!r}")
    return layer


def learned_weights(options: CachedBlockRankOptions, config: RerankerConfig, card: WeightsCard | None,
                    adapter: QueryAdapter | None, layer: int, lm: Any) -> Any:
    """The learned scorer's weights, float64 ``(l* + 1, heads)``: the query adapter's own when
    it carries some that fit and no ``scorer_weights`` is given, else the card's.

    Raises:
        NotFoundError: no card ships for the model and none is given.
        ValidationError: a card for another model, ``l*``, block length or layout.
    """
    import numpy as np

    shape = (layer + 1, lm.num_heads)
    adapter_w = None if adapter is None else adapter.weights
    # the weights of an adapter trained at a deeper l* (AdapterFit.problem) do not fit: the card's serve
    if options.scorer_weights is None and adapter_w is not None and np.size(adapter_w) == shape[0] * shape[1]:
        return np.asarray(adapter_w, dtype=np.float64).reshape(shape)
    if card is None:
        name = lm.identity.get("name", "")
        raise NotFoundError(f"no learned BlockRank weights ship for model {name!r}; fit them with "
                            "`heedrank lab fit --export CARD.json` and pass --opt scorer_weights=CARD.json")
    want = {"layer": layer, "max_doc_tokens": config.max_doc_tokens, "template": CACHE_TEMPLATE_VERSION, "spec": "heads"}
    return card.weights_for(want, lm.identity.get("sha256"), shape)


def independent_weights(card: WeightsCard | None, lm: Any, layer: int) -> IndependentWeights:
    """The card's ``independent`` entry, checked against the model and ``l*``.

    Raises:
        NotFoundError: no card for the model.
        ValidationError: no entry, or one fitted for another model, depth or head count.
    """
    if card is None:
        raise NotFoundError(f"scoring='independent' needs a weights card with an 'independent' entry; none ships for "
                            f"{lm.identity.get('name', 'this model')!r}: fit one (recipes/default) and pass it as "
                            "scorer_weights")
    if card.independent is None:
        raise ValidationError(f"the weights card {card.path} has no 'independent' entry: refit it with "
                              "`bash recipes/default/run.sh independent` or use scoring='learned'")
    weights = IndependentWeights.of(card.independent)
    if card.model_sha256 and lm.identity.get("sha256") and card.model_sha256 != lm.identity.get("sha256"):
        raise ValidationError(f"the weights card {card.path} was fitted for another model: refit it for this one")
    if weights.layers != layer + 1 or weights.heads != lm.num_heads:
        raise ValidationError(f"the card's independent weights are for {weights.layers} layers x {weights.heads} "
                              f"heads, not l* + 1 = {layer + 1} x {lm.num_heads}: set layer={weights.layers - 1}")
    return weights


def _calibration(card: WeightsCard | None, adapter: QueryAdapter | None) -> Any:
    """The card's cut-off maps, or ``None``: no card or maps, or a query adapter other than
    the one the maps were fitted with (they hold only for the scores they were fitted on)."""
    if card is None or not card.calibration:
        return None
    from heedrank.calibration import Calibration

    calibration = Calibration.from_json(card.calibration)
    want = calibration.info.get("query_adapter_sha256")
    if want is not None and want != (None if adapter is None else adapter.sha256):
        return None
    return calibration


def _fits(card: WeightsCard | None, options: CachedBlockRankOptions, config: RerankerConfig) -> bool:
    """Whether ``scoring='auto'`` scores with ``card``: a card given as ``scorer_weights`` always
    (a mismatch is then an error), the packaged one when it was fitted at the ``l*`` and block
    length asked for (a store at another layer, say, is scored zero-shot)."""
    if card is None:
        return False
    if options.scorer_weights is not None:
        return True
    layer_ok = options.layer is None or options.layer == int(card.data["layer"])
    return layer_ok and config.max_doc_tokens == int(card.data.get("max_doc_tokens", config.max_doc_tokens))


def resolved_scoring(card: WeightsCard | None, options: CachedBlockRankOptions, config: RerankerConfig) -> str:
    """The scorer a reranker of ``options`` scores with over ``card``: option ``scoring``, with
    ``'auto'`` resolved (:func:`auto_scoring` of whether the card fits, :func:`_fits`)."""
    return options.scoring if options.scoring != AUTO else auto_scoring(card, _fits(card, options, config))


def auto_scoring(card: WeightsCard | None, fits: bool) -> str:
    """What ``scoring='auto'`` scores with: ``independent`` when a card fits and holds the
    default's scorer (its ``scorer`` entry, over the ``independent`` entry's attention log-odds:
    :mod:`heedrank.scorer`), else ``learned`` when a card fits, else ``calibrated``."""
    if card is None or not fits:
        return "calibrated"
    return "independent" if card.serves_scorer else "learned"


def load_state(config: RerankerConfig, options: CachedBlockRankOptions, base: Any, signal: SignalScorer) -> CachedState:
    """Resolve and load everything of a cached BlockRank reranker over the shared LM ``base``
    (``signal``: its scorer for ``scoring='signal'``).

    Raises:
        NotFoundError: a missing ``scorer_weights`` card or query adapter; learned scoring
            without a card.
        ValidationError: a bad layer; a card or query adapter fitted for another model,
            ``l*``, block length or layout.
    """
    card = find_card(base.identity, options.scorer_weights)
    scoring = resolved_scoring(card, options, config)
    if card is None and options.scoring == AUTO:
        logger.warning("no weights card for model %s (sha256 %s) in %s: scoring with the %s scorer; fit one with "
                       "recipes/default (RECIPE_MODEL=...)", base.identity.get("name"), base.identity.get("sha256"),
                       ", ".join(str(d) for d in card_dirs()), scoring)
    layer = resolve_layer(options.layer, scoring, card, base.num_layers)
    layout = build_layout(base.tokenizer, config.max_doc_tokens, chat_template=options.chat_template)
    adapter = load_query_adapter(options.query_adapter, base, AdapterFit(layer, config.max_doc_tokens,
                                                                         CACHE_TEMPLATE_VERSION))
    lm = base if adapter is None else adapter.lm
    scorer: Scorer = signal
    if scoring == "learned":
        scorer = LearnedScorer(learned_weights(options, config, card, adapter, layer, lm))
    elif scoring == "independent":
        scorer = IndependentScorer(independent_weights(card, base, layer))
    elif scoring == "calibrated":
        scorer = CalibratedScorer(options.mask_std)
    calibration = _calibration(card, adapter) if scoring == "learned" else None
    return CachedState(base, lm, layout, card, scoring, layer, adapter, scorer, calibration)


def recorded_fusion(config: RerankerConfig) -> float | None:
    """The fusion weight with the first stage that ``config``'s reranker records, read
    without loading a model: cached BlockRank's, by the same rule as the loaded reranker's
    :attr:`~heedrank.reranker.cached.CachedBlockRankReranker.default_fusion`
    (:func:`heedrank.reranker.cards.fusion_weight` of its card and :func:`resolved_scoring`);
    ``None`` for other methods. The card is the packaged one for ``config.model``, or option
    ``scorer_weights`` (``None`` when that file is missing: the build would refuse it)."""
    from pathlib import Path

    from heedrank.reranker.cards import fusion_weight, packaged_card, read_card

    opts = config.options
    if not isinstance(opts, CachedBlockRankOptions):
        return None
    if opts.scorer_weights is not None:
        card = read_card(opts.scorer_weights) if Path(opts.scorer_weights).is_file() else None
    else:
        card = packaged_card(config.model)
    return fusion_weight(card, resolved_scoring(card, opts, config))


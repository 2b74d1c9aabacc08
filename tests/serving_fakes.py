"""Test fakes' side of the reranker -> server seam (:mod:`heedrank.seam`): a fake declares what the
server reads as plain attributes (``default_fusion``, ``calibration``, ``score_scale``,
``independent``, ``concurrent_calls``, ``cold_candidates``, ``scoring``, ``card``, ``config``),
and :class:`AttributeServing` returns them as its :class:`~heedrank.seam.RerankerServing`."""

from __future__ import annotations

from heedrank.seam import RerankerServing


class AttributeServing:
    """A fake reranker's ``serving()`` read from its attributes (a missing one: the record's default)."""

    def serving(self) -> RerankerServing:
        config = getattr(self, "config", None)
        return RerankerServing(
            scorer=getattr(self, "scorer", None), independent=getattr(self, "independent", None),
            default_fusion=getattr(self, "default_fusion", None), calibration=getattr(self, "calibration", None),
            score_scale=getattr(self, "score_scale", None), concurrent_calls=getattr(self, "concurrent_calls", 1),
            cold_candidates=getattr(self, "cold_candidates", None),
            max_doc_tokens=getattr(config, "max_doc_tokens", None), scoring=getattr(self, "scoring", None),
            card=_described(getattr(self, "card", None)))


def _described(card: object) -> object:
    """A fake's ``card`` as the record holds it: a :class:`~heedrank.reranker.cards.WeightsCard` described
    (:func:`~heedrank.reranker.cards.describe_card`, as a reranker's ``serving()`` does), anything else as it is."""
    from heedrank.reranker.cards import WeightsCard, describe_card

    return describe_card(card) if isinstance(card, WeightsCard) else card

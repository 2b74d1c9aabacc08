"""The weights card's values are read from the card, not restated: the ``--fusion`` and
``--max-doc-tokens`` help show what the packaged card and the options class hold."""

from __future__ import annotations

from heedrank.cli import options as cli_options
from heedrank.config import DEFAULT_LM
from heedrank.reranker.cached.card import packaged_card_path, read_card
from heedrank.reranker.options import CachedBlockRankOptions


def _help(alias) -> str:
    return alias.__metadata__[0].help


def test_fusion_help_shows_the_packaged_cards_weight() -> None:
    alpha = read_card(packaged_card_path(DEFAULT_LM)).fusion_alpha
    assert alpha is not None
    for alias in (cli_options.FusionOpt, cli_options.BatchFusionOpt):
        text = _help(alias)
        assert f"fusion.alpha, {alpha:g} in the packaged card" in text


def test_max_doc_tokens_help_shows_the_options_default() -> None:
    assert f"({CachedBlockRankOptions.default_max_doc_tokens} for the default method" in _help(cli_options.MaxDocTokensOpt)

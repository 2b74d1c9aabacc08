"""The weights card's values are read from the card, not restated: the ``--fusion`` and
``--max-doc-tokens`` help show what the packaged card and the options class hold."""

from __future__ import annotations

from heedrank.cli import options as cli_options
from heedrank.config import DEFAULT_LM
from heedrank.reranker.cards import packaged_card_path, read_card
from heedrank.reranker.options import CachedBlockRankOptions


def _help(alias) -> str:
    return alias.__metadata__[0].help


def test_fusion_help_says_the_packaged_card_serves_by_its_scorer() -> None:
    assert "scorer" in read_card(packaged_card_path(DEFAULT_LM)).data  # the default records no fusion weight
    for alias in (cli_options.FusionOpt, cli_options.BatchFusionOpt):
        assert "the default's scorer over attention, dense and rank" in " ".join(_help(alias).split())


def test_max_doc_tokens_help_shows_the_options_default() -> None:
    assert f"({CachedBlockRankOptions.default_max_doc_tokens} for the default method" in _help(cli_options.MaxDocTokensOpt)

"""Fakes of what reranking costs, for the per-request budget's figures (:mod:`heedrank.api.costs`):
rerankers that sleep fixed seconds per candidate, warm or cold, and state limits around a
stand-in LM so that ``GET /info`` lists them (no LM is loaded)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from api_fakes import FakeReranker
from heedrank.config import RerankerConfig
from heedrank.protocols import RerankResult
from heedrank.types import Document, Query


class _StandInLM:
    """Stands for a loaded LM (weak-referenceable, as the real one) around which :class:`CostlyReranker`
    and its kin state limits."""


STAND_IN_LM = _StandInLM()


class CostlyReranker(FakeReranker):
    """A fake that reads stored blocks (``cached``), costing ``cold_s`` seconds per candidate whose
    block it has not seen (encoded now) and ``warm_s`` per one it has (its RAM tier), slept one
    candidate at a time with :func:`heedrank.cancel.check` between them; ``RerankResult.cache``
    counts the hits and misses. It states limits around a stand-in LM, so ``GET /info`` lists it
    (:class:`heedrank.capabilities.LimitedReranker`). Registered as ``"costly"``; ``calls`` counts
    its rerankings."""

    name = "costly"
    cached = True
    warm_s = 0.06
    cold_s = 0.12
    calls = 0

    def __init__(self, config: RerankerConfig, lm: Any = None) -> None:
        super().__init__(config)
        self.seen: set[str] = set()
        self._lm = lm if lm is not None else STAND_IN_LM

    @property
    def loaded_lm(self) -> Any:
        return self._lm

    def limits(self) -> dict[str, Any]:
        return {"context": 8192, "max_query_tokens": 64, "max_doc_tokens": 128, "max_candidates": None}

    def cold_candidates(self, candidates: Sequence[Document], block_store: Any = None) -> list[bool]:
        return [d.content not in self.seen for d in candidates]

    def rerank(self, query: Query, candidates: Sequence[Document], block_store: Any = None) -> RerankResult:
        from heedrank.cancel import check

        t0 = time.perf_counter()
        type(self).calls += 1
        cold = self.cold_candidates(candidates)
        for is_cold in cold:
            check()
            time.sleep(self.cold_s if is_cold else self.warm_s)
        self.seen.update(d.content for d in candidates)
        misses = sum(cold)
        return replace(super().rerank(query, candidates), cache={"hits": len(cold) - misses, "misses": misses},
                       seconds=time.perf_counter() - t0)


class CostlyScoredReranker(CostlyReranker):
    """:class:`CostlyReranker` served by a default's scorer (its ``scorer``: attention alone), as
    the default is: a request past its budget's figures is answered in part, never refused.
    Registered as ``"costly-scored"``."""

    name = "costly-scored"
    calls = 0

    def __init__(self, config: RerankerConfig, lm: Any = None) -> None:
        from heedrank.scorer import Scorer

        super().__init__(config, lm)
        self.scorer = Scorer.from_card({"scorer": {"models": [{"uses": ["attention"], "weights": [1.0], "bias": 0.0}],
                                                   "threshold": 0.5}})


class PlainCostlyReranker(CostlyReranker):
    """:class:`CostlyReranker` that stores no blocks (as icr): every candidate costs ``cold_s``,
    each time. Registered as ``"costly-plain"``."""

    name = "costly-plain"
    cached = False
    cold_s = 0.1
    calls = 0

    def cold_candidates(self, candidates: Sequence[Document], block_store: Any = None) -> list[bool]:
        return [True] * len(candidates)

    def serving(self) -> Any:
        from dataclasses import replace as with_fields

        return with_fields(super().serving(), cold_candidates=None)  # no blocks: nothing is cold or warm

"""Cached BlockRank: BlockRank whose candidate blocks come from a document KV store.

Source: BlockRank (Gupta et al. 2025, arXiv 2510.05396, Sections 3-4) with this
project's extension (docs/design/algorithms.md section 3.1): block 0 is
the fixed instruction only and a candidate block carries no id, so each block's keys and
values (layers ``0..l*``) depend on the document alone. They are encoded once, at index
time, into the index's document KV store (``heedrank index kv build``), and a query runs
only its query block (about 40 tokens) against them
(:mod:`heedrank.reranker.doccache`: layout, encoding, context assembly, the RAM tier;
:mod:`~heedrank.reranker.cached.blocks`: the store's header, block arrays, a query's context).

Scorers (option ``scoring``, :mod:`~heedrank.reranker.cached.scorers`): ``independent`` (each
(query, document) pair's log-odds of relevance, the same in any list: the weights card's
``independent`` entry, :mod:`~heedrank.reranker.cached.independent`), ``learned`` (learned
weights over the calibrated attention of every (layer, head) of ``0..l*``, each z-scored
over the query's candidates: a weights card, ``reranker/data/<model>.blockrank-cached.json``,
:mod:`~heedrank.reranker.cards`), ``calibrated`` (ICR's calibrated query attention
with the mean - 2 std token mask), ``signal`` (BlockRank's signal tokens); ``auto`` resolves to
``independent`` when the card holds the default's scorer, else ``learned`` when a card fits,
else ``calibrated`` (:func:`~heedrank.reranker.cached.state.auto_scoring`). A query-side LoRA
adapter (option ``query_adapter``, :mod:`~heedrank.reranker.cached.adapter`) changes the
query and ``N/A`` passes only, so stored blocks stay valid. The defaults (``scoring='auto'``,
``query_adapter='auto'``, ``layer=null``, 128-token blocks) are the best measured
configuration when its files ship for the model (docs/results/default.md): the ``independent``
scores served by the card's learned scorer (:meth:`CachedBlockRankReranker.serving`,
:class:`heedrank.serving.ScorerServing`); for ``learned`` the card records a fusion weight with the
first stage (:attr:`CachedBlockRankReranker.default_fusion`).

Evidence (:meth:`CachedBlockRankReranker.rerank_with_evidence`,
:mod:`~heedrank.reranker.cached.evidence`): each candidate token's share of the document
score, mapped back to character offsets.

What the reranker resolves from its options and the model (card, scorer, ``l*``, query
adapter) it resolves once, in :meth:`CachedBlockRankReranker.load`
(:mod:`~heedrank.reranker.cached.state`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from heedrank.blocks import BlockKey, KVHeader
from heedrank.config import BLOCK_CACHE_BUDGET, RerankerConfig
from heedrank.errors import ValidationError
from heedrank.protocols import RerankResult
from heedrank.seam import IndependentServing, RerankerServing
from heedrank.reranker.base import DocumentScores, ScoredPass
from heedrank.reranker.blockforward import BlockPrompt, check_query_block, sliding_window
from heedrank.reranker.blockrank import BlockRankReranker
from heedrank.reranker.cached.adapter import QueryAdapter
from heedrank.reranker.cached.blocks import (
    Context,
    Fetched,
    TokenizedBlocks,
    assemble_context,
    block_arrays,
    fetch_blocks,
    store_header,
)
from heedrank.reranker.cards import WeightsCard, describe_card, fusion_weight
from heedrank.reranker.cached.evidence import rerank_with_evidence
from heedrank.reranker.cached.scorers import QueryPass, SignalScorer
from heedrank.reranker.cached.state import CachedState, learned_weights, load_state
from heedrank.reranker.doccache import (
    CACHE_TEMPLATE_VERSION,
    BlockLayout,
    BlockSource,
    instruction_kv,
    query_block,
)
from heedrank.reranker.options import CachedBlockRankOptions
from heedrank.reranker.scoring import CALIBRATION_QUERY
from heedrank.reranker.cached.slots import PassSlots
from heedrank.types import Document, Query

_UNRESOLVED = object()
"""Marks :meth:`CachedBlockRankReranker.block_round_trip` not resolved yet."""

DEFAULT_BLOCK_CACHE_BYTES = BLOCK_CACHE_BUDGET.default
"""RAM cache of ad-hoc candidate blocks (``/rerank``), bytes (1 GiB), unless ``block_cache_bytes``
or ``$HEEDRANK_BLOCK_CACHE_BYTES`` says otherwise."""


class CachedBlockRankReranker(BlockRankReranker):
    """Cached BlockRank (registry name ``"blockrank-cached"``; ``"default"`` names it).

    Options: :class:`heedrank.reranker.options.CachedBlockRankOptions`. :meth:`rerank`
    takes the collection's document KV store as ``block_store``; blocks it lacks are
    computed and written back, and without a store they come from the RAM cache
    (``block_cache_bytes``) or are computed. Scores: ``independent`` log-odds of P(relevant)
    of each pair, ``learned`` a weighted sum of z-scores (unitless), ``calibrated`` attention-mass differences (unitless), ``signal``
    probabilities summing to 1 over the distinct candidate texts. ``RerankResult.cache`` counts
    block ``hits`` and ``misses``. :meth:`load` loads the model and resolves the rest once;
    what needs it before then (``rerank``, :attr:`lm`, :attr:`scoring`, ...) runs it first.

    Args:
        config: Its ``max_doc_tokens`` is the block's content budget (``None``: 128).
        lm: A loaded LM to share (else loaded by :meth:`load`).
        block_cache_bytes: RAM cache of blocks not in a store, bytes (``None``:
            :data:`heedrank.config.BLOCK_CACHE_BUDGET`, i.e. ``$HEEDRANK_BLOCK_CACHE_BYTES`` or
            1 GiB; the service passes its ``Settings.block_cache_bytes`` through the reranker
            factory, :func:`heedrank.registry.build_reranker`).
        passes: Query passes run at once by concurrent :meth:`rerank` calls (``None``: 1), each
            in its own context buffer with its share of the torch threads
            (:class:`heedrank.reranker.cached.slots.PassSlots`); the service passes its rerank
            ``workers``. Candidate blocks are read, and cold ones encoded by the base model,
            outside the slots. A pass only reads the model, so passes need no lock.

    Raises:
        ValidationError: bad options, or ``$HEEDRANK_BLOCK_CACHE_BYTES`` is not a byte count.
    """

    name = "blockrank-cached"
    cached = True
    options_class = CachedBlockRankOptions
    options: CachedBlockRankOptions
    build_resources = ("block_cache_bytes", "passes")
    """What :func:`heedrank.registry.build_reranker` may pass to :meth:`from_config`."""
    layout_version = CACHE_TEMPLATE_VERSION
    """The cached prompt's layout version (:data:`heedrank.reranker.doccache.CACHE_TEMPLATE_VERSION`)."""

    def __init__(self, config: RerankerConfig, lm: Any = None, *, block_cache_bytes: int | None = None,
                 passes: int | None = None) -> None:
        super().__init__(config, lm)
        if block_cache_bytes is None:
            block_cache_bytes = BLOCK_CACHE_BUDGET.from_env()
        self.block_source = BlockSource(block_cache_bytes)
        """The RAM tier in front of the store (:class:`heedrank.reranker.doccache.BlockSource`)."""
        self.slots = PassSlots(passes or 1)
        """The slots its query passes run in (:class:`heedrank.reranker.cached.slots.PassSlots`)."""
        self._kv0_lock = threading.Lock()
        self._round_trip: Any = _UNRESOLVED
        self._state: CachedState | None = None
        self._load_lock = threading.Lock()
        self.tokenized = TokenizedBlocks()
        """Recent texts' block token ids and keys (:class:`heedrank.reranker.cached.blocks.TokenizedBlocks`)."""
        self._kv0: dict[int, Any] = {}

    @property
    def concurrent_calls(self) -> int:
        """Rerank calls that may run at once (:class:`heedrank.pipeline.RerankerCache` admits
        that many): the query passes it runs side by side (:class:`heedrank.reranker.cached.slots.PassSlots`)."""
        return self.slots.n

    # -- loading: the one step that reads the card, the adapter and the model ----------------
    def load(self) -> CachedBlockRankReranker:
        """Load now (the API does this at start-up): see :meth:`loaded`."""
        self.loaded()
        return self

    def loaded(self) -> CachedState:
        """The shared LM, weights card, scorer, ``l*``, layout and query adapter, loaded and
        resolved on the first call (:func:`heedrank.reranker.cached.state.load_state`).

        Raises:
            NotFoundError: a missing weights card or query adapter, or learned scoring without a card.
            ValidationError: a bad layer, or a card or adapter made for another configuration.
        """
        state = self._state
        if state is None:
            with self._load_lock:
                if self._state is None:
                    signal = SignalScorer(self.token_mass, self.reattn_scores if self.reattn is not None else None)
                    self._state = load_state(self.config, self.options, super().lm, signal)
                state = self._state
        return state

    @property
    def base_lm(self) -> Any:
        """The shared LM (never carries the adapter): blocks are always encoded with it."""
        return self.loaded().base_lm

    @property
    def lm(self) -> Any:
        """The LM the query passes run on: with a query adapter, a private copy carrying it
        (LoRA layers that the block encoders switch off), so the shared LM is never changed;
        else :attr:`base_lm`."""
        return self.loaded().lm

    @property
    def adapter(self) -> QueryAdapter | None:
        """The query adapter in use, or ``None``."""
        return self.loaded().adapter

    @property
    def card(self) -> WeightsCard | None:
        """The weights card (option ``scorer_weights``, else the one shipped for the model), or ``None``."""
        return self.loaded().card

    @property
    def scoring(self) -> str:
        """The scorer in use: option ``scoring``, with ``'auto'`` resolved
        (:func:`heedrank.reranker.cached.state.auto_scoring`: ``'independent'`` when the card holds
        the default's scorer, else ``'learned'`` with a card, else ``'calibrated'``)."""
        return self.loaded().scoring

    @property
    def layer(self) -> int:
        """Scoring layer ``l*`` and depth of the stored blocks: option ``layer``; else the
        weights card's layer with learned scoring; else ``round(0.6 * L)``."""
        return self.loaded().layer

    @property
    def layout(self) -> BlockLayout:
        """The cached prompt's fixed part (:class:`heedrank.reranker.doccache.BlockLayout`)."""
        return self.loaded().layout

    @property
    def default_fusion(self) -> float | None:
        """Fusion weight ``alpha`` with the first stage recorded in the weights card
        (``alpha z(first stage) + (1 - alpha) z(reranker)``, chosen on dev), or ``None``:
        :func:`heedrank.reranker.cards.fusion_weight` of the card and the scorer in use (the rule
        ``/info`` reads without loading a model)."""
        return fusion_weight(self.card, self.scoring)

    def serving(self) -> RerankerServing:
        """What the server reads (:class:`heedrank.seam.RerankerServing`): with
        ``scoring='independent'``, these scores are each pair's log-odds, served by the card's
        default scorer (its ``scorer`` entry: :mod:`heedrank.scorer`) when it holds one (an explicit
        fusion weight serves them fused instead, :class:`heedrank.serving.SigmoidServing`), else as
        :class:`heedrank.seam.IndependentServing` (the ``independent`` entry's cut-offs and fused map)."""
        card = self.card
        common = RerankerServing(default_fusion=self.default_fusion, calibration=self.loaded().calibration,
                                 score_scale=self.score_scale, concurrent_calls=self.concurrent_calls,
                                 cold_candidates=self.cold_candidates, max_doc_tokens=self.config.max_doc_tokens,
                                 scoring=self.scoring, card=describe_card(card))
        if self.scoring != "independent" or card is None or card.independent is None:
            return common
        entry = card.independent
        independent = IndependentServing(entry.threshold, entry.fused_map, entry.fused_threshold)
        if card.scorer is not None:
            return replace(common, scorer=card.scorer, scorer_threshold=card.scorer.threshold, independent=independent)
        return replace(common, independent=independent)

    # -- the document KV store's side --------------------------------------------------------
    @property
    def kv_depth(self) -> int:
        """Deepest layer whose keys/values a pass needs: ``l*``.

        Raises:
            ValidationError: a selected head deeper than ``l*`` (the store holds layers
                ``0..l*`` only).
        """
        deepest = max([self.layer] + [l for l, _ in self.heads or []])
        if deepest > self.layer:
            raise ValidationError(
                f"the document KV store holds layers 0..{self.layer} (l*); the selected heads reach "
                f"layer {deepest}: choose heads at or below l*, or a larger layer with a store built for it")
        return deepest

    def block_store_header(self) -> KVHeader:
        """What a document KV store must have been built with to serve this reranker
        (:func:`heedrank.reranker.cached.blocks.store_header`); raises as :attr:`kv_depth` does."""
        return store_header(self.base_lm, self.layout, self.kv_depth, self.options.kv_dtype)

    def encode_block_arrays(self, texts: Sequence[str]) -> list[tuple[BlockKey, Any, Any]]:
        """``(key, keys, values)`` per text for a document KV store (``heedrank index kv build``;
        :func:`heedrank.reranker.cached.blocks.block_arrays`), always from the base model (the
        block encoders switch a query adapter off); never reads or writes the RAM cache."""
        lm = self.base_lm
        with lm.lock:
            return block_arrays(lm, self.layout, self.instruction_kv(), texts, self.kv_depth,
                                batch_size=self.options.doc_batch_size)

    def block_keys(self, texts: Sequence[str]) -> list[BlockKey]:
        """Store keys of these document texts' blocks (tokenisation only, no LM pass)."""
        return [key for _, _, key in self.tokenized.blocks(self.base_lm.tokenizer, self.layout, texts)]

    def cold_candidates(self, candidates: Sequence[Document], block_store: Any = None) -> list[bool]:
        """Per candidate, whether its block would have to be encoded now: in neither
        ``block_store`` (the collection's document KV store) nor the RAM tier
        (:attr:`block_source`). Tokenisation only, no LM pass; a store read that later fails
        its checksum is still encoded then."""
        keys = self.block_keys([doc.content for doc in candidates])
        memory = self.block_source.memory
        return [not ((block_store is not None and block_store.contains(k)) or k in memory) for k in keys]

    def prefetch_blocks(self, candidates: Sequence[Document], block_store: Any = None) -> int:
        """Make the candidates' blocks warm without a query pass: read, or encoded by the base
        model and written to ``block_store`` or the RAM tier (:meth:`fetch_blocks`), so that a later
        :meth:`rerank` of them reads them (:class:`heedrank.capabilities.PrefetchesBlocks`). Stops at
        a layer boundary when the calling job is cancelled (:mod:`heedrank.cancel`).

        Returns:
            The blocks encoded now (the candidates' misses).
        """
        if not candidates:
            return 0
        return int(self.fetch_blocks(self.build_prompt(".", candidates), block_store).cache["misses"])

    def instruction_kv(self) -> list[tuple[Any, Any]]:
        """Block 0's keys/values for layers ``0..kv_depth`` (computed once per reranker)."""
        depth = self.kv_depth
        if depth not in self._kv0:
            import torch

            with self._kv0_lock, torch.inference_mode():
                if depth not in self._kv0:
                    self._kv0[depth] = instruction_kv(self.base_lm, self.layout.instruction_ids, depth)
        return self._kv0[depth]

    def cached_context(self, prompt: BlockPrompt, block_store: Any = None) -> Context:
        """Block 0's and the candidates' keys/values (blocks from ``block_store``, the RAM
        tier, or computed by the base model and written back), with room reserved for the query
        and ``N/A`` blocks on the fast path, in the reranker's own context buffer (callers hold
        the LM's lock until they are done with it; :meth:`rerank` uses a pass slot's instead)."""
        return self.assemble(prompt, self.fetch_blocks(prompt, block_store), self.context_buffer())

    def fetch_blocks(self, prompt: BlockPrompt, block_store: Any = None) -> Fetched:
        """The candidates' blocks (:func:`heedrank.reranker.cached.blocks.fetch_blocks`): from
        ``block_store``, the RAM tier, or computed by the base model now (never the query
        adapter's copy, so a running query pass is never disturbed) and written back."""
        return fetch_blocks(self.base_lm, self.block_source, self.instruction_kv(), prompt, self.kv_depth,
                            store=block_store, batch_size=self.options.doc_batch_size,
                            round_trip=self.block_round_trip())

    def assemble(self, prompt: BlockPrompt, fetched: Fetched, buffer: Any) -> Context:
        """Block 0 and ``fetched`` copied into ``buffer`` (``None``: fresh tensors) with room
        for the query and ``N/A`` blocks on the fast path."""
        reserve = len(prompt.query_ids) + len(prompt.calib_ids) if self.fast_path else 0
        return assemble_context(self.instruction_kv(), fetched, self.kv_depth, reserve=reserve,
                                buffer=buffer if self.fast_path else None)

    def block_round_trip(self) -> Any:
        """What a block computed now goes through before a query reads it: the store codec's
        :meth:`~heedrank.index.kv.codec.Codec.round_trip` of a quantised ``kv_dtype`` (int8), so
        that a document scores the same whether its block was stored or not, with or without a
        store; ``None`` for float16 (exact for fp16 models, within its rounding for float32 ones).
        Resolved once (the store header does not change after load)."""
        if self._round_trip is _UNRESOLVED:
            from heedrank import registry

            codec = registry.kv_codec(self.block_store_header())
            self._round_trip = codec.round_trip if codec.quantised else None
        return self._round_trip

    # -- the rerank hooks ----------------------------------------------------------------------
    def build_prompt(self, query: str, candidates: Sequence[Document]) -> BlockPrompt:
        """The cached prompt: the fixed block 0, one block per candidate (no id), the query
        block at the layout's fixed offset.

        Raises:
            ContextOverflowError: the query block would sit past the model's positions or past
                the sliding window of its layers ``0..l*`` (:attr:`position_limit`).
        """
        tok = self.base_lm.tokenizer
        layout = self.layout
        blocks = self.tokenized.blocks(tok, layout, [doc.content for doc in candidates])
        docs, truncated = [ids for ids, _, _ in blocks], [cut for _, cut, _ in blocks]
        prompt = BlockPrompt(list(layout.instruction_ids), docs, query_block(tok, layout, query),
                             query_block(tok, layout, CALIBRATION_QUERY), self.options.n_signal, truncated,
                             layout.query_offset, query.strip(), [])
        window = sliding_window(self.base_lm.model.config, self.layer)
        check_query_block(prompt, self.position_limit,
                          where="" if window is None else f"; sliding attention window {window} in layers 0..{self.layer}")
        return prompt

    @property
    def position_limit(self) -> int:
        """Positions the query block must end within: the model's ``max_positions``, or the
        sliding window of its layers ``0..l*`` when smaller. Past a window the block mask is not
        the model's attention (:func:`heedrank.reranker.blockforward.sliding_window`): a Mistral
        with a 16-token window moved signal scores by 0.03 with no error, before this bound
        (``tests/reranker/test_architectures.py``)."""
        limit = int(self.base_lm.max_positions)
        window = sliding_window(self.base_lm.model.config, self.layer)
        return limit if window is None else min(limit, window)

    def query_budget(self, candidates: Sequence[Document]) -> int:
        """The base budget, lowered so that the query block (at its fixed offset) stays
        inside the model's positions (and sliding window, :attr:`position_limit`)."""
        budget = super(BlockRankReranker, self).query_budget(candidates)
        fixed = len(query_block(self.base_lm.tokenizer, self.layout, ""))
        return max(1, min(budget, self.position_limit - self.layout.query_offset - fixed))

    def learned_weights(self) -> Any:
        """The ``scoring='learned'`` weights, float64 ``(l* + 1, heads)``: the query adapter's
        own when it carries some and no ``scorer_weights`` is given, else the weights card's.

        Raises:
            NotFoundError: no card ships for this model and none is given.
            ValidationError: a card for another model, ``l*``, block length or layout.
        """
        s = self.loaded()
        return learned_weights(self.options, self.config, s.card, s.adapter, s.layer, s.lm)

    def score_documents(self, query: str, docs: Sequence[Document], *, block_store: Any = None) -> DocumentScores:
        """:meth:`build_prompt`, the candidates' blocks (:meth:`fetch_blocks`, outside any
        lock), then the query pass in a pass slot (:class:`heedrank.reranker.cached.slots.PassSlots`:
        up to ``passes`` of them run at once, each in its own context buffer; the pass reads the
        model and changes nothing). ``details["timings"]["pass_wait"]``: seconds waiting for a slot."""
        prompt = self.build_prompt(query, docs)
        fetched = self.fetch_blocks(prompt, block_store)
        t0 = time.perf_counter()
        with self.slots.slot() as buffer:
            waited = time.perf_counter() - t0
            out = self._score(prompt, self.assemble(prompt, fetched, buffer))
        out.details["timings"]["pass_wait"] = waited
        return out

    def score_prompt(self, prompt: BlockPrompt, query: str, *, block_store: Any = None) -> DocumentScores:
        """Hook of the rerank skeleton, for callers holding the LM's lock: the context from the
        store in the reranker's own buffer, then the scorer chosen at load (:meth:`score_documents`
        runs the same in a pass slot)."""
        return self._score(prompt, self.cached_context(prompt, block_store))

    def _score(self, prompt: BlockPrompt, ctx: Context) -> DocumentScores:
        """The scorer chosen at load over the assembled context. The pass keeps each
        candidate token's share of the score (for evidence)."""
        s = self.loaded()
        out = s.scorer.score(QueryPass(s.lm, prompt, ctx.kv, s.layer, self.options.doc_batch_size, self.fast_path))
        return DocumentScores(
            scores=out.scores, truncated=list(prompt.truncated), prompt_tokens=prompt.total_tokens,
            details={"timings": {**ctx.seconds, **out.seconds}, "layer": s.layer}, cache=dict(ctx.cache),
            passes=(ScoredPass(prompt, out.tokens, tuple(range(len(prompt.doc_ids)))),),
        )

    # -- evidence -------------------------------------------------------------------------------
    def rerank_with_evidence(
        self, query: Query, candidates: Sequence[Document], *, max_spans: int = 3, block_store: Any = None
    ) -> RerankResult:
        """:meth:`rerank` plus evidence from the same pass: the same scores and order, with
        ``RerankResult.evidence = {doc_id: [EvidenceSpan, ...]}``, each candidate token's share of
        its document's score (:func:`heedrank.reranker.cached.evidence.rerank_with_evidence`).

        Raises:
            ValidationError: empty query, ``max_spans < 1``, a tokenizer without offsets.
        """
        return rerank_with_evidence(self, query, candidates, max_spans=max_spans, block_store=block_store)

    # -- reports ---------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["scoring"] = self.scoring
        d["kv_dtype"] = self.options.kv_dtype
        if self.adapter is not None:
            d["query_adapter"] = self.adapter.describe()
        if self.scoring == "learned" and self.card is not None:
            d["scorer_weights"] = self.card.path
        if self.default_fusion is not None:
            d["fusion"] = self.default_fusion
        return d



def from_config(config: RerankerConfig) -> CachedBlockRankReranker:
    return CachedBlockRankReranker(config)

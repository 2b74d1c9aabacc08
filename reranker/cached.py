"""Cached BlockRank: BlockRank whose candidate blocks come from a document KV store.

Source: BlockRank (Gupta et al. 2025, arXiv 2510.05396, Sections 3-4) with the
``query_in_instruction`` extension of ``shared/design/ALGORITHMS.md`` section 3: block 0 is
the fixed instruction only and a candidate block carries no id, so each block's keys and
values (layers ``0..l*``) depend on the document alone. They are encoded once, at index
time, into the index's document KV store (``heedrank index kv build``), and a query runs
only its query block (about 40 tokens) against them
(:mod:`heedrank.reranker.doccache`: layout, encoding, context assembly, the RAM tier).

Scorers (option ``scoring``): ``learned`` (learned weights over the calibrated attention of
every (layer, head) of ``0..l*``, each z-scored over the query's candidates: a weights card,
``reranker/data/<model>.blockrank-cached.json``), ``calibrated`` (ICR's calibrated query
attention with the mean - 2 std token mask), ``signal`` (BlockRank's signal tokens). A
query-side LoRA adapter (option ``query_adapter``) changes the query and ``N/A`` passes
only, so stored blocks stay valid. A document-side adapter (option ``document_adapter``,
issue #24 lever 3) is active only while candidate blocks are encoded: a store must be built
with it, and its header's ``adapter_hash`` names it. The defaults (``scoring='auto'``,
``query_adapter='auto'``, ``layer=null``, 128-token blocks) are the best measured
configuration when its files ship for the model (docs/RESULTS.md, "The query adapter"); the
card also records the fusion weight with the first stage (:attr:`default_fusion`).

Which layers of the query pass read the candidates (option ``attend``, issue #23): ``all``
(``0..l*``, a full store of keys and values of every layer), a first layer ``m`` (a
:class:`heedrank.reranker.attention.CandidateMask` below it), or ``none``: the *probe store*
(:mod:`heedrank.reranker.probe`, ``shared/design/ALGORITHMS.md`` section 6, design A). Then
the query pass runs against block 0 alone, once per query whatever the number of
candidates, and at the probe layers its rows are dotted with the candidates' stored keys;
the store keeps only those keys (``<index>/probe``, float16, int8 or int4), and an index
with only a full store serves it read-only (:class:`heedrank.index.kv.ProbeView`).

Evidence (:meth:`CachedBlockRankReranker.rerank_with_evidence`): each candidate token's
share of the document score, mapped back to character offsets.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property, partial
from pathlib import Path
from typing import Any

from heedrank.blocks import BlockKey, KVHeader
from heedrank.config import BLOCK_CACHE_BUDGET, RerankerConfig
from heedrank.errors import NotFoundError, ValidationError
from heedrank.protocols import RerankResult
from heedrank.reranker.base import DocumentScores, ScoredPass
from heedrank.reranker.blockrank import BlockPrompt, BlockRankReranker, calibrated_forward, check_query_block
from heedrank.reranker.doccache import (
    CACHE_TEMPLATE_VERSION,
    BlockSource,
    assemble_kv,
    block_key,
    build_layout,
    document_block,
    document_blocks,
    encode_blocks,
    instruction_kv,
    query_block,
)
from heedrank.reranker.options import AUTO, CachedBlockRankOptions
from heedrank.reranker.scoring import (
    CALIBRATION_QUERY,
    content_offsets,
    linear_head_scores,
    linear_head_token_scores,
    masked_document_scores,
    per_head_document_mass,
    spans_from_lengths,
    top_spans,
)
from heedrank.types import Document, Query

logger = logging.getLogger(__name__)

DEFAULT_BLOCK_CACHE_BYTES = BLOCK_CACHE_BUDGET.default
"""RAM cache of ad-hoc candidate blocks (``/rerank``), bytes (1 GiB), unless ``block_cache_bytes``
or ``$HEEDRANK_BLOCK_CACHE_BYTES`` says otherwise."""


@dataclass(frozen=True)
class Context:
    """The keys/values a query block reads, with what producing them cost.

    Attributes:
        kv: Per layer ``0..kv_depth``, ``(keys, values)`` float32 ``(1, kv_heads, K, head_dim)``:
            block 0 then the candidates' tokens (no padding); on the fast path views into the
            reranker's context buffer, valid until its next call (use under the LM's lock).
        seconds: ``blocks_fetch``, ``blocks_encode``, ``blocks_assemble``, seconds.
        cache: ``{"hits", "misses"}`` of the candidate blocks (store and RAM tiers).
    """

    kv: list[tuple[Any, Any]]
    seconds: dict[str, float]
    cache: dict[str, int]


class CachedBlockRankReranker(BlockRankReranker):
    """Cached BlockRank (registry name ``"blockrank-cached"``; ``"default"`` names it).

    Options: :class:`heedrank.reranker.options.CachedBlockRankOptions`. :meth:`rerank`
    takes the collection's document KV store as ``block_store``; blocks it lacks are
    computed and written back, and without a store they come from the RAM cache
    (``block_cache_bytes``) or are computed. Scores: ``learned`` a weighted sum of z-scores
    (unitless), ``calibrated`` attention-mass differences (unitless), ``signal``
    probabilities summing to 1 over the distinct candidate texts. ``details["cache"]`` counts
    block ``hits`` and ``misses``.

    Args:
        config: Its ``max_doc_tokens`` is the block's content budget (``None``: 128).
        lm: A loaded LM to share (else loaded on first use).
        block_cache_bytes: RAM cache of blocks not in a store, bytes (``None``:
            :data:`heedrank.config.BLOCK_CACHE_BUDGET`, i.e. ``$HEEDRANK_BLOCK_CACHE_BYTES`` or
            1 GiB; the service passes its ``Settings.block_cache_bytes`` through the reranker
            factory, :func:`heedrank.registry.build_reranker`).

    Raises:
        ValidationError: bad options, or ``$HEEDRANK_BLOCK_CACHE_BYTES`` is not a byte count.
    """

    name = "blockrank-cached"
    cached = True
    options_class = CachedBlockRankOptions
    options: CachedBlockRankOptions  # type: ignore[assignment]
    build_resources = ("block_cache_bytes",)
    """What :func:`heedrank.registry.build_reranker` may pass to :meth:`from_config`."""

    def __init__(self, config: RerankerConfig, lm: Any = None, *, block_cache_bytes: int | None = None) -> None:
        super().__init__(config, lm)
        if block_cache_bytes is None:
            block_cache_bytes = BLOCK_CACHE_BUDGET.from_env()
        self._block_source = BlockSource(block_cache_bytes)
        self.adapter: dict[str, Any] | None = None
        """The loaded query adapter (``path``, ``sha256``, ``weights``, ``step``), or ``None``."""
        self.document_adapter: dict[str, Any] | None = None
        """The loaded document-side adapter (``path``, ``sha256``, ``step``), or ``None``."""
        self._block_adapter: str | None = None
        self._adapter_lm: Any = None
        self._kv0: dict[int, Any] = {}

    @classmethod
    def from_config(cls, config: RerankerConfig, *, block_cache_bytes: int | None = None) -> CachedBlockRankReranker:
        """The reranker of ``config``, its RAM tier sized ``block_cache_bytes`` (see the class)."""
        return cls(config, block_cache_bytes=block_cache_bytes)

    def block_source(self) -> BlockSource:
        """The RAM tier in front of the store (:class:`heedrank.reranker.doccache.BlockSource`),
        sized at construction."""
        return self._block_source

    # -- what ships for the model ------------------------------------------------------------
    @property
    def base_lm(self) -> Any:
        """The shared LM (never carries the adapter): blocks are always encoded with it."""
        return BlockRankReranker.lm.fget(self)  # type: ignore[attr-defined]

    @property
    def lm(self) -> Any:
        """The LM the query passes run on: with a query adapter, a private copy carrying it
        (LoRA layers that the block encoders switch off), so the shared LM is never changed;
        else :attr:`base_lm`. The copy is made by :meth:`load` or on first use."""
        if self._adapter_lm is not None:
            return self._adapter_lm
        base = self.base_lm
        path = self.adapter_path
        doc = self.options.document_adapter
        if path is None and doc is None:
            return base
        self._adapter_lm = self._with_adapter(base, path, None if doc is None else Path(doc).expanduser())
        return self._adapter_lm

    @property
    def block_adapter(self) -> str | None:
        """peft adapter active while candidate blocks are encoded: the document tower
        (:data:`heedrank.reranker.adapters.DOCUMENT`, option ``document_adapter``, or one being
        trained: :meth:`use_block_adapter`), or ``None`` (the base model)."""
        if self.options.document_adapter is not None:
            self.lm  # loads it
        return self._block_adapter

    def use_block_adapter(self, name: str | None) -> None:
        """Encode candidate blocks with the LM's peft adapter ``name`` (training the document
        tower), or the base model (``None``); empties the RAM tier, whose blocks were encoded
        the old way."""
        self.lm
        self._block_adapter = name
        self.block_source().memory.clear()

    @cached_property
    def card(self) -> dict[str, Any] | None:
        """The weights card of ``scoring='learned'`` (option ``scorer_weights``, else the one
        shipped for the model: ``<model>.blockrank-cached.json``, or with ``attend='all'`` (or a
        layer) ``<model>.blockrank-cached-full.json`` when it ships), parsed; ``None`` when none
        ships and none is given.

        Raises:
            NotFoundError: ``scorer_weights`` names a missing file.
        """
        path = self.options.scorer_weights
        if path is None:
            from heedrank.reranker.heads import packaged_data_dir

            name = self.base_lm.identity.get("name", "")
            shipped = packaged_data_dir() / f"{name}.blockrank-cached.json"
            full = packaged_data_dir() / f"{name}.blockrank-cached-full.json"
            if self.options.attend not in (AUTO, "none") and full.exists():
                shipped = full  # the full-store configuration's card (attend='all' or from a layer)
            if not shipped.exists():
                return None
            path = str(shipped)
        if not Path(path).is_file():
            raise NotFoundError(f"weights card {path} not found; write one with `heedrank eval study-fit --export`")
        card = json.loads(Path(path).read_text(encoding="utf-8"))
        card["_path"] = str(path)
        return card

    @cached_property
    def scoring(self) -> str:
        """The scorer in use: option ``scoring``, with ``'auto'`` = ``'learned'`` when a weights
        card ships for the model (or ``scorer_weights`` is given), else ``'calibrated'``."""
        if self.options.scoring != AUTO:
            return self.options.scoring
        return "learned" if self.card is not None else "calibrated"

    @cached_property
    def layer(self) -> int:  # type: ignore[override]
        """Scoring layer ``l*`` and depth of the stored blocks: option ``layer``; else the
        weights card's layer with learned scoring; else ``round(0.6 * L)``.

        Raises:
            ValidationError: the layer is not below the model's depth.
        """
        layer = self.options.layer
        if layer is None and self.scoring == "learned" and self.card is not None:
            layer = int(self.card["layer"])
        n = self.base_lm.num_layers
        if layer is None:
            layer = round(0.6 * n)
        if not 0 <= layer < n:
            raise ValidationError(f"layer must be in [0, {n - 1}] for this model, got {layer!r}")
        return layer

    @cached_property
    def attend(self) -> str | int:
        """Which layers of the query pass attend to the candidates (option ``attend``; ``'auto'``
        = the weights card's ``attend`` with learned scoring, else ``'all'``): ``'all'``, a first
        layer ``m``, or ``'none'`` (the probe store)."""
        value = self.options.attend
        if value == AUTO:
            value = (self.card or {}).get("attend", "all") if self.scoring == "learned" else "all"
        if isinstance(value, int) and not 0 < value <= self.layer:
            raise ValidationError(f"attend must be 'all', 'none' or a layer in [1, {self.layer}], got {value!r}")
        return value

    @property
    def probe(self) -> bool:
        """Whether this is the probe-store scorer (``attend='none'``, :mod:`heedrank.reranker.probe`)."""
        return self.attend == "none"

    @property
    def window(self) -> bool:
        """Whether this is the window-store scorer (issue #23): ``attend = m`` (or ``'all'``,
        ``m = 0``) with read layers (option ``probe_layers`` or the card's ``layers``): the
        query pass attends to the candidates from layer ``m`` up to the deepest read layer,
        so the store keeps the keys of the read layers and of ``m..max-1`` and the values of
        ``m..max-1`` (:attr:`window_layers`). With ``m = 0`` it is the full store cut at the
        deepest read layer, without that layer's values (design B)."""
        return self.attend != "none" and self._given_layers is not None

    @cached_property
    def window_layers(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """``(key layers, value layers)`` of a window store (:attr:`window`).

        Raises:
            ValidationError: ``m`` at or above the deepest read layer (no layer reads a
                candidate's values: that is ``attend='none'``).
        """
        m, depth = (0 if self.attend == "all" else int(self.attend)), max(self.probe_layers)
        if m >= depth:
            raise ValidationError(f"attend={m} at or above the deepest read layer {depth} reads no candidate's "
                                  "values: use attend='none' (a probe store)")
        return tuple(sorted(set(self.probe_layers) | set(range(m, depth)))), tuple(range(m, depth))

    @property
    def candidates_below(self) -> int:
        """Layers ``0..candidates_below-1`` of the query pass skip the candidates (0: none skip)."""
        if self.attend == "all":
            return 0
        return self.layer + 1 if self.attend == "none" else int(self.attend)

    @cached_property
    def _given_layers(self) -> tuple[int, ...] | None:
        """Option ``probe_layers``, else the weights card's ``layers`` (learned scoring), else ``None``."""
        layers = self.options.probe_layers
        if layers is None and self.scoring == "learned" and self.card is not None and self.card.get("layers"):
            layers = tuple(int(l) for l in self.card["layers"])
        return None if layers is None else tuple(layers)

    @cached_property
    def probe_layers(self) -> tuple[int, ...]:
        """The layers a probe or window store's scorer reads: option ``probe_layers``, else
        the weights card's ``layers``, else ``(l*,)``.

        Raises:
            ValidationError: a layer above ``l*``.
        """
        layers = self._given_layers
        layers = tuple(layers) if layers is not None else (self.layer,)
        if max(layers) > self.layer:
            raise ValidationError(f"probe_layers {list(layers)} reach above l* = {self.layer}")
        return layers

    @property
    def feature_layers(self) -> list[int]:
        """The layers whose (layer, head) features the learned scorer weighs: the probe layers
        of a probe or window store, else ``0..l*``."""
        return list(self.probe_layers) if self.probe or self.window else list(range(self.layer + 1))

    @cached_property
    def kv_dtype(self) -> str:
        """Store dtype: option ``kv_dtype``; ``'auto'`` = the weights card's ``kv_dtype`` for a
        probe or window store, else ``'float16'``."""
        value = self.options.kv_dtype
        if value == AUTO:
            value = ((self.card or {}).get("kv_dtype", "float16") if (self.probe or self.window)
                     and self.scoring == "learned" else "float16")
        return str(value)

    @cached_property
    def adapter_path(self) -> Path | None:
        """Folder of the query adapter in use (option ``query_adapter``; ``'auto'`` = the
        packaged one when it ships for the model and was trained for this ``l*`` and block
        length), or ``None``.

        Raises:
            NotFoundError: ``'packaged'`` for a model without one, or a path that is not an adapter.
        """
        from heedrank.reranker.adapters import resolve_adapter

        value = self.options.query_adapter
        if value is None:
            return None
        identity = self.base_lm.identity
        if value != AUTO:
            return resolve_adapter(str(value), identity)
        try:
            path = resolve_adapter("packaged", identity)
        except NotFoundError:
            return None
        card = json.loads((path / "adapter.json").read_text(encoding="utf-8"))
        return path if self._adapter_mismatch(card) is None else None

    @property
    def default_fusion(self) -> float | None:
        """Fusion weight ``alpha`` with the first stage recorded in the weights card
        (``alpha z(first stage) + (1 - alpha) z(reranker)``, chosen on dev), or ``None``
        (no card, or another scorer than ``learned``)."""
        if self.scoring != "learned" or self.card is None:
            return None
        alpha = (self.card.get("fusion") or {}).get("alpha")
        return None if alpha is None else float(alpha)

    @cached_property
    def calibration(self) -> Any:
        """The relevance cut-off's maps (:class:`heedrank.calibration.Calibration`) recorded in
        the weights card (``"calibration"``, written by ``heedrank eval calibrate``), or ``None``:
        no card, another scorer than ``learned``, or a query adapter other than the one the
        maps were fitted with (they hold only for the scores they were fitted on)."""
        if self.scoring != "learned" or self.card is None or not self.card.get("calibration"):
            return None
        from heedrank.calibration import Calibration

        calibration = Calibration.from_json(self.card["calibration"])
        want = calibration.info.get("query_adapter_sha256")
        if want is not None and want != self._adapter_sha256:
            return None
        return calibration

    @cached_property
    def _adapter_sha256(self) -> str | None:
        """sha256 of the query adapter in use (:attr:`adapter_path`), ``None`` without one."""
        from heedrank.reranker.adapters import adapter_hash

        path = self.adapter_path
        return None if path is None else adapter_hash(path)

    def _adapter_mismatch(self, card: dict[str, Any]) -> str | None:
        """Why an adapter card does not serve this reranker, or ``None``. An adapter trained at
        a deeper ``l*`` serves a shallower one (the query pass is causal in depth: its layers
        up to ``l*`` are the ones it was trained with)."""
        want = {"layer": self.layer, "max_doc_tokens": self.config.max_doc_tokens, "template": self.layout_version()}
        got = {k: card.get(k) for k in want}
        if isinstance(got["layer"], int) and got["layer"] >= self.layer:
            got["layer"] = self.layer
        return None if got == want else f"was trained for {got}; this reranker is {want}"

    def _with_adapter(self, base: Any, path: Path | None, document: Path | None = None) -> Any:
        """``base`` copied, with the query adapter at ``path`` and the document-side adapter
        at ``document`` loaded (either may be ``None``).

        Raises:
            ValidationError: an adapter trained for another model, ``l*``, block length or
                layout, or a query adapter given as the document adapter (or the reverse:
                :func:`heedrank.reranker.adapters.load_adapter`).
        """
        import copy

        from heedrank.reranker.adapters import DOCUMENT, QUERY, adapter_hash, load_adapter
        from heedrank.reranker.lm import LoadedLM

        model = copy.deepcopy(base.model)
        for where, name, tower in ((path, "query adapter", "query"), (document, "document adapter", "document")):
            if where is None:
                continue
            card, weights = load_adapter(where, model, base.identity, DOCUMENT if tower == "document" else QUERY)
            problem = self._adapter_mismatch(card)
            if problem is not None:
                raise ValidationError(f"{name} {where} {problem}: use the adapter's options or retrain it")
            info = {"path": str(where), "sha256": adapter_hash(where), "step": card.get("step")}
            if tower == "query":
                self.adapter = {**info, "weights": weights}
            else:
                self.document_adapter = info
                self._block_adapter = DOCUMENT
        model.eval()
        return LoadedLM(model, base.tokenizer, base.identity, base.device, base.load_seconds)

    # -- the cached prompt ------------------------------------------------------------------
    @cached_property
    def layout(self) -> Any:
        """The cached prompt's fixed part (:class:`heedrank.reranker.doccache.BlockLayout`)."""
        return build_layout(self.base_lm.tokenizer, self.config.max_doc_tokens, chat_template=self.options.chat_template)

    @staticmethod
    def layout_version() -> str:
        return CACHE_TEMPLATE_VERSION

    @property
    def kv_depth(self) -> int:
        """Deepest layer whose keys/values a pass needs: ``l*``.

        Raises:
            ValidationError: a selected head deeper than ``l*`` (the store holds layers
                ``0..l*`` only).
        """
        if self.probe or self.window:
            return max(self.probe_layers)
        heads = self.heads
        deepest = max([self.layer] + [l for l, _ in heads or []])
        if deepest > self.layer:
            raise ValidationError(
                f"the document KV store holds layers 0..{self.layer} (l*); the selected heads reach "
                f"layer {deepest}: choose heads at or below l*, or a larger layer with a store built for it")
        return deepest

    def block_store_header(self) -> KVHeader:
        """What a document KV store must have been built with to serve this reranker: the
        base model's hash, the cached layout's version and instruction, ``l*``, the model's
        key/value heads and head dimension, the block length and ``kv_dtype``; the document
        adapter's sha256 (``adapter_hash``) when one encodes the blocks (never the query
        adapter's: blocks never use it).

        Raises:
            ValidationError: see :attr:`kv_depth`.
        """
        cfg = self.base_lm.model.config
        n_heads = int(cfg.num_attention_heads)
        if self.options.document_adapter is not None:
            self.lm  # loads it (its sha256 goes in the header)
        return KVHeader(
            model_hash=str(self.base_lm.identity.get("sha256") or self.base_lm.identity.get("name")),
            prompt_template_version=self.layout_version(),
            instruction_hash=self.layout.fingerprint(),
            layer=self.kv_depth,
            kv_heads=int(getattr(cfg, "num_key_value_heads", None) or n_heads),
            head_dim=int(getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads),
            max_doc_tokens=self.layout.max_block_tokens,
            dtype=self.kv_dtype,
            adapter_hash=None if self.document_adapter is None else self.document_adapter["sha256"],
            layers=self.probe_layers if self.probe else self.window_layers[0] if self.window else None,
            keys_only=self.probe,
            value_layers=self.window_layers[1] if self.window else None,
        )

    def encode_block_arrays(self, texts: Sequence[str]) -> list[tuple[BlockKey, Any, Any]]:
        """``(key, keys, values)`` per text for a document KV store (``heedrank index kv build``):
        float32 numpy arrays ``(kv_depth + 1, kv_heads, T, head_dim)`` (a probe store:
        keys ``(len(probe_layers), kv_heads, T, head_dim)`` and values ``None``; a window
        store: the keys and values of :attr:`window_layers`), always from the base
        model (the block encoders switch a query adapter off). Texts sharing a block share a key; this never reads or writes the RAM cache."""
        import torch

        lm = self.lm  # the block encoders switch a query adapter off
        blocks = [document_block(lm.tokenizer, self.layout, t)[0] for t in texts]
        with lm.lock, torch.inference_mode():
            kvs = encode_blocks(lm, self.instruction_kv(), blocks, self.kv_depth, batch_size=self.options.doc_batch_size,
                                adapter=self.block_adapter)
        if self.probe:  # keys of the probe layers only
            sel = list(self.probe_layers)
            return [(block_key(b), k[sel].float().cpu().numpy(), None) for b, (k, _) in zip(blocks, kvs)]
        if self.window:
            kl, vl = (list(x) for x in self.window_layers)
            return [(block_key(b), k[kl].float().cpu().numpy(), v[vl].float().cpu().numpy()) for b, (k, v) in zip(blocks, kvs)]
        return [(block_key(b), k.float().cpu().numpy(), v.float().cpu().numpy()) for b, (k, v) in zip(blocks, kvs)]

    def block_keys(self, texts: Sequence[str]) -> list[BlockKey]:
        """Store keys of these document texts' blocks (tokenisation only, no LM pass)."""
        return [block_key(document_block(self.base_lm.tokenizer, self.layout, t)[0]) for t in texts]

    def instruction_kv(self) -> list[tuple[Any, Any]]:
        """Block 0's keys/values for layers ``0..kv_depth`` (computed once per reranker)."""
        depth = self.kv_depth
        if depth not in self._kv0:
            import torch

            with torch.inference_mode():
                self._kv0[depth] = instruction_kv(self.lm, self.layout.instruction_ids, depth)
        return self._kv0[depth]

    def cached_context(self, prompt: BlockPrompt, block_store: Any = None) -> Context:
        """Block 0's and the candidates' keys/values (blocks from ``block_store``, the RAM
        tier, or computed and written back), with room reserved for the query and ``N/A``
        blocks on the fast path."""
        import torch

        depth = self.kv_depth
        reserve = len(prompt.query_ids) + len(prompt.calib_ids) if self.fast_path else 0
        with torch.inference_mode():
            kv0 = self.instruction_kv()
            window = self.window_layers if self.window else None
            blocks, fetch = self.block_source().fetch(self.lm, kv0, prompt.doc_ids, depth, store=block_store,
                                                    batch_size=self.options.doc_batch_size, window=window,
                                                    adapter=self.block_adapter)
            t0 = time.perf_counter()
            kv = assemble_kv(kv0, blocks, depth, reserve=reserve, buffer=self.context_buffer(), layers=window)
        seconds = {"blocks_fetch": (fetch.seconds or {}).get("fetch", 0.0),
                   "blocks_encode": (fetch.seconds or {}).get("encode", 0.0),
                   "blocks_assemble": time.perf_counter() - t0}
        return Context(kv, seconds, {"hits": fetch.hits, "misses": fetch.misses})

    def probe_keys(self, prompt: BlockPrompt, block_store: Any = None) -> tuple[dict[int, Any], dict[str, float], dict[str, int]]:
        """The candidates' keys at the probe layers, concatenated: ``{layer: (kv_heads, D,
        head_dim)}`` float32 (``D`` candidate tokens in order), with fetch timings (seconds)
        and the block cache's ``{"hits", "misses"}`` (blocks from a keys-only store, the RAM
        tier, or encoded and written back)."""
        import torch

        layers = self.probe_layers
        with torch.inference_mode():
            kv0 = self.instruction_kv()
            blocks, fetch = self.block_source().fetch(self.lm, kv0, prompt.doc_ids, self.kv_depth, store=block_store,
                                                    batch_size=self.options.doc_batch_size, probe_layers=layers,
                                                    adapter=self.block_adapter)
            t0 = time.perf_counter()
            keys = {l: torch.cat([b[0][i] for b in blocks], dim=1).float() if blocks else
                    torch.zeros(kv0[0][0].shape[1], 0, kv0[0][0].shape[3]) for i, l in enumerate(layers)}
        seconds = {"blocks_fetch": (fetch.seconds or {}).get("fetch", 0.0),
                   "blocks_encode": (fetch.seconds or {}).get("encode", 0.0),
                   "blocks_assemble": time.perf_counter() - t0}
        return keys, seconds, {"hits": fetch.hits, "misses": fetch.misses}

    def build_prompt(self, query: str, candidates: Sequence[Document]) -> BlockPrompt:
        """The cached prompt: the fixed block 0, one block per candidate (no id), the query
        block at the layout's fixed offset.

        Raises:
            ContextOverflowError: the query block would sit past the model's positions.
        """
        tok = self.base_lm.tokenizer
        layout = self.layout
        blocks = document_blocks(tok, layout, [doc.content for doc in candidates])
        docs, truncated = [ids for ids, _ in blocks], [cut for _, cut in blocks]
        prompt = BlockPrompt(list(layout.instruction_ids), docs, query_block(tok, layout, query),
                             query_block(tok, layout, CALIBRATION_QUERY), self.options.n_signal, truncated,
                             layout.query_offset, query.strip(), [])
        check_query_block(prompt, self.base_lm.max_positions)
        return prompt

    def query_budget(self, candidates: Sequence[Document]) -> int:
        """The base budget, lowered so that the query block (at its fixed offset) stays
        inside the model's positions."""
        budget = super(BlockRankReranker, self).query_budget(candidates)
        fixed = len(query_block(self.base_lm.tokenizer, self.layout, ""))
        return max(1, min(budget, int(self.base_lm.max_positions) - self.layout.query_offset - fixed))

    # -- scoring ------------------------------------------------------------------------------
    def learned_weights(self) -> Any:
        """The ``scoring='learned'`` weights, float64 ``(l* + 1, heads)``: the query adapter's
        own when it carries some and no ``scorer_weights`` is given, else the weights card's.

        Raises:
            NotFoundError: no card ships for this model and none is given.
            ValidationError: a card for another model, ``l*``, block length or layout.
        """
        import numpy as np

        shape = (len(self.feature_layers), self.lm.num_heads)
        adapter_w = (self.adapter or {}).get("weights")
        if self.options.scorer_weights is None and adapter_w is not None and np.size(adapter_w) == shape[0] * shape[1]:
            return np.asarray(adapter_w, dtype=np.float64).reshape(shape)
        card = self.card
        if card is None:
            name = self.base_lm.identity.get("name", "")
            raise NotFoundError(f"no learned BlockRank weights ship for model {name!r}; fit them with "
                                "`heedrank eval study-fit --export CARD.json` and pass --opt scorer_weights=CARD.json")
        want = {"layer": self.layer, "max_doc_tokens": self.config.max_doc_tokens,
                "template": self.layout_version(), "spec": "heads", "attend": self.attend,
                "layers": self.feature_layers}
        got = {k: card.get(k) for k in want}
        got["attend"] = card.get("attend", "all")
        got["layers"] = card.get("layers") or list(range(int(card.get("layer", -1)) + 1))
        sha = card.get("model_sha256")
        if got != want or (sha and sha != self.base_lm.identity.get("sha256")):
            raise ValidationError(f"weights card {card['_path']} was fitted for {got} (model {sha}); this reranker is "
                                  f"{want} (model {self.base_lm.identity.get('sha256')}): refit or change the options")
        return np.asarray(card["weights"], dtype=np.float64).reshape(shape)

    def score_prompt(self, prompt: BlockPrompt, query: str, *, block_store: Any = None) -> DocumentScores:
        """Hook of the rerank skeleton (under the LM's lock): the context from the store,
        then the scorer. The pass keeps each candidate token's share of the score (for
        evidence)."""
        import torch

        if self.probe:
            return self._probe_scores(prompt, block_store)
        if self.window and self.scoring == "signal":
            raise ValidationError("a window store (attend=m with probe_layers) scores with 'learned' or 'calibrated', "
                                  "not 'signal'")
        ctx = self.cached_context(prompt, block_store)
        L0 = len(prompt.instruction_ids)
        bounds = spans_from_lengths(prompt.doc_lengths)
        tokens = None
        if self.scoring == "signal":
            scores, t = self._signal_scores(prompt, ctx.kv, bounds)
        else:
            with torch.inference_mode():
                layers = self.feature_layers
                D = sum(prompt.doc_lengths)
                qo, co, t = calibrated_forward(self.lm, prompt, self.kv_depth, read_layers=layers,
                                               doc_batch_size=self.options.doc_batch_size, kv=ctx.kv,
                                               fast=self.fast_path, candidates_below=self.candidates_below)
                if self.scoring == "learned":
                    feats = per_head_document_mass(qo, L0, prompt.doc_lengths, layers, minus=co)
                    w = torch.as_tensor(self.learned_weights())
                    scores = linear_head_scores(feats, w).tolist()
                    tokens = partial(linear_head_token_scores, qo, co, L0, D, layers, feats, w)  # explain only
                else:
                    c = sum((qo[l][0, :, L0: L0 + D] - co[l][0, :, L0: L0 + D]).sum(0) for l in layers)
                    scores = masked_document_scores(c, bounds, self.options.mask_std)
                    tokens = c
        details: dict[str, Any] = {"timings": {**ctx.seconds, **t}, "layer": self.layer, "cache": ctx.cache}
        return DocumentScores(
            scores=scores, truncated=list(prompt.truncated), prompt_tokens=prompt.total_tokens, details=details,
            passes=(ScoredPass(prompt, tokens, tuple(range(len(prompt.doc_ids)))),),
        )

    def _probe_scores(self, prompt: BlockPrompt, block_store: Any) -> DocumentScores:
        """The probe-store scorer (``attend='none'``): one query pass against block 0, then the
        candidates' keys at the probe layers (:mod:`heedrank.reranker.probe`); ``learned``
        weighs the calibrated (layer, head) mass, ``calibrated`` sums it.

        Raises:
            ValidationError: ``scoring='signal'`` (the probe scorer reads the calibrated mass).
        """
        import torch

        from heedrank.reranker.probe import probe_features, probe_query_pass

        if self.scoring == "signal":
            raise ValidationError("attend='none' (a probe store) scores with 'learned' or 'calibrated', not 'signal'")
        keys, seconds, cache = self.probe_keys(prompt, block_store)
        layers = list(self.probe_layers)
        t0 = time.perf_counter()
        with torch.inference_mode():
            rows = probe_query_pass(self.lm, prompt, self.instruction_kv(), layers, fast=self.fast_path)
            t1 = time.perf_counter()
            feats = probe_features(rows, keys, prompt.doc_lengths, layers).double()
            if self.scoring == "learned":
                scores = linear_head_scores(feats, torch.as_tensor(self.learned_weights())).tolist()
            else:
                scores = feats.sum(dim=(1, 2)).tolist()
        timings = {**seconds, "query": t1 - t0, "probe": time.perf_counter() - t1}
        details: dict[str, Any] = {"timings": timings, "layer": self.layer, "cache": cache}
        return DocumentScores(
            scores=scores, truncated=list(prompt.truncated), prompt_tokens=prompt.total_tokens, details=details,
            passes=(ScoredPass(prompt, partial(self._probe_token_scores, rows, keys, prompt, feats),
                               tuple(range(len(prompt.doc_ids)))),),
        )

    def _probe_token_scores(self, rows: Any, keys: dict[int, Any], prompt: BlockPrompt, feats: Any) -> Any:
        """Each candidate token's share of the probe score (evidence): as
        :func:`linear_head_token_scores` on the probe's per-token calibrated mass."""
        import torch

        from heedrank.reranker.probe import probe_mass

        layers = list(self.probe_layers)
        L0, D = len(prompt.instruction_ids), sum(prompt.doc_lengths)
        ones = [1] * D  # one "document" per token: the probe's per-token mass
        with torch.inference_mode():
            qo, co = {}, {}
            for l in layers:
                m = probe_mass(rows, l, keys[l], ones)  # (2, D, H)
                pad = torch.zeros(m.shape[2], L0, dtype=m.dtype)
                qo[l] = torch.cat([pad, m[0].T], dim=1)[None]
                co[l] = torch.cat([pad, m[1].T], dim=1)[None]
            if self.scoring != "learned":
                return sum((qo[l][0, :, L0:] - co[l][0, :, L0:]).sum(0) for l in layers)
            w = torch.as_tensor(self.learned_weights())
            return linear_head_token_scores(qo, co, L0, D, layers, feats, w)

    def _signal_scores(self, prompt: BlockPrompt, kv: Any, bounds: list[tuple[int, int]]) -> tuple[list[float], dict]:
        mass, t = self.token_mass(prompt, kv)
        if self.reattn is not None:
            return self.reattn_scores(prompt, mass, bounds), t
        return [float(mass[s:e].sum()) for s, e in bounds], t

    def scores_and_cache(self, prompt: BlockPrompt, block_store: Any = None) -> tuple[list[float], dict[str, float], dict[str, int]]:
        """Candidate scores (first-stage order), timings in seconds and the block cache's
        ``{"hits", "misses"}`` (studies and benchmarks)."""
        out = self.score_prompt(prompt, prompt.query_text, block_store=block_store)
        return out.scores, out.details["timings"], out.details["cache"]

    # -- evidence -------------------------------------------------------------------------------
    def rerank_with_evidence(
        self, query: Query, candidates: Sequence[Document], *, max_spans: int = 3, block_store: Any = None
    ) -> RerankResult:
        """:meth:`rerank` plus evidence from the same pass: the same scores and order, with
        ``details["evidence"] = {doc_id: [EvidenceSpan, ...]}``.

        A token's evidence score is its share of the document's score: with ``learned``
        scoring ``t_j = sum_{l,h} w_lh c_lh,j / sd_lh`` (``c``: calibrated attention of the
        query rows to token ``j`` at layer ``l``, head ``h``; ``sd``: the feature's standard
        deviation over the candidates, as in the z-score), so that a document's score is the
        sum of its tokens' up to a per-query constant; with ``calibrated`` the calibrated
        attention summed over layers and heads; with ``signal`` the signal tokens' attention.
        Tokens group into words, the best positive words merge into spans (as ICR's
        :meth:`~heedrank.reranker.icr.ICRReranker.evidence_from`); offsets are characters
        into ``doc.text`` (or ``doc.title``): ``text[start:end] == span.text``.

        Raises:
            ValidationError: empty query, ``max_spans < 1``, a tokenizer without offsets.
        """
        if max_spans < 1:
            raise ValidationError(f"max_spans must be >= 1, got {max_spans}")
        run = self.run(query, candidates, block_store=block_store)
        evidence: dict[str, list[Any]] = {d.doc_id: [] for d in candidates}
        if run.scored is not None and run.scored.passes:
            p = run.scored.passes[0]
            prompt: BlockPrompt = p.prompt
            state = p.state  # learned: computed now; calibrated: the tensor; signal: read again
            if state is None:
                import torch

                with self.lm.lock, torch.inference_mode():
                    state = self.token_mass(prompt, self.cached_context(prompt, block_store).kv)[0]
            tokens = (state() if callable(state) else state).double().tolist()
            bounds = spans_from_lengths(prompt.doc_lengths)
            tok = self.base_lm.tokenizer
            n_open = len(self.layout.open_ids)
            for doc, o in zip(candidates, run.owner):
                start, end = bounds[o]
                ids, offsets = content_offsets(tok, doc, self.config.max_doc_tokens, strip=True)
                first = start + n_open
                if prompt.doc_ids[o][n_open: n_open + len(ids)] != ids:
                    logger.debug("no evidence for %s: its tokens could not be aligned with the block", doc.doc_id)
                    continue
                evidence[doc.doc_id] = top_spans(doc, offsets, tokens[first: first + len(ids)], max_spans)
        return replace(run.result, details={**run.result.details, "evidence": evidence})

    # -- reports ---------------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["scoring"] = self.scoring
        d["kv_dtype"] = self.kv_dtype
        d["attend"] = self.attend
        if self.probe or self.window:
            d["probe_layers"] = list(self.probe_layers)
        if self.adapter is not None:
            d["query_adapter"] = {k: self.adapter[k] for k in ("path", "sha256", "step")}
        if self.document_adapter is not None:
            d["document_adapter"] = dict(self.document_adapter)
        if self.scoring == "learned" and self.card is not None:
            d["scorer_weights"] = self.card["_path"]
        if self.default_fusion is not None:
            d["fusion"] = self.default_fusion
        return d

    def card_figures(self) -> dict[str, Any] | None:
        """The dev and test nDCG@10 recorded in the weights card for the configuration it
        ships (``configuration``: with the query adapter and fusion), or ``None``."""
        if self.card is None:
            return None
        return {k: self.card[k] for k in ("configuration", "fusion", "dev_ndcg@10", "test_ndcg@10") if k in self.card}


def from_config(config: RerankerConfig) -> CachedBlockRankReranker:
    return CachedBlockRankReranker(config)

"""Typed options of the attention rerankers, one frozen dataclass per method.

``RerankerConfig.options`` is an untyped mapping (it comes from ``--opt KEY=VALUE``, from a
``/search`` request or from a Python caller). Each reranker turns it into its options class
once, at construction, with :meth:`RerankerOptions.parse`: unknown keys are refused with a
:class:`~heedrank.errors.ValidationError` naming the valid ones (``--opt lyaer=18`` no
longer scores silently at the default layer), values are type- and range-checked, and
missing keys take their defaults. ``describe()`` of a reranker records the parsed,
default-filled options (:meth:`RerankerOptions.to_dict`); ``GET /info`` lists every
option with its type, default and meaning (:func:`describe_options`).

This module imports neither torch nor transformers: the CLI validates ``--opt`` with
:func:`parse_options` before any model loads.

Example:
    >>> parse_options("blockrank", {"layer": 18}).layer
    18
    >>> parse_options("blockrank", {"lyaer": 18})  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    heedrank.errors.ValidationError: unknown blockrank option 'lyaer'; valid options: ...
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from heedrank.blocks import KV_DTYPES
from heedrank.errors import ValidationError
from heedrank.reranker.reattn import ReAttnConfig
from heedrank.textrules import is_int, is_number

NO_RERANK = "none"
"""The method name that means "no reranking" (first-stage order); it takes no options."""

Coerce = Callable[[str, Any], Any]


def _option(default: Any, type_: str, doc: str, coerce: Coerce) -> Any:
    """A dataclass field carrying its user-facing type, doc and coercer in its metadata."""
    return field(default=default, metadata={"type": type_, "doc": doc, "coerce": coerce})


def _fail(name: str, expected: str, value: Any) -> ValidationError:
    return ValidationError(f"option {name} must be {expected}, got {value!r}")


def _bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    raise _fail(name, "true or false", value)


def _int(minimum: int | None = None, maximum: int | None = None, *, optional: bool = False) -> Coerce:
    def coerce(name: str, value: Any) -> int | None:
        if value is None and optional:
            return None
        if not is_int(value):
            raise _fail(name, "an integer" + (" or null" if optional else ""), value)
        if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
            bounds = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
            raise _fail(name, f"an integer {bounds}", value)
        return value

    return coerce


def _float(minimum: float | None = None, *, optional: bool = False) -> Coerce:
    def coerce(name: str, value: Any) -> float | None:
        if value is None and optional:
            return None
        if not is_number(value) or value != value:
            raise _fail(name, "a number" + (" or null" if optional else ""), value)
        if minimum is not None and value < minimum:
            raise _fail(name, f"a number >= {minimum}", value)
        return float(value)

    return coerce


def _choice(*choices: str) -> Coerce:
    def coerce(name: str, value: Any) -> str:
        if value not in choices:
            raise _fail(name, " or ".join(repr(c) for c in choices), value)
        return value

    return coerce


def _heads(allow_learned: bool) -> Coerce:
    named = ("all", "qr", "learned") if allow_learned else ("all", "qr")

    def coerce(name: str, value: Any) -> str | tuple[tuple[int, int], ...]:
        if isinstance(value, str):
            if value == "learned" and not allow_learned:
                raise ValidationError("heads='learned' is available for ICR only; use 'qr', a path or a list with blockrank")
            if not value.strip():
                raise _fail(name, f"one of {list(named)}, a head-set path or [[layer, head], ...]", value)
            return value  # a named set or a head-set JSON path (resolved once the model is known)
        if isinstance(value, (list, tuple)) and value:
            pairs = []
            for pair in value:
                if (not isinstance(pair, (list, tuple)) or len(pair) != 2
                        or any(not is_int(x) or x < 0 for x in pair)):
                    raise _fail(name, "[[layer, head], ...] with non-negative integers", value)
                pairs.append((int(pair[0]), int(pair[1])))
            return tuple(sorted(set(pairs)))
        raise _fail(name, f"one of {list(named)}, a head-set path or a non-empty [[layer, head], ...]", value)

    return coerce


def _reattn(name: str, value: Any) -> ReAttnConfig | None:
    return ReAttnConfig.parse(value)


def _jsonable(value: Any) -> Any:
    if isinstance(value, ReAttnConfig):
        return {"idf": value.idf, "entropy": value.entropy, "gamma": value.gamma}
    if isinstance(value, tuple):
        return [_jsonable(v) for v in value]
    return value


@dataclass(frozen=True)
class RerankerOptions:
    """Base of the per-method option classes (see :class:`ICROptions`, :class:`BlockRankOptions`)."""

    method: ClassVar[str] = ""

    @classmethod
    def names(cls) -> list[str]:
        """Option names in declaration order."""
        return [f.name for f in fields(cls)]

    @classmethod
    def parse(cls, value: Mapping[str, Any] | RerankerOptions | None = None) -> RerankerOptions:
        """Options from a mapping; missing keys take their defaults.

        Args:
            value: ``{name: value}`` (JSON-like values: ``--opt`` values parsed as JSON, a
                request body), an instance of this class (returned as is) or ``None``.

        Raises:
            ValidationError: an unknown key (the message names the valid ones), a value of
                the wrong type or out of range, or a combination this method refuses.
        """
        if value is None:
            value = {}
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            raise ValidationError(f"{cls.method} options must be a mapping of option names to values, got {value!r}")
        names = cls.names()
        unknown = [k for k in value if k not in names]
        if unknown:
            key = unknown[0]
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValidationError(
                f"unknown {cls.method} option {key!r}{hint}; valid options: {', '.join(names)}"
            )
        kwargs = {}
        for f in fields(cls):
            if f.name in value:
                kwargs[f.name] = f.metadata["coerce"](f.name, value[f.name])
        options = cls(**kwargs)
        options.check()
        return options

    def check(self) -> None:
        """Cross-field checks (subclasses). Raises ValidationError."""

    def to_dict(self) -> dict[str, Any]:
        """Every option with its value (defaults filled in), JSON-ready, for reports."""
        return {f.name: _jsonable(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def describe(cls) -> list[dict[str, Any]]:
        """``[{name, type, default, doc}]`` of every option, in declaration order (``GET /info``)."""
        return [
            {"name": f.name, "type": f.metadata["type"], "default": _jsonable(f.default), "doc": f.metadata["doc"]}
            for f in fields(cls)
        ]


_HEADS_DOC = (
    "attention heads scored: 'all', 'qr' (the model's packaged query-focused head set), {learned}"
    "a head-set JSON path, or [[layer, head], ...]; the forward pass stops after the deepest selected layer "
    "(docs/design/algorithms.md section 2)"
)
_REATTN_DOC = (
    "ReAttn re-weighting of the token attention (docs/design/algorithms.md section 4): false, true, or "
    "{idf, entropy, gamma}"
)
DEFAULT_MAX_QUERY_TOKENS = 64
"""Most LM tokens of a query when option ``max_query_tokens`` is null: above the longest query
of the evaluation sets with the SmolLM2 tokenizer (NFCorpus 34, TREC DL 2019/2021/2022 13/33/15
tokens; SciFact 45 but for one 66-token claim), so they are never cut, while a pasted page
cannot make one request take minutes: the query block's cost is linear in its length on every
candidate (a 4,000-character query, 703 tokens, cut to 64 answers in 1.5x a 10-token query's
time; cut to 128, 3x: bench/long_query.py)."""

_QUERY_TOKENS_DOC = (
    "most LM tokens of the query; a longer query is cut (with a warning) to this budget; "
    f"null = {DEFAULT_MAX_QUERY_TOKENS}, or a quarter of the model's context when that is less{{extra}}"
)


def _n_signal() -> Any:
    return _option(2, "int >= 1", "signal tokens at the end of the answer prefix 'Final Answer: ['", _int(1))


def _chat_template() -> Any:
    return _option(True, "bool", "wrap the prompt in the model's chat template", _bool)


def _doc_batch_size() -> Any:
    return _option(64, "int >= 1", "candidate blocks per batched prefill (bounds memory)", _int(1))


def _block_heads(note: str = "") -> Any:
    return _option("all", "'all' | 'qr' | path | [[layer, head], ...]",
                   _HEADS_DOC.format(learned="") + "; with scoring='signal' each head is read at its own layer" + note,
                   _heads(False))


def _reattn_option() -> Any:
    return _option(None, "bool | {idf, entropy, gamma}", _REATTN_DOC, _reattn)


def _block_mask_std() -> Any:
    return _option(2.0, "float >= 0 | null", "token mask of scoring='calibrated' (as ICR's); null = no mask",
                   _float(0.0, optional=True))


@dataclass(frozen=True)
class ICROptions(RerankerOptions):
    """Options of the ICR reranker (docs/design/algorithms.md section 1). Every field is a
    ``RerankerConfig.options`` key; see :meth:`describe` for types and meaning."""

    method: ClassVar[str] = "icr"

    calibration: bool = _option(True, "bool", "subtract the attention of the content-free query 'N/A'", _bool)
    mask_std: float | None = _option(
        2.0, "float >= 0 | null",
        "per-document token mask: drop tokens whose calibrated score is <= mean - mask_std * std; null = no mask",
        _float(0.0, optional=True),
    )
    instruction: str = _option(
        "ie", "'ie' | 'qa'", "late instruction: 'ie' (find relevant information) or 'qa' (answer the question)",
        _choice("ie", "qa"),
    )
    reverse: bool = _option(True, "bool", "place the best first-stage candidate nearest the query", _bool)
    chat_template: bool = _option(True, "bool", "wrap the prompt in the model's chat template", _bool)
    keep_attention: bool = _option(
        False, "bool",
        "return the per-head calibrated token attention in details['attention'] (attention dumps); "
        "needs every candidate in one prompt (no windows)",
        _bool,
    )
    heads: str | tuple[tuple[int, int], ...] = _option(
        "all", "'all' | 'qr' | 'learned' | path | [[layer, head], ...]",
        _HEADS_DOC.format(learned="'learned' (the packaged set's learned per-head weights), "), _heads(True),
    )
    reattn: ReAttnConfig | None = _reattn_option()
    windows: bool = _option(
        True, "bool",
        "when the candidates do not fit one prompt, score them in windows that fit, each carrying the "
        "anchor candidate(s), scores shifted so that the anchors agree; false = refuse with context_overflow",
        _bool,
    )
    window_tokens: int | None = _option(
        None, "int >= 64 | null", "most positions of one prompt (window); null = the model's context",
        _int(64, optional=True),
    )
    anchors: int = _option(
        1, "int >= 1", "first-stage top candidates carried by every window to align the windows' scores", _int(1),
    )
    max_query_tokens: int | None = _option(
        None, "int >= 1 | null", _QUERY_TOKENS_DOC.format(extra=" (of window_tokens when set)"), _int(1, optional=True),
    )


@dataclass(frozen=True)
class BlockRankOptions(RerankerOptions):
    """Options of the BlockRank reranker (docs/design/algorithms.md section 3). Every field is a
    ``RerankerConfig.options`` key; see :meth:`describe` for types and meaning."""

    method: ClassVar[str] = "blockrank"

    layer: int | None = _option(
        None, "int >= 0 | null", "scoring layer l* (0-based, below the model's depth); null = round(0.6 * layers)",
        _int(0, optional=True),
    )
    scoring: str = _option(
        "signal", "'signal' | 'calibrated'",
        "'signal': signal tokens' document-restricted attention at l* (probabilities summing to 1); "
        "'calibrated': ICR's calibrated query attention over layers 0..l* through the block structure "
        "(the 'learned' and 'independent' scorers and the default's are method 'blockrank-cached')",
        _choice("signal", "calibrated"),
    )
    query_offset: int | None = _option(
        None, "int >= 0 | null",
        "first position of the query block; null = block 0 length + longest candidate block",
        _int(0, optional=True),
    )
    n_signal: int = _n_signal()
    chat_template: bool = _chat_template()
    doc_batch_size: int = _doc_batch_size()
    mask_std: float | None = _block_mask_std()
    heads: str | tuple[tuple[int, int], ...] = _block_heads()
    reattn: ReAttnConfig | None = _reattn_option()
    doc_labels: str = _option(
        "sorted", "'sorted' | 'position'",
        "numbers i of the blocks 'ID: i': 'sorted' = rank of the doc id among the candidates, so that the prompt "
        "and the scores do not depend on the order the candidates come in; 'position' = first-stage order",
        _choice("sorted", "position"),
    )
    max_query_tokens: int | None = _option(
        None, "int >= 1 | null",
        _QUERY_TOKENS_DOC.format(extra=", and less when the query, which sits in two blocks, would push the "
                                 "query block past the context"),
        _int(1, optional=True),
    )

    def check(self) -> None:
        _check_heads(self)


def _check_heads(options: Any) -> None:
    """Raises ValidationError: ``heads`` without ``scoring='signal'`` (BlockRank and cached BlockRank)."""
    if options.heads != "all" and options.scoring != "signal":
        raise ValidationError("heads select signal-token heads; they need scoring='signal'")


AUTO = "auto"
"""Option value of ``blockrank-cached``'s ``scoring`` and ``query_adapter``: what ships for the model."""


def _path_or(*named: str) -> Coerce:
    def coerce(name: str, value: Any) -> str | None:
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            raise _fail(name, " or ".join([*(repr(n) for n in named), "a path", "null"]), value)
        return value

    return coerce


@dataclass(frozen=True)
class CachedBlockRankOptions(RerankerOptions):
    """Options of cached BlockRank (registry name ``"blockrank-cached"``; docs/design/algorithms.md
    section 3.1, this project's extension): block 0 is the fixed instruction only and
    a candidate block carries no id, so each block's keys and values depend on the document
    alone and come from the index's document KV store. Defaults are the best measured
    configuration (docs/results/default.md): with the packaged files of the default LM,
    ``scoring='independent'`` (each pair's list-independent log-odds) at ``l* = 15`` over
    128-token blocks and the packaged query adapter, served by the card's learned scorer with the
    embedder's cosine and the first-stage rank (docs/design/algorithms.md, "The learned
    scorer"); no fusion weight."""

    method: ClassVar[str] = "blockrank-cached"
    default_max_doc_tokens: ClassVar[int] = 128
    """Per-document LM token budget when ``max_doc_tokens`` is not given (the card's)."""

    layer: int | None = _option(
        None, "int >= 0 | null",
        "scoring layer l* and depth of the stored blocks (0-based); null = the weights card's layer with "
        "learned or independent scoring (15 for the packaged SmolLM2 card), else round(0.6 * layers)",
        _int(0, optional=True),
    )
    scoring: str = _option(
        AUTO, "'auto' | 'learned' | 'independent' | 'calibrated' | 'signal'",
        "'learned': learned weights over the calibrated attention of every (layer, head) of 0..l*, each "
        "z-scored over the query's candidates (weights card: scorer_weights); 'independent': log-odds of "
        "P(relevant) of each (query, document) pair, the same in any list (the card's 'independent' entry: the "
        "query and N/A blocks read against block 0 alone, their logits to each document's keys); 'calibrated': ICR's calibrated "
        "query attention over layers 0..l* with the mean - 2 std token mask; 'signal': the signal tokens' "
        "attention at l* (probabilities summing to 1); 'auto' = 'independent' served by the card's default scorer "
        "(heedrank.scorer: with the embedder's cosine and the first-stage rank) when the card holds one, else "
        "'learned', when scorer_weights is given or a weights card ships for the model at the layer and block "
        "length asked for, else 'calibrated'",
        _choice(AUTO, "learned", "independent", "calibrated", "signal"),
    )
    scorer_weights: str | None = _option(
        None, "path | null",
        "weights card (JSON) of scoring='learned' and 'independent' and of the default's scorer (its "
        "'scorer' entry), written by recipes/default (`heedrank lab fit --export`, `lab fit-scorer`); null = the "
        "card shipped for the model (reranker/data/<model>.blockrank-cached.json)",
        _path_or(),
    )
    query_adapter: str | None = _option(
        AUTO, "'auto' | 'packaged' | path | null",
        "query-side LoRA adapter (`heedrank lab train query-adapter`) applied to the query and N/A passes only, so "
        "stored blocks stay valid; 'packaged' = the adapter shipped for the model "
        "(reranker/data/<model>.query-adapter); 'auto' = the packaged one when it ships for the model and the "
        "reranker's l* and block length, else none; null = none",
        _path_or(AUTO, "packaged"),
    )
    n_signal: int = _n_signal()
    chat_template: bool = _chat_template()
    doc_batch_size: int = _doc_batch_size()
    mask_std: float | None = _block_mask_std()
    heads: str | tuple[tuple[int, int], ...] = _block_heads(" (at or below l*: the store holds layers 0..l*)")
    reattn: ReAttnConfig | None = _reattn_option()
    kv_dtype: str = _option(
        "int8", "'int8' | 'float16'",
        "storage of the document KV store's blocks, and what a block computed now is rounded to before it is "
        "read: int8 (per-channel keys, per-token values: 0.85 MB per 128-token block, ties float16 on NFCorpus "
        "test, docs/results/store.md) or float16 (exact for fp16 models, 1.62 MB)",
        _choice(*KV_DTYPES),
    )
    max_query_tokens: int | None = _option(
        None, "int >= 1 | null", _QUERY_TOKENS_DOC.format(extra=", and less when the query block would run past "
                                                          "the context"),
        _int(1, optional=True),
    )

    def check(self) -> None:
        _check_heads(self)


OPTION_CLASSES: dict[str, type[RerankerOptions]] = {
    "icr": ICROptions, "blockrank": BlockRankOptions, "blockrank-cached": CachedBlockRankOptions,
}
"""The built-in methods' option classes by registry name."""

DEFAULT_METHOD = "blockrank-cached"
"""What ``"default"`` names: the best measured configuration (docs/results/default.md)."""
METHOD_ALIASES: dict[str, str] = {"default": DEFAULT_METHOD}
"""Method names that name another method (accepted wherever a method is named)."""

def default_max_doc_tokens(method: str) -> int:
    """Per-document LM token budget of ``method`` when none is given: the method's own
    (``blockrank-cached``: :attr:`CachedBlockRankOptions.default_max_doc_tokens`, its card's) or
    :data:`heedrank.config.DEFAULT_MAX_DOC_TOKENS`."""
    from heedrank.config import DEFAULT_MAX_DOC_TOKENS

    cls = OPTION_CLASSES.get(METHOD_ALIASES.get(method, method))
    return int(getattr(cls, "default_max_doc_tokens", DEFAULT_MAX_DOC_TOKENS))


def options_class(method: str) -> type[RerankerOptions] | None:
    """The options class of ``method``, or ``None`` for a method without one (a plugin)."""
    return OPTION_CLASSES.get(method)


def parse_options(method: str, mapping: Mapping[str, Any] | None) -> RerankerOptions | dict[str, Any]:
    """Validate ``RerankerConfig.options`` for ``method`` without loading any model.

    Args:
        method: Reranker registry name (``"icr"``, ``"blockrank"``, ``"blockrank-cached"``), an alias
            (``"default"``), or ``"none"``.
        mapping: ``{option: value}``.

    Returns:
        The parsed, default-filled options of a built-in method; for a method without an
        options class (a registered plugin) the mapping as given, left to the plugin.

    Raises:
        ValidationError: unknown option (the message lists the valid ones), bad value, or
            options for ``"none"``.
    """
    method = METHOD_ALIASES.get(method, method)
    cls = OPTION_CLASSES.get(method)
    if cls is not None:
        return cls.parse(mapping)
    if method == NO_RERANK and mapping:
        raise ValidationError(
            f"reranker options {sorted(mapping)} need a reranking method; pick one with --rerank/rerank.method"
        )
    return dict(mapping or {})


def describe_options(methods: list[str] | None = None) -> dict[str, list[dict[str, Any]]]:
    """``{method: [{name, type, default, doc}, ...]}`` for the built-in methods (or ``methods``)."""
    return {m: OPTION_CLASSES[m].describe() for m in (methods or sorted(OPTION_CLASSES)) if m in OPTION_CLASSES}

"""Metadata filters: a JSON language in the style of Qdrant, parsed into frozen dataclasses
and compiled to SQL over the document store's ``metadata`` JSON column.

Language (every list may also be given as a single object)::

    filter     := {"must": [cond, ...], "should": [cond, ...], "must_not": [cond, ...],
                   "min_should": {"conditions": [cond, ...], "min_count": M}}
    cond       := {"key": K, "match": {"value": V}}             K's value equals V
                | {"key": K, "match": {"any": [V, ...]}}        K's value is one of the Vs
                | {"key": K, "range": {"gt"|"gte"|"lt"|"lte": N, ...}}
                | {"is_empty": {"key": K}}                       K missing, null or []
                | {"is_null": {"key": K}}                        K present with value null
                | {"key": K, "is_empty": true}                   the same (Qdrant's FieldCondition form;
                | {"key": K, "is_null": true}                      false negates it)
                | {"has_id": [doc_id, ...]}                      the document's id is listed
                | filter                                         nested boolean filter

* ``must``: every condition holds; ``should``: at least one holds (when the list is not
  empty); ``must_not``: none holds; ``min_should``: at least ``M`` (an integer >= 0) of its
  conditions hold. ``{}`` (or ``None``) is no filter.
* A key whose value is ``null`` is absent, in a filter and in a condition (``{"must": null}``,
  ``{"key": K, "match": {...}, "range": null}``): filters built with ``qdrant-client``'s models
  and dumped without ``exclude_none`` parse as they mean. A nested filter all of whose keys
  are ``null`` matches everything, as in Qdrant.
* ``K`` is a field name; dots address nested objects (``"journal.year"``). A field
  holding an array matches when any of its elements matches (as in Qdrant).
* ``V`` is a string, an integer or a boolean (no floats: use ``range``); values of
  different types never equal each other (``true`` is not ``1``, ``"1"`` is not ``1``).
  Integers must lie in the signed 64-bit range ``[-2**63, 2**63 - 1]`` (as in Qdrant); a
  larger one is refused naming its clause (store such numbers as strings to match them).
  ``N`` is a finite number of any size (integers and floats compare numerically and exactly:
  an integer bound outside 64 bits is compiled to the float bound that selects the same
  values). A ``range`` never matches a non-numeric value. Stored integers outside 64 bits
  are read by SQLite as the nearest float.
* A key that no document has is not an error: its conditions match nothing (and their
  ``must_not`` matches everything).

Invalid filters raise :class:`FilterError` (a :class:`~heedrank.errors.ValidationError`,
HTTP 422) whose message starts with the path of the offending clause, e.g.
``filter.must[1].range: unknown operator 'between'; use gt, gte, lt, lte``.

:func:`compile_sql` turns a parsed filter into a SQL boolean expression over
``docs.metadata`` and ``docs.doc_id`` with SQLite's JSON functions (values are bound
parameters, never spliced into the SQL); :func:`matches` is the same semantics in pure
Python (the in-memory store and the tests' oracle).

Example:
    >>> f = parse_filter({"must": [{"key": "year", "range": {"gte": 2015}}],
    ...                   "must_not": [{"key": "tags", "match": {"any": ["retracted"]}}]})
    >>> matches(f, "d1", {"year": 2019, "tags": ["diet", "bone"]})
    True
    >>> matches(f, "d2", {"year": 2019, "tags": ["retracted"]})
    False
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Union

from heedrank.errors import ValidationError
from heedrank.textrules import is_int, is_number

Scalar = Union[str, int, bool]

MAX_CONDITIONS = 512
"""Most conditions (leaves and nested filters) one filter may hold."""
MAX_DEPTH = 16
"""Deepest nesting of boolean filters."""
MAX_VALUES = 10_000
"""Most values in one ``match.any`` or ``has_id`` list."""

_BOOL_KEYS = ("must", "should", "must_not")
_FILTER_KEYS = (*_BOOL_KEYS, "min_should")
_RANGE_OPS = ("gt", "gte", "lt", "lte")
_MATCH_OPS = ("value", "any")
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
"""The integers ``match`` compares (SQLite's INTEGER)."""


class FilterError(ValidationError):
    """An invalid filter (HTTP 422). ``path`` names the offending clause (``filter.must[0].range``)."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path


# --------------------------------------------------------------------------- the tree
@dataclass(frozen=True)
class Match:
    """``key``'s value (or an element of it) equals one of ``values``.

    ``any`` records whether the clause was written ``match.any`` (for round-trips).
    """

    key: str
    values: tuple[Scalar, ...]
    any: bool = False


@dataclass(frozen=True)
class Range:
    """``key``'s numeric value (or an element of it) lies within the given bounds."""

    key: str
    gt: float | None = None
    gte: float | None = None
    lt: float | None = None
    lte: float | None = None


@dataclass(frozen=True)
class IsEmpty:
    """``key`` is missing, ``null`` or an empty array."""

    key: str


@dataclass(frozen=True)
class IsNull:
    """``key`` is present with the value ``null``."""

    key: str


@dataclass(frozen=True)
class HasId:
    """The document's id is one of ``ids``."""

    ids: tuple[str, ...]


@dataclass(frozen=True)
class MinShould:
    """At least ``min_count`` of ``conditions`` hold (Qdrant's ``min_should``)."""

    conditions: tuple[Condition, ...]
    min_count: int


@dataclass(frozen=True)
class BoolFilter:
    """``must`` (all), ``should`` (at least one, when not empty), ``must_not`` (none),
    ``min_should`` (at least its ``min_count`` conditions)."""

    must: tuple[Condition, ...] = ()
    should: tuple[Condition, ...] = ()
    must_not: tuple[Condition, ...] = ()
    min_should: MinShould | None = None

    def is_empty(self) -> bool:
        return not (self.must or self.should or self.must_not or self.min_should is not None)


Condition = Union[Match, Range, IsEmpty, IsNull, HasId, BoolFilter]


# --------------------------------------------------------------------------- parsing
def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}.get(
        type(value), type(value).__name__
    )


def _check_key(value: Any, path: str) -> str:
    if not isinstance(value, str) or not value:
        raise FilterError(path, f"key must be a non-empty string, got {_type_name(value)} {value!r}")
    parts = value.split(".")
    if any(not p for p in parts):
        raise FilterError(path, f"key {value!r} has an empty part; use dots only between field names")
    if any('"' in p or "\\" in p for p in parts):
        raise FilterError(path, f"key {value!r} may not contain '\"' or '\\'")
    return value


def _present(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of a filter or condition object whose value is not ``null`` (absent)."""
    return {k: v for k, v in obj.items() if v is not None}


def _check_scalar(value: Any, path: str) -> Scalar:
    if isinstance(value, int) and not isinstance(value, bool) and not INT64_MIN <= value <= INT64_MAX:
        raise FilterError(path, f"the integer {value} is outside the signed 64-bit range [-2**63, 2**63 - 1] that "
                                "match compares; store such numbers as strings and match the string, or use range")
    if isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        raise FilterError(path, f"match values must be strings, integers or booleans, got the number {value!r}; "
                                "use range for non-integer numbers")
    raise FilterError(path, f"match values must be strings, integers or booleans, got {_type_name(value)} {value!r}")


def _check_number(value: Any, path: str) -> float:
    if not is_number(value):
        raise FilterError(path, f"range bounds must be numbers, got {_type_name(value)} {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise FilterError(path, f"range bounds must be finite, got {value!r}")
    return value


class _Parser:
    def __init__(self) -> None:
        self.count = 0

    def _bump(self, path: str) -> None:
        self.count += 1
        if self.count > MAX_CONDITIONS:
            raise FilterError(path, f"too many conditions (more than {MAX_CONDITIONS})")

    def boolean(self, obj: Mapping[str, Any], path: str, depth: int) -> BoolFilter:
        if depth > MAX_DEPTH:
            raise FilterError(path, f"filters nest deeper than {MAX_DEPTH} levels")
        obj = _present(obj)
        unknown = sorted(set(obj) - set(_FILTER_KEYS))
        if unknown:
            raise FilterError(path, f"unknown key {unknown[0]!r}; a filter has only must, should, must_not, min_should")
        parts: dict[str, tuple[Condition, ...]] = {}
        for name in _BOOL_KEYS:
            raw = obj.get(name)
            if raw is None:
                parts[name] = ()
                continue
            parts[name] = self.conditions(raw, f"{path}.{name}", depth)
        min_should = self.min_should(obj["min_should"], f"{path}.min_should", depth) if "min_should" in obj else None
        return BoolFilter(**parts, min_should=min_should)

    def conditions(self, raw: Any, path: str, depth: int) -> tuple[Condition, ...]:
        items = [raw] if isinstance(raw, Mapping) else raw
        if not isinstance(items, list):
            raise FilterError(path, f"expected a list of conditions, got {_type_name(raw)}")
        return tuple(self.condition(c, f"{path}[{i}]", depth) for i, c in enumerate(items))

    def min_should(self, obj: Any, path: str, depth: int) -> MinShould:
        if not isinstance(obj, Mapping):
            raise FilterError(path, f'expected {{"conditions": [...], "min_count": N}}, got {_type_name(obj)}')
        obj = _present(obj)
        unknown = sorted(set(obj) - {"conditions", "min_count"})
        if unknown:
            raise FilterError(path, f"unknown key {unknown[0]!r}; min_should has conditions and min_count")
        if "conditions" not in obj or "min_count" not in obj:
            raise FilterError(path, 'expected {"conditions": [...], "min_count": N}')
        count = obj["min_count"]
        if not is_int(count) or count < 0:
            raise FilterError(f"{path}.min_count", f"expected an integer >= 0, got {_type_name(count)} {count!r}")
        return MinShould(self.conditions(obj["conditions"], f"{path}.conditions", depth), count)

    def condition(self, obj: Any, path: str, depth: int) -> Condition:
        self._bump(path)
        if not isinstance(obj, Mapping):
            raise FilterError(path, f"a condition must be an object, got {_type_name(obj)}")
        given = set(obj)
        obj = _present(obj)
        keys = set(obj)
        if (keys and keys <= set(_FILTER_KEYS)) or (given and not keys and given <= set(_FILTER_KEYS)):
            return self.boolean(obj, path, depth + 1)  # a nested filter (one of only nulls matches everything)
        if "has_id" in keys:
            self._only(obj, {"has_id"}, path)
            ids = obj["has_id"]
            if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
                raise FilterError(f"{path}.has_id", "expected a list of document ids (strings)")
            if len(ids) > MAX_VALUES:
                raise FilterError(f"{path}.has_id", f"at most {MAX_VALUES} ids, got {len(ids)}")
            return HasId(tuple(dict.fromkeys(ids)))
        for name, cls in (("is_empty", IsEmpty), ("is_null", IsNull)):
            if name in keys and "key" not in keys:  # with "key": Qdrant's FieldCondition flag (below)
                self._only(obj, {name}, path)
                inner = obj[name]
                if not isinstance(inner, Mapping) or set(inner) != {"key"}:
                    raise FilterError(f"{path}.{name}", 'expected {"key": FIELD}')
                return cls(_check_key(inner["key"], f"{path}.{name}.key"))
        if "key" in keys:
            ops = keys - {"key"}
            if not ops:
                raise FilterError(path, "a field condition needs 'match' or 'range' next to 'key'")
            unknown = sorted(ops - {"match", "range", "is_empty", "is_null"})
            if unknown:
                raise FilterError(path, f"unknown condition {unknown[0]!r}; use match or range")
            if len(ops) > 1:
                raise FilterError(path, "give one of 'match' or 'range' per condition (combine them with must)")
            key = _check_key(obj["key"], f"{path}.key")
            if "match" in ops:
                return self.match(key, obj["match"], f"{path}.match")
            if "range" in ops:
                return self.range(key, obj["range"], f"{path}.range")
            return self.field_flag(key, obj, path)
        if not keys:
            raise FilterError(path, "empty condition")
        raise FilterError(
            path,
            f"unknown condition {sorted(keys)[0]!r}; a condition is {{key, match}}, {{key, range}}, "
            "{is_empty: {key}}, {is_null: {key}}, {has_id: [...]} or a nested {must, should, must_not} filter",
        )

    @staticmethod
    def field_flag(key: str, obj: Mapping[str, Any], path: str) -> Condition:
        """Qdrant's ``{"key": K, "is_empty": true}`` / ``{"key": K, "is_null": true}``
        (``false``: the negation)."""
        name = "is_empty" if "is_empty" in obj else "is_null"
        flag = obj[name]
        if not isinstance(flag, bool):
            raise FilterError(f"{path}.{name}", f"expected true or false, got {_type_name(flag)} {flag!r}")
        leaf: Condition = IsEmpty(key) if name == "is_empty" else IsNull(key)
        return leaf if flag else BoolFilter(must_not=(leaf,))

    @staticmethod
    def _only(obj: Mapping[str, Any], allowed: set[str], path: str) -> None:
        extra = sorted(set(obj) - allowed)
        if extra:
            raise FilterError(path, f"unexpected key {extra[0]!r} next to {sorted(allowed)[0]!r}")

    @staticmethod
    def match(key: str, obj: Any, path: str) -> Match:
        if not isinstance(obj, Mapping):
            raise FilterError(path, f'expected {{"value": V}} or {{"any": [V, ...]}}, got {_type_name(obj)}')
        unknown = sorted(set(obj) - set(_MATCH_OPS))
        if unknown:
            raise FilterError(path, f"unknown operator {unknown[0]!r}; use value or any")
        if len(obj) != 1:
            raise FilterError(path, "give exactly one of value or any")
        if "value" in obj:
            return Match(key, (_check_scalar(obj["value"], f"{path}.value"),))
        values = obj["any"]
        if not isinstance(values, list):
            raise FilterError(f"{path}.any", f"expected a list of values, got {_type_name(values)}")
        if len(values) > MAX_VALUES:
            raise FilterError(f"{path}.any", f"at most {MAX_VALUES} values, got {len(values)}")
        checked = [_check_scalar(v, f"{path}.any[{i}]") for i, v in enumerate(values)]
        unique: dict[tuple[str, Scalar], Scalar] = {}
        for v in checked:
            unique.setdefault((type(v).__name__, v), v)
        return Match(key, tuple(unique.values()), any=True)

    @staticmethod
    def range(key: str, obj: Any, path: str) -> Range:
        if not isinstance(obj, Mapping):
            raise FilterError(path, f"expected an object of gt/gte/lt/lte bounds, got {_type_name(obj)}")
        unknown = sorted(set(obj) - set(_RANGE_OPS))
        if unknown:
            raise FilterError(path, f"unknown operator {unknown[0]!r}; use gt, gte, lt, lte")
        bounds = {op: _check_number(v, f"{path}.{op}") for op, v in obj.items() if v is not None}
        if not bounds:
            raise FilterError(path, "give at least one of gt, gte, lt, lte")
        return Range(key, **bounds)


def parse_filter(obj: Any, *, path: str = "filter") -> BoolFilter | None:
    """Validate a JSON filter and parse it.

    Args:
        obj: The filter as decoded JSON (a mapping), an already parsed
            :class:`BoolFilter`, or ``None``.
        path: Name of the filter in error messages.

    Returns:
        The parsed filter, or ``None`` for ``None`` / ``{}`` / a filter with no conditions.

    Raises:
        FilterError: unknown keys or operators, malformed clauses, values of the wrong
            type, too many conditions; the message starts with the offending clause's path.
    """
    if obj is None:
        return None
    if isinstance(obj, BoolFilter):
        return None if obj.is_empty() else obj
    if not isinstance(obj, Mapping):
        raise FilterError(path, f"a filter must be an object with must/should/must_not, got {_type_name(obj)}")
    parsed = _Parser().boolean(obj, path, 0)
    return None if parsed.is_empty() else parsed


def as_filter(obj: Any, *, path: str = "filter") -> BoolFilter | None:
    """The parsed form of a filter, parsing only what is not parsed yet.

    A search parses its JSON filter once (:meth:`heedrank.pipeline.Pipeline.validate`) and
    hands the :class:`BoolFilter` down; every stage below (retrievers, the index, the
    document store) calls this, which returns a parsed filter as it is (``None`` when it is
    empty) and calls :func:`parse_filter` only for the JSON form.

    Raises:
        FilterError: an invalid JSON filter.
    """
    if obj is None:
        return None
    if isinstance(obj, BoolFilter):
        return None if obj.is_empty() else obj
    return parse_filter(obj, path=path)


# --------------------------------------------------------------------------- JSON form
def to_json(f: BoolFilter | Condition) -> dict[str, Any]:
    """The canonical JSON form (``parse_filter(to_json(f)) == f``); used as a cache key."""
    if isinstance(f, BoolFilter):
        out: dict[str, Any] = {name: [to_json(c) for c in getattr(f, name)] for name in _BOOL_KEYS if getattr(f, name)}
        if f.min_should is not None:
            out["min_should"] = {"conditions": [to_json(c) for c in f.min_should.conditions],
                                 "min_count": f.min_should.min_count}
        return out
    if isinstance(f, Match):
        return {"key": f.key, "match": {"any": list(f.values)} if f.any else {"value": f.values[0]}}
    if isinstance(f, Range):
        return {"key": f.key, "range": {op: getattr(f, op) for op in _RANGE_OPS if getattr(f, op) is not None}}
    if isinstance(f, IsEmpty):
        return {"is_empty": {"key": f.key}}
    if isinstance(f, IsNull):
        return {"is_null": {"key": f.key}}
    if isinstance(f, HasId):
        return {"has_id": list(f.ids)}
    raise TypeError(f"not a filter node: {f!r}")  # pragma: no cover


def cache_key(f: BoolFilter) -> str:
    """A string identifying the filter's meaning (canonical JSON)."""
    return json.dumps(to_json(f), sort_keys=True, separators=(",", ":"))


# --------------------------------------------------------------------------- SQL
def json_path(key: str) -> str:
    """SQLite JSON path of a dotted key: ``"a.b"`` -> ``$."a"."b"``."""
    return "$" + "".join(f'."{part}"' for part in key.split("."))


class _SQL:
    def __init__(self, metadata: str, doc_id: str) -> None:
        self.m = metadata
        self.doc_id = doc_id
        self.params: dict[str, Any] = {}

    def bind(self, value: Any) -> str:
        name = f"f{len(self.params)}"
        self.params[name] = value
        return ":" + name

    def leaf(self, key: str, pred) -> str:
        """``pred(type_sql, value_sql)`` on the scalar at ``key``, or on any element of an array there."""
        p = self.bind(json_path(key))
        t = f"json_type({self.m}, {p})"
        scalar = pred(t, f"json_extract({self.m}, {p})")
        elem = pred("je.type", "je.value")
        return (
            f"(CASE {t} WHEN 'array' THEN EXISTS (SELECT 1 FROM json_each({self.m}, {p}) AS je "
            f"WHERE {elem}) ELSE COALESCE({scalar}, 0) END)"
        )

    def match(self, c: Match) -> str:
        strs = [v for v in c.values if isinstance(v, str)]
        nums = [v for v in c.values if isinstance(v, int) and not isinstance(v, bool)]
        bools = {v for v in c.values if isinstance(v, bool)}

        def pred(t: str, v: str) -> str:
            terms = []
            if strs:
                terms.append(f"({t} = 'text' AND {v} IN ({','.join(self.bind(s) for s in strs)}))")
            if nums:
                terms.append(f"({t} IN ('integer', 'real') AND {v} IN ({','.join(self.bind(n) for n in nums)}))")
            for b in sorted(bools):
                terms.append(f"({t} = '{'true' if b else 'false'}')")
            return "(" + " OR ".join(terms) + ")" if terms else "0"

        return self.leaf(c.key, pred)

    def range(self, c: Range) -> str:
        def pred(t: str, v: str) -> str:
            terms = [f"{t} IN ('integer', 'real')"]
            for op, sym in (("gt", ">"), ("gte", ">="), ("lt", "<"), ("lte", "<=")):
                bound = getattr(c, op)
                if bound is not None:
                    terms.append(f"{v} {sym} {self.bind(sql_bound(bound, op))}")
            return "(" + " AND ".join(terms) + ")"

        return self.leaf(c.key, pred)

    def node(self, c: Condition) -> str:
        if isinstance(c, BoolFilter):
            return self.boolean(c)
        if isinstance(c, Match):
            return self.match(c)
        if isinstance(c, Range):
            return self.range(c)
        if isinstance(c, IsEmpty):
            p = self.bind(json_path(c.key))
            return (
                f"(CASE COALESCE(json_type({self.m}, {p}), 'null') WHEN 'null' THEN 1 "
                f"WHEN 'array' THEN json_array_length({self.m}, {p}) = 0 ELSE 0 END)"
            )
        if isinstance(c, IsNull):
            return f"(COALESCE(json_type({self.m}, {self.bind(json_path(c.key))}) = 'null', 0))"
        if isinstance(c, HasId):
            if not c.ids:
                return "0"
            return f"({self.doc_id} IN ({','.join(self.bind(i) for i in c.ids)}))"
        raise TypeError(f"not a filter node: {c!r}")  # pragma: no cover

    def boolean(self, f: BoolFilter) -> str:
        terms = [self.node(c) for c in f.must]
        if f.should:
            terms.append("(" + " OR ".join(self.node(c) for c in f.should) + ")")
        terms.extend(f"NOT {self.node(c)}" for c in f.must_not)
        if f.min_should is not None:  # every node is 0 or 1, never NULL: count the ones that hold
            held = " + ".join(self.node(c) for c in f.min_should.conditions) or "0"
            terms.append(f"(({held}) >= {int(f.min_should.min_count)})")
        return "(" + " AND ".join(terms) + ")" if terms else "1"


def sql_bound(value: float, op: str) -> float:
    """The value to bind for the range bound ``value`` of operator ``op`` so that SQLite's
    comparison selects exactly the numbers Python's would: itself, unless it is an integer
    outside SQLite's 64-bit INTEGER (which cannot be bound); then the nearest float on the
    side that keeps the comparison exact (``gt``/``lte``: the largest float <= value,
    ``gte``/``lt``: the smallest float >= value; SQLite compares integers and floats exactly).
    """
    if isinstance(value, float) or INT64_MIN <= value <= INT64_MAX:
        return value
    up = op in ("gte", "lt")
    try:
        f = float(value)
    except OverflowError:  # beyond every finite float
        if value > 0:
            return math.inf if up else sys.float_info.max
        return -sys.float_info.max if up else -math.inf
    if up and f < value:
        f = math.nextafter(f, math.inf)
    elif not up and f > value:
        f = math.nextafter(f, -math.inf)
    return f


def compile_sql(
    f: BoolFilter | None, *, metadata: str = "metadata", doc_id: str = "doc_id"
) -> tuple[str, dict[str, Any]]:
    """A SQL boolean expression (0/1, never NULL) and its named parameters (``:f0``, ``:f1``...).

    Args:
        f: Parsed filter; ``None`` compiles to ``"1"`` (everything).
        metadata: SQL expression of the JSON metadata column.
        doc_id: SQL expression of the document id column.

    Example:
        >>> sql, params = compile_sql(parse_filter({"must": [{"key": "year", "range": {"gte": 2015}}]}))
        >>> params
        {'f0': '$."year"', 'f1': 2015, 'f2': 2015}
    """
    if f is None:
        return "1", {}
    builder = _SQL(metadata, doc_id)
    return builder.boolean(f), builder.params


# --------------------------------------------------------------------------- Python
_MISSING = object()


def _lookup(metadata: Mapping[str, Any], key: str) -> Any:
    value: Any = metadata
    for part in key.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return _MISSING
        value = value[part]
    return value


def _candidates(value: Any) -> list[Any]:
    if value is _MISSING or isinstance(value, Mapping):
        return []
    if isinstance(value, (list, tuple)):
        return [v for v in value if not isinstance(v, (list, tuple, Mapping))]
    return [value]


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _equal(stored: Any, wanted: Scalar) -> bool:
    if isinstance(wanted, bool):
        return isinstance(stored, bool) and stored is wanted
    if isinstance(wanted, int):
        return _is_number(stored) and stored == wanted
    return isinstance(stored, str) and stored == wanted


def _in_range(v: Any, c: Range) -> bool:
    if not _is_number(v) or (isinstance(v, float) and math.isnan(v)):
        return False
    return (
        (c.gt is None or v > c.gt)
        and (c.gte is None or v >= c.gte)
        and (c.lt is None or v < c.lt)
        and (c.lte is None or v <= c.lte)
    )


def _holds(c: Condition, doc_id: str, metadata: Mapping[str, Any]) -> bool:
    if isinstance(c, BoolFilter):
        return matches(c, doc_id, metadata)
    if isinstance(c, Match):
        return any(_equal(v, w) for v in _candidates(_lookup(metadata, c.key)) for w in c.values)
    if isinstance(c, Range):
        return any(_in_range(v, c) for v in _candidates(_lookup(metadata, c.key)))
    if isinstance(c, IsEmpty):
        value = _lookup(metadata, c.key)
        return value is _MISSING or value is None or (isinstance(value, (list, tuple)) and len(value) == 0)
    if isinstance(c, IsNull):
        return _lookup(metadata, c.key) is None
    if isinstance(c, HasId):
        return doc_id in c.ids
    raise TypeError(f"not a filter node: {c!r}")  # pragma: no cover


def matches(f: BoolFilter | None, doc_id: str, metadata: Mapping[str, Any]) -> bool:
    """Whether a document satisfies the filter (``None`` = no filter: always true)."""
    if f is None:
        return True
    return (
        all(_holds(c, doc_id, metadata) for c in f.must)
        and (not f.should or any(_holds(c, doc_id, metadata) for c in f.should))
        and not any(_holds(c, doc_id, metadata) for c in f.must_not)
        and (f.min_should is None
             or sum(_holds(c, doc_id, metadata) for c in f.min_should.conditions) >= f.min_should.min_count)
    )

"""Filters as clients send them: numbers past 64 bits answered exactly or refused
naming the clause (never an OverflowError from SQLite), nulls read as absent and Qdrant's
``min_should``, so that filters built with ``qdrant-client``'s models parse as they mean. The
SQL compilation is checked against the pure-Python oracle throughout."""

from __future__ import annotations

import itertools
import json
import sqlite3

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from heedrank.index.filters import (
    BoolFilter,
    FilterError,
    IsEmpty,
    IsNull,
    Match,
    MinShould,
    compile_sql,
    matches,
    parse_filter,
    sql_bound,
    to_json,
)

BIG = [2**63 - 1, 2**63, 2**63 + 1, 2**64, 10**20, 10**20 + 1, 2**53 + 1, 10**400]
BOUNDS = BIG + [-b for b in BIG] + [0, 1.5, 9.3e18, 1e20, -1e20]
# stored numbers SQLite holds exactly (INTEGER within 64 bits, or REAL)
STORED = [2**63 - 1, -(2**63), 2**53 + 1, 9.3e18, 9.223372036854775807e18, 1e20, -1e20, 1.5, 0, 10**20,
          1.7976931348623157e308, -1.7976931348623157e308]


def _table(docs: dict[str, dict]) -> sqlite3.Connection:
    c = sqlite3.connect(":memory:")
    c.execute("CREATE TABLE docs (doc_id TEXT PRIMARY KEY, metadata TEXT)")
    c.executemany("INSERT INTO docs VALUES (?, ?)", [(k, json.dumps(v)) for k, v in docs.items()])
    return c


NUMBERS = {f"n{i}": {"x": v} for i, v in enumerate(STORED)} | {"s": {"x": "text"}, "arr": {"x": [1, 2**63 - 1]}}


def _sql(conn, flt) -> list[str]:
    sql, params = compile_sql(parse_filter(flt))
    return sorted(r[0] for r in conn.execute(f"SELECT doc_id FROM docs WHERE {sql}", params))


def _py(flt, docs=NUMBERS) -> list[str]:
    f = parse_filter(flt)
    return sorted(k for k, v in docs.items() if matches(f, k, v))


@pytest.mark.parametrize(("op", "bound"), list(itertools.product(["gt", "gte", "lt", "lte"], BOUNDS)))
def test_range_bounds_of_any_size_are_answered_exactly(op, bound):
    conn = _table(NUMBERS)
    flt = {"must": [{"key": "x", "range": {op: bound}}]}
    assert _sql(conn, flt) == _py(flt)


def test_range_bound_rounding():
    assert sql_bound(2**63, "gte") == 2.0**63 and sql_bound(2**63 + 1, "gte") > 2**63 + 1
    assert sql_bound(2**63 + 1, "lte") == 2.0**63 and sql_bound(2**63 + 1, "gt") <= 2**63 + 1
    assert sql_bound(10**400, "gte") == float("inf") and sql_bound(-(10**400), "lte") == float("-inf")
    assert sql_bound(5, "gt") == 5 and sql_bound(2**63 - 1, "lt") == 2**63 - 1 and sql_bound(0.5, "gte") == 0.5


@pytest.mark.parametrize(
    ("flt", "path"),
    [
        ({"must": [{"key": "x", "match": {"value": 10**20}}]}, "filter.must[0].match.value"),
        ({"must": [{"key": "x", "match": {"value": 2**63}}]}, "filter.must[0].match.value"),
        ({"must": [{"key": "x", "match": {"value": -(2**63) - 1}}]}, "filter.must[0].match.value"),
        ({"should": [{"key": "x", "match": {"any": [1, 2**64]}}]}, "filter.should[0].match.any[1]"),
        ({"min_should": {"conditions": [{"key": "x", "match": {"value": 10**30}}], "min_count": 1}},
         "filter.min_should.conditions[0].match.value"),
    ],
)
def test_match_integers_past_64_bits_are_refused_naming_the_clause(flt, path):
    with pytest.raises(FilterError) as err:
        parse_filter(flt)
    assert err.value.path == path and err.value.status_code == 422
    assert "64-bit" in str(err.value) and "store such numbers as strings" in str(err.value)


def test_match_integers_at_the_64_bit_edges_are_exact():
    conn = _table(NUMBERS)
    for v in (2**63 - 1, -(2**63), 2**53 + 1):
        flt = {"must": [{"key": "x", "match": {"value": v}}]}
        assert _sql(conn, flt) == _py(flt) and _py(flt)


# -------------------------------------------------------------------- nulls, min_should
def test_nulls_are_absent():
    f = parse_filter({"must": [{"key": "a", "match": {"value": 1}, "range": None, "geo_radius": None}],
                      "should": None, "must_not": None, "min_should": None})
    assert f == BoolFilter(must=(Match("a", (1,)),))
    assert parse_filter({"must": None, "should": None, "must_not": None, "min_should": None}) is None
    everything = parse_filter({"must": [{"must": None, "should": None}]})  # a nested filter of only nulls
    assert everything is not None and matches(everything, "d", {}) and _sql(_table({"d": {}}), {"must": [{"must": None}]}) == ["d"]
    with pytest.raises(FilterError, match="got null"):  # a match value is not a key: null stays an error
        parse_filter({"must": [{"key": "a", "match": {"value": None}}]})


def test_field_condition_is_empty_and_is_null_flags():
    assert parse_filter({"must": [{"key": "t", "is_empty": True}]}) == BoolFilter(must=(IsEmpty("t"),))
    assert parse_filter({"must": [{"key": "t", "is_null": True, "match": None}]}) == BoolFilter(must=(IsNull("t"),))
    negated = parse_filter({"must": [{"key": "t", "is_empty": False}]})
    assert negated == BoolFilter(must=(BoolFilter(must_not=(IsEmpty("t"),)),))
    with pytest.raises(FilterError, match="expected true or false"):
        parse_filter({"must": [{"key": "t", "is_empty": "yes"}]})


MS_DOCS = {"a": {"x": 1, "y": 1, "z": 1}, "b": {"x": 1, "y": 1}, "c": {"x": 1}, "d": {}}


@pytest.mark.parametrize(("count", "expected"), [(0, ["a", "b", "c", "d"]), (1, ["a", "b", "c"]), (2, ["a", "b"]),
                                                 (3, ["a"]), (4, [])])
def test_min_should_counts_the_conditions_that_hold(count, expected):
    flt = {"min_should": {"conditions": [{"key": k, "match": {"value": 1}} for k in "xyz"], "min_count": count}}
    assert _py(flt, MS_DOCS) == expected
    assert _sql(_table(MS_DOCS), flt) == expected
    parsed = parse_filter(flt)
    assert isinstance(parsed.min_should, MinShould) and parse_filter(to_json(parsed)) == parsed


def test_min_should_combines_with_must_and_should():
    flt = {"must": [{"key": "x", "match": {"value": 1}}], "should": [{"has_id": ["c", "b"]}],
           "min_should": {"conditions": [{"key": "y", "match": {"value": 1}}, {"key": "z", "match": {"value": 1}}],
                          "min_count": 1}}
    assert _py(flt, MS_DOCS) == _sql(_table(MS_DOCS), flt) == ["b"]


@pytest.mark.parametrize(
    ("ms", "path", "needle"),
    [
        ({"conditions": []}, "filter.min_should", "min_count"),
        ({"conditions": [], "min_count": -1}, "filter.min_should.min_count", "integer >= 0"),
        ({"conditions": [], "min_count": True}, "filter.min_should.min_count", "integer >= 0"),
        ({"conditions": [], "min_count": "2"}, "filter.min_should.min_count", "integer >= 0"),
        ({"conditions": "x", "min_count": 1}, "filter.min_should.conditions", "expected a list"),
        ({"conditions": [], "min_count": 1, "max": 2}, "filter.min_should", "unknown key 'max'"),
        ([1], "filter.min_should", "expected"),
    ],
)
def test_min_should_errors_name_the_clause(ms, path, needle):
    with pytest.raises(FilterError) as err:
        parse_filter({"min_should": ms})
    assert err.value.path == path and needle in str(err.value)


# A filter as qdrant-client 1.20's models dump it without exclude_none:
#   Filter(must=[FieldCondition(key="year", range=Range(gte=2**63)),
#                FieldCondition(key="tags", match=MatchAny(any=["a", "b"]))],
#          should=[FieldCondition(key="n", match=MatchValue(value=3)), IsEmptyCondition(is_empty=PayloadField(key="x")),
#                  IsNullCondition(is_null=PayloadField(key="y"))],
#          min_should=MinShould(conditions=[FieldCondition(key="a", match=MatchValue(value="x")),
#                                           Filter(must=[FieldCondition(key="b", match=MatchValue(value=True))])],
#                               min_count=1),
#          must_not=Filter(should=[FieldCondition(key="z", range=Range(lt=1.5))])).model_dump(mode="json")
QDRANT_DUMP = json.loads("""
{"should": [{"key": "n", "match": {"value": 3}, "range": null, "geo_bounding_box": null, "geo_radius": null,
   "geo_polygon": null, "values_count": null, "is_empty": null, "is_null": null}, {"is_empty": {"key": "x"}},
  {"is_null": {"key": "y"}}],
 "min_should": {"conditions": [{"key": "a", "match": {"value": "x"}, "range": null, "geo_bounding_box": null,
   "geo_radius": null, "geo_polygon": null, "values_count": null, "is_empty": null, "is_null": null},
   {"should": null, "min_should": null, "must": [{"key": "b", "match": {"value": true}, "range": null,
    "geo_bounding_box": null, "geo_radius": null, "geo_polygon": null, "values_count": null, "is_empty": null,
    "is_null": null}], "must_not": null}], "min_count": 1},
 "must": [{"key": "year", "match": null, "range": {"lt": null, "gt": null, "gte": 9.223372036854776e+18, "lte": null},
   "geo_bounding_box": null, "geo_radius": null, "geo_polygon": null, "values_count": null, "is_empty": null,
   "is_null": null},
  {"key": "tags", "match": {"any": ["a", "b"]}, "range": null, "geo_bounding_box": null, "geo_radius": null,
   "geo_polygon": null, "values_count": null, "is_empty": null, "is_null": null}],
 "must_not": {"should": [{"key": "z", "match": null, "range": {"lt": 1.5, "gt": null, "gte": null, "lte": null},
   "geo_bounding_box": null, "geo_radius": null, "geo_polygon": null, "values_count": null, "is_empty": null,
   "is_null": null}], "min_should": null, "must": null, "must_not": null}}
""")
QDRANT_DOCS = {
    "hit": {"year": 2**63, "tags": ["a"], "n": 3, "a": "x", "z": 2},
    "hit2": {"year": 1e19, "tags": ["b"], "x": [], "b": True, "y": None},
    "young": {"year": 2020, "tags": ["a"], "n": 3, "a": "x"},
    "low_z": {"year": 2**63, "tags": ["a"], "n": 3, "a": "x", "z": 1},
    "no_min_should": {"year": 2**63, "tags": ["a"], "n": 3},
    "no_should": {"year": 2**63, "tags": ["a"], "a": "x", "x": 5},
}


def test_a_qdrant_client_dump_parses_as_it_means():
    assert _py(QDRANT_DUMP, QDRANT_DOCS) == ["hit", "hit2"]
    assert _sql(_table(QDRANT_DOCS), QDRANT_DUMP) == ["hit", "hit2"]


def test_the_real_qdrant_client_models_when_installed():
    models = pytest.importorskip("qdrant_client.models")
    f = models.Filter(
        must=[models.FieldCondition(key="year", range=models.Range(gte=2**63))],
        min_should=models.MinShould(conditions=[models.FieldCondition(key="a", match=models.MatchValue(value="x")),
                                                models.FieldCondition(key="b", match=models.MatchValue(value=True))],
                                    min_count=1),
    )
    for dumped in (f.model_dump(mode="json"), f.model_dump(mode="json", exclude_none=True)):
        assert _py(dumped, QDRANT_DOCS) == _sql(_table(QDRANT_DOCS), dumped) == ["hit", "hit2", "low_z", "no_should"]


# -------------------------------------------------------------------- random: SQL == Python
big_numbers = st.one_of(st.integers(-(2**70), 2**70), st.sampled_from(BIG + [-b for b in BIG]),
                        st.floats(allow_nan=False, allow_infinity=False))
small = st.sampled_from(["x", "y"])
leaf = st.one_of(
    st.builds(lambda k, op, v: {"key": k, "range": {op: v}}, small, st.sampled_from(["gt", "gte", "lt", "lte"]),
              big_numbers),
    st.builds(lambda k, v: {"key": k, "match": {"value": v}}, small, st.integers(-(2**63), 2**63 - 1)),
    st.builds(lambda k: {"key": k, "is_empty": True, "match": None}, small),
)
filters = st.fixed_dictionaries({}, optional={
    "must": st.lists(leaf, max_size=2), "should": st.one_of(st.none(), st.lists(leaf, max_size=2)),
    "min_should": st.builds(lambda c, n: {"conditions": c, "min_count": n}, st.lists(leaf, max_size=3),
                            st.integers(0, 3)),
})
stored = st.one_of(st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False, allow_infinity=False),
                   st.sampled_from(STORED), st.just("text"), st.lists(st.integers(-(2**63), 2**63 - 1), max_size=2))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(docs=st.lists(st.fixed_dictionaries({}, optional={"x": stored, "y": stored}), min_size=1, max_size=8),
       flt=filters)
def test_sql_matches_python_with_big_numbers_and_min_should(docs, flt):
    corpus = {f"d{i}": m for i, m in enumerate(docs)}
    assert _sql(_table(corpus), flt) == _py(flt, corpus)

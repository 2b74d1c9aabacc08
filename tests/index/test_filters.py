"""heedrank.index.filters: parsing and validation, SQL compilation against the pure-Python oracle."""

from __future__ import annotations

import json
import sqlite3

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from heedrank.errors import ValidationError
from heedrank.index.filters import (
    MAX_CONDITIONS,
    BoolFilter,
    FilterError,
    HasId,
    IsEmpty,
    Match,
    Range,
    cache_key,
    compile_sql,
    matches,
    parse_filter,
    to_json,
)

pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")  # the recursive filter strategy


DOCS = {
    "a": {"year": 2019, "tags": ["diet", "bone"], "flag": True, "journal": {"name": "BMJ", "year": 2019}},
    "b": {"year": 2010.5, "tags": "bone", "flag": False},
    "c": {"year": "2019", "count": 1},
    "d": {"tags": [], "count": True},
    "e": {"tags": None, "count": 1.0},
    "f": {"tags": {"k": "bone"}, "year": [2001, 2020]},
    "g": {},
}


@pytest.fixture(scope="module")
def conn() -> sqlite3.Connection:
    c = sqlite3.connect(":memory:")
    c.execute("CREATE TABLE docs (doc_id TEXT PRIMARY KEY, metadata TEXT)")
    c.executemany("INSERT INTO docs VALUES (?, ?)", [(k, json.dumps(v)) for k, v in DOCS.items()])
    return c


def _sql_ids(conn: sqlite3.Connection, flt) -> list[str]:
    sql, params = compile_sql(parse_filter(flt))
    return sorted(r[0] for r in conn.execute(f"SELECT doc_id FROM docs WHERE {sql}", params))


def _py_ids(flt, docs=DOCS) -> list[str]:
    f = parse_filter(flt)
    return sorted(k for k, v in docs.items() if matches(f, k, v))


@pytest.mark.parametrize(
    ("flt", "expected"),
    [
        ({"must": [{"key": "year", "range": {"gte": 2015}}]}, ["a", "f"]),  # f: any array element
        ({"must": [{"key": "year", "range": {"gt": 2010, "lt": 2011}}]}, ["b"]),
        ({"must": [{"key": "year", "match": {"value": 2019}}]}, ["a"]),  # "2019" (string) is not 2019
        ({"must": [{"key": "year", "match": {"value": "2019"}}]}, ["c"]),
        ({"must": [{"key": "tags", "match": {"value": "bone"}}]}, ["a", "b"]),  # not f: objects do not match
        ({"must": [{"key": "tags", "match": {"any": ["diet", "zzz"]}}]}, ["a"]),
        ({"must_not": [{"key": "tags", "match": {"any": ["bone"]}}]}, ["c", "d", "e", "f", "g"]),
        ({"must": [{"key": "flag", "match": {"value": True}}]}, ["a"]),
        ({"must": [{"key": "count", "match": {"value": 1}}]}, ["c", "e"]),  # true is not 1; 1.0 is
        ({"must": [{"key": "count", "match": {"value": True}}]}, ["d"]),
        ({"must": [{"key": "journal.name", "match": {"value": "BMJ"}}]}, ["a"]),
        ({"must": [{"is_empty": {"key": "tags"}}]}, ["c", "d", "e", "g"]),
        ({"must": [{"is_null": {"key": "tags"}}]}, ["e"]),
        ({"should": [{"has_id": ["b", "zz"]}, {"key": "flag", "match": {"value": True}}]}, ["a", "b"]),
        ({"must": {"key": "nowhere", "match": {"value": 1}}}, []),  # unknown key: matches nothing
        ({"must_not": [{"key": "nowhere", "range": {"gt": 0}}]}, sorted(DOCS)),
        ({"must": [{"should": [{"has_id": ["a"]}, {"has_id": ["c"]}]}, {"must_not": [{"has_id": ["c"]}]}]}, ["a"]),
        ({"must": [], "should": [], "must_not": []}, sorted(DOCS)),
        ({"should": [{"has_id": []}]}, []),
    ],
)
def test_semantics_sql_equals_python(conn, flt, expected) -> None:
    assert _py_ids(flt) == expected
    assert _sql_ids(conn, flt) == expected


def test_parse_tree_and_round_trip() -> None:
    f = parse_filter(
        {"must": [{"key": "a.b", "match": {"any": ["x", 1, True, "x"]}}, {"key": "y", "range": {"gte": 1, "lt": 2.5}}],
         "should": {"has_id": ["d1", "d1", "d2"]},
         "must_not": [{"is_empty": {"key": "t"}}]}
    )
    assert f == BoolFilter(
        must=(Match("a.b", ("x", 1, True), any=True), Range("y", gte=1, lt=2.5)),
        should=(HasId(("d1", "d2")),),
        must_not=(IsEmpty("t"),),
    )
    assert parse_filter(to_json(f)) == f
    assert cache_key(f) == cache_key(parse_filter(json.loads(json.dumps(to_json(f)))))
    assert parse_filter(None) is None and parse_filter({}) is None and parse_filter({"must": []}) is None
    assert parse_filter(f) is f


@pytest.mark.parametrize(
    ("flt", "path", "needle"),
    [
        ({"must": [{"key": "y", "range": {"between": [1, 2]}}]}, "filter.must[0].range", "unknown operator 'between'"),
        ({"must": [{"key": "y", "match": {"text": "x"}}]}, "filter.must[0].match", "unknown operator 'text'"),
        ({"filter": []}, "filter", "unknown key 'filter'"),
        ({"must": [{"key": "y", "matches": {"value": 1}}]}, "filter.must[0]", "unknown condition 'matches'"),
        ({"must": [{"geo": {"lat": 1}}]}, "filter.must[0]", "unknown condition 'geo'"),
        ({"must": [{"key": "y"}]}, "filter.must[0]", "needs 'match' or 'range'"),
        ({"must": [{"key": "y", "match": {"value": 1}, "range": {"gt": 1}}]}, "filter.must[0]", "one of 'match' or 'range'"),
        ({"must": [{"key": "y", "match": {"value": 1.5}}]}, "filter.must[0].match.value", "use range"),
        ({"must": [{"key": "y", "match": {"value": [1]}}]}, "filter.must[0].match.value", "got array"),
        ({"must": [{"key": "y", "match": {"value": None}}]}, "filter.must[0].match.value", "got null"),
        ({"must": [{"key": "y", "match": {"any": "x"}}]}, "filter.must[0].match.any", "expected a list"),
        ({"must": [{"key": "y", "match": {"any": ["a", {}]}}]}, "filter.must[0].match.any[1]", "got object"),
        ({"must": [{"key": "y", "match": {}}]}, "filter.must[0].match", "exactly one"),
        ({"must": [{"key": "y", "range": {"gt": "2019"}}]}, "filter.must[0].range.gt", "must be numbers"),
        ({"must": [{"key": "y", "range": {"gt": True}}]}, "filter.must[0].range.gt", "must be numbers"),
        ({"must": [{"key": "y", "range": {"gt": float("nan")}}]}, "filter.must[0].range.gt", "finite"),
        ({"must": [{"key": "y", "range": {}}]}, "filter.must[0].range", "at least one"),
        ({"must": [{"key": "", "match": {"value": 1}}]}, "filter.must[0].key", "non-empty string"),
        ({"must": [{"key": 3, "match": {"value": 1}}]}, "filter.must[0].key", "non-empty string"),
        ({"must": [{"key": "a..b", "match": {"value": 1}}]}, "filter.must[0].key", "empty part"),
        ({"must": [{"key": 'a"b', "match": {"value": 1}}]}, "filter.must[0].key", "may not contain"),
        ({"must": "x"}, "filter.must", "expected a list"),
        ({"must": [3]}, "filter.must[0]", "must be an object"),
        ({"must": [{}]}, "filter.must[0]", "empty condition"),
        ({"should": [{"has_id": "d1"}]}, "filter.should[0].has_id", "list of document ids"),
        ({"must_not": [{"is_empty": {"field": "x"}}]}, "filter.must_not[0].is_empty", '{"key": FIELD}'),
        ({"must": [{"has_id": ["a"], "key": "x"}]}, "filter.must[0]", "unexpected key 'key'"),
        ([{"must": []}], "filter", "must be an object"),
    ],
)
def test_errors_name_the_clause(flt, path, needle) -> None:
    with pytest.raises(FilterError) as info:
        parse_filter(flt)
    assert isinstance(info.value, ValidationError) and info.value.status_code == 422
    assert info.value.path == path
    assert str(info.value).startswith(f"{path}: ") and needle in str(info.value)


def test_limits() -> None:
    many = {"should": [{"has_id": [str(i)]} for i in range(MAX_CONDITIONS + 1)]}
    with pytest.raises(FilterError, match="too many conditions"):
        parse_filter(many)
    deep: dict = {"must": [{"has_id": ["x"]}]}
    for _ in range(20):
        deep = {"must": [deep]}
    with pytest.raises(FilterError, match="nest deeper"):
        parse_filter(deep)


def test_sql_values_are_bound_not_spliced(conn) -> None:
    evil = "x'); DROP TABLE docs; --"
    sql, params = compile_sql(parse_filter({"must": [{"key": "tags", "match": {"value": evil}}]}))
    assert evil not in sql and evil in params.values()
    assert _sql_ids(conn, {"must": [{"key": "tags", "match": {"value": evil}}]}) == []
    assert conn.execute("SELECT COUNT(*) FROM docs").fetchone()[0] == len(DOCS)


# --- random metadata and filters: SQL == Python -------------------------------------------
KEYS = ["a", "b", "c.d"]
scalars = st.one_of(
    st.sampled_from(["x", "y", ""]), st.integers(-2, 2), st.booleans(), st.sampled_from([0.5, 1.0, -1.5])
)
values = st.one_of(scalars, st.none(), st.lists(scalars, max_size=3), st.just({"k": "x"}))


@st.composite
def metadata(draw):
    out = {}
    for key in ["a", "b"]:
        if draw(st.booleans()):
            out[key] = draw(values)
    if draw(st.booleans()):
        out["c"] = {"d": draw(values)} if draw(st.booleans()) else draw(values)
    return out


match_values = st.one_of(st.sampled_from(["x", "y", ""]), st.integers(-2, 2), st.booleans())
leaf = st.one_of(
    st.builds(lambda k, v: {"key": k, "match": {"value": v}}, st.sampled_from(KEYS), match_values),
    st.builds(lambda k, v: {"key": k, "match": {"any": v}}, st.sampled_from(KEYS), st.lists(match_values, max_size=3)),
    st.builds(
        lambda k, op, v: {"key": k, "range": {op: v}},
        st.sampled_from(KEYS), st.sampled_from(["gt", "gte", "lt", "lte"]),
        st.one_of(st.integers(-2, 2), st.sampled_from([-0.5, 0.5, 1.0])),
    ),
    st.builds(lambda k: {"is_empty": {"key": k}}, st.sampled_from(KEYS)),
    st.builds(lambda k: {"is_null": {"key": k}}, st.sampled_from(KEYS)),
    st.builds(lambda ids: {"has_id": ids}, st.lists(st.sampled_from([f"d{i}" for i in range(12)]), max_size=3)),
)
filters = st.recursive(
    st.fixed_dictionaries({}, optional={"must": st.lists(leaf, max_size=3), "should": st.lists(leaf, max_size=3),
                                        "must_not": st.lists(leaf, max_size=2)}),
    lambda inner: st.fixed_dictionaries(
        {}, optional={"must": st.lists(st.one_of(leaf, inner.filter(bool)), max_size=2),
                      "should": st.lists(st.one_of(leaf, inner.filter(bool)), max_size=2),
                      "must_not": st.lists(st.one_of(leaf, inner.filter(bool)), max_size=2)}),
    max_leaves=8,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(docs=st.lists(metadata(), min_size=1, max_size=12), flt=filters)
def test_sql_matches_python_oracle(docs, flt) -> None:
    corpus = {f"d{i}": m for i, m in enumerate(docs)}
    c = sqlite3.connect(":memory:")
    c.execute("CREATE TABLE docs (doc_id TEXT PRIMARY KEY, metadata TEXT)")
    c.executemany("INSERT INTO docs VALUES (?, ?)", [(k, json.dumps(v)) for k, v in corpus.items()])
    assert _sql_ids(c, flt) == _py_ids(flt, corpus)

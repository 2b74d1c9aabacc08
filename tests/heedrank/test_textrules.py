"""heedrank.textrules: the text rule (no unpaired surrogates) and the id rule (TREC-safe)."""

from __future__ import annotations

import re

import pytest

from heedrank.errors import ValidationError
from heedrank.textrules import check_id, check_text, id_problem, json_problem, text_problem


@pytest.mark.parametrize("value", ["", "plain", "naïve café – 東京 😀", "\U0001f600", "tab\tand\nnewline", "a\x00b"])
def test_valid_text(value: str) -> None:
    assert text_problem(value) is None
    assert check_text(value, "here") == value


@pytest.mark.parametrize(("value", "code", "at"), [
    ("a\ud800b", "U+D800", 1), ("\udfff", "U+DFFF", 0), ("ok \udc00\ud800", "U+DC00", 3),
])
def test_unpaired_surrogates_are_named_with_their_position(value: str, code: str, at: int) -> None:
    problem = text_problem(value)
    assert problem is not None
    assert problem.startswith(f"contains the unpaired surrogate {code} at character {at},")
    with pytest.raises(ValidationError, match=rf"^documents\[3\]\.text: contains the unpaired surrogate {re.escape(code)} "):
        check_text(value, "documents[3].text")


@pytest.mark.parametrize("value", ["d1", "MED-10", "pmc/123", "naïve#1", "東京", "a.b:c", "9"])
def test_valid_ids(value: str) -> None:
    assert id_problem(value) is None
    assert check_id(value, "x") == value


@pytest.mark.parametrize(("value", "what", "code", "at"), [
    ("a b", "whitespace", "U+0020 SPACE", 1),
    ("a\tb", "whitespace", "U+0009", 1),
    ("ab\n", "whitespace", "U+000A", 2),
    ("a\u00a0b", "whitespace", "U+00A0 NO-BREAK SPACE", 1),
    ("a\u2028b", "whitespace", "U+2028 LINE SEPARATOR", 1),
    ("a\x00b", "a control character", "U+0000", 1),
    ("x\x7f", "a control character", "U+007F", 1),
    ("a\ud800", "an unpaired surrogate", "U+D800", 1),
])
def test_ids_that_a_trec_line_cannot_carry(value: str, what: str, code: str, at: int) -> None:
    assert id_problem(value) == (
        f"{value!r} contains {what} ({code} at character {at}); ids must not contain whitespace or control "
        "characters, which TREC run and qrels files cannot carry: rename it (e.g. replace spaces by '_')"
    )
    # every refused id would indeed break a whitespace-separated TREC line (or UTF-8)
    line = f"q1 Q0 {value} 1 1.0 tag"
    try:
        breaks = len(line.split()) != 6 or any(ord(c) < 32 or 127 <= ord(c) < 160 for c in value)
        line.encode("utf-8")
    except UnicodeEncodeError:
        breaks = True
    assert breaks


def test_empty_id() -> None:
    assert id_problem("") == "is empty; every document and query needs a non-empty id"
    with pytest.raises(ValidationError, match=r"^f:3: query: id is empty"):
        check_id("", "f:3: query")


def test_json_problem_paths_reach_nested_values_and_keys() -> None:
    assert json_problem({"a": [1, {"b": "ok"}], "n": None, "x": 2.5}) is None
    path, problem = json_problem({"a": [1, {"b": "x\udc00"}]})
    assert path == "['a'][1]['b']" and problem.startswith("contains the unpaired surrogate U+DC00 at character 1")
    path, problem = json_problem({"a": {"k\ud800": 1}})
    assert path == "['a']" and problem.startswith("the key 'k\\ud800' contains the unpaired surrogate U+D800")
    assert json_problem("\ud800")[0] == ""
    # the first problem in document order is reported
    assert json_problem(["ok", "\ud801", "\ud802"])[0] == "[1]"


def test_json_problem_is_iterative() -> None:
    deep: list = []
    cur = deep
    for _ in range(50_000):  # far beyond the recursion limit
        nxt: list = []
        cur.append(nxt)
        cur = nxt
    cur.append("\ud800")
    path, _ = json_problem(deep)
    assert path == "[0]" * 50_000 + "[0]"

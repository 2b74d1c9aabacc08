"""The two input rules every API schema and every file reader applies: one for text, one
for identifiers.

**Text** (queries, document texts and titles, metadata keys and string values, and any
other string a caller sends) must be a sequence of Unicode scalar values: no unpaired
surrogate code points (U+D800..U+DFFF). JSON can spell them (``"\\ud800"``) but UTF-8
cannot encode them, so they would fail later, in the tokenizer or in the SQLite store.

**Identifiers** (document ids and query ids) must be valid text, non-empty, and free of
whitespace and control characters: TREC run and qrels lines separate their columns by
whitespace (``qid Q0 docid rank score tag``), so such an id would shift the columns of
every line it is written on.

The API turns a broken rule into a 422 naming the field (``documents[3].text``); the file
readers of :mod:`heedrank.data` raise :class:`~heedrank.errors.ValidationError` naming the
file and line; :func:`heedrank.data.write_trec_run` refuses ids that break the rule.

**Folding** (:func:`fold_text`): texts that are the same to a reader compare equal after
it, whatever bytes spell them: NFC and NFD accents, full-width letters, ligatures ("ﬁ"),
zero-width characters and soft hyphens, upper and lower case. It is BM25's Unicode analysis
(:mod:`heedrank.index.bm25`, analyzer version 2), and :func:`is_blank` (a query with
nothing left after it is empty: 422) uses it.

**Numbers** (:func:`is_int`, :func:`is_number`): counts and weights are JSON numbers, never
booleans, although Python's ``True`` is an ``int``.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from typing import Any, TypeGuard

from heedrank.errors import ValidationError

__all__ = ["check_id", "check_text", "fold_text", "id_problem", "is_blank", "json_problem", "text_problem"]

_SURROGATE = re.compile("[\ud800-\udfff]")
_BAD_ID_CHAR = re.compile("[\\s\x00-\x1f\x7f-\x9f\ud800-\udfff]")  # \s: every str.isspace() character


# Unicode's Default_Ignorable_Code_Point set (DerivedCoreProperties.txt, Unicode 15): code
# points that render as nothing, e.g. U+00AD SOFT HYPHEN, U+200B ZERO WIDTH SPACE, U+200C/D
# ZERO WIDTH (NON-)JOINER, U+2060 WORD JOINER, U+FEFF BYTE ORDER MARK, variation selectors.
_IGNORABLE = re.compile(
    "[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e"
    "\u2060-\u206f\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufff8\U0001bca0-\U0001bca3"
    "\U0001d173-\U0001d17a\U000e0000-\U000e0fff]+"
)


def fold_text(value: str, *, casefold: bool = True) -> str:
    """``value`` as Unicode's NFKC_Casefold folds it (UAX #15 / UAX #44; Lucene's ICU
    ``nfkc_cf`` normaliser): default-ignorable code points removed (zero-width characters,
    soft hyphens, ...), NFKC (compatibility forms such as full-width letters and ligatures
    become their plain letters; NFD accents compose), then full case folding
    (:meth:`str.casefold`) and NFKC again (folding can leave a string unnormalised).

    Args:
        value: Any text.
        casefold: Fold case too (``False``: only the removal and NFKC).

    Returns:
        The folded text; ASCII text takes a fast path (``str.lower``). Linear in ``len(value)``.
    """
    if value.isascii():
        return value.lower() if casefold else value
    text = unicodedata.normalize("NFKC", _IGNORABLE.sub("", value))
    if casefold:
        text = unicodedata.normalize("NFKC", text.casefold())
    return text


def is_blank(value: str) -> bool:
    """Whether ``value`` holds nothing but whitespace and invisible characters (zero-width
    spaces, soft hyphens, ...) once folded (:func:`fold_text`): an empty query."""
    return not fold_text(value, casefold=False).strip()


def _code(ch: str) -> str:
    name = unicodedata.name(ch, "")
    return f"U+{ord(ch):04X}" + (f" {name}" if name else "")


def text_problem(value: str) -> str | None:
    """What breaks the text rule in ``value`` (a phrase to put after the field's name), or
    ``None`` when it is valid. Linear in ``len(value)`` (one regex scan)."""
    m = _SURROGATE.search(value)
    if m is None:
        return None
    return (
        f"contains the unpaired surrogate {_code(m.group())} at character {m.start()}, which is not a Unicode "
        "character; send valid UTF-8 text (in JSON, a \\ud800-\\udfff escape must be half of a surrogate pair)"
    )


def id_problem(value: str) -> str | None:
    """What breaks the identifier rule in ``value``, or ``None`` when it is valid."""
    if not value:
        return "is empty; every document and query needs a non-empty id"
    m = _BAD_ID_CHAR.search(value)
    if m is None:
        return None
    ch = m.group()
    if _SURROGATE.match(ch):
        what = "an unpaired surrogate"
    elif ch.isspace():
        what = "whitespace"
    else:
        what = "a control character"
    return (
        f"{value!r} contains {what} ({_code(ch)} at character {m.start()}); ids must not contain whitespace or "
        "control characters, which TREC run and qrels files cannot carry: rename it (e.g. replace spaces by '_')"
    )


def json_problem(value: Any) -> tuple[str, str] | None:
    """The first string of a JSON value (object keys included, at any depth) that breaks
    the text rule, as ``(path, problem)``, or ``None``. ``path`` locates the string, like
    ``"['tags'][2]"`` (``""`` for ``value`` itself); for a key it locates the object and
    ``problem`` starts with ``"the key '...'"``. Iterative, so any nesting depth is safe."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            problem = text_problem(item)
            if problem:
                return path, problem
        elif isinstance(item, Mapping):
            children = []
            for key, child in item.items():
                if isinstance(key, str) and (problem := text_problem(key)):
                    return path, f"the key {key!r} {problem}"
                children.append((f"{path}[{key!r}]", child))
            stack.extend(reversed(children))
        elif isinstance(item, (list, tuple)):
            stack.extend(reversed([(f"{path}[{i}]", child) for i, child in enumerate(item)]))
    return None


def check_text(value: str, where: str) -> str:
    """``value`` when it keeps the text rule.

    Raises:
        ValidationError: ``"<where>: <problem>"``.
    """
    problem = text_problem(value)
    if problem:
        raise ValidationError(f"{where}: {problem}")
    return value


def check_id(value: str, where: str) -> str:
    """``value`` when it keeps the identifier rule.

    Raises:
        ValidationError: ``"<where>: id <problem>"``.
    """
    problem = id_problem(value)
    if problem:
        raise ValidationError(f"{where}: id {problem}")
    return value


def is_int(value: Any) -> TypeGuard[int]:
    """Whether ``value`` is an integer and not a bool (``True`` is an ``int`` in Python, a
    switch in JSON)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> TypeGuard[int | float]:
    """Whether ``value`` is an ``int`` or a ``float`` and not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)

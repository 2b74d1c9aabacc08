"""The README and the reference pages in docs/ say what the code does.

- the generated pages (``docs/cli.md``, ``docs/openapi.json``, ``docs/configuration.md`` and
  the README's "What ships" table) equal what ``scripts/gen_docs.py`` writes now;
- the README's Python examples run (the one that loads the LM only with ``-m slow``);
- every figure of the "What ships" table equals the shipped weights card's field it names;
- the README stays a front door (at most 16,000 bytes), and no link of the README or of a
  page in docs/ points to a missing file.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
README_MAX_BYTES = 16_000
SLOW_MARK = "# slow"
"""First line of a README Python block that loads the real LM: run only with ``-m slow``."""


def _gen_docs():
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", README.read_text(encoding="utf-8"), flags=re.M | re.S)


def test_generated_docs_are_current(monkeypatch):
    for key in [k for k in __import__("os").environ if k.startswith("HEEDRANK_")]:
        monkeypatch.delenv(key)
    gen = _gen_docs()
    stale = [str(p.relative_to(ROOT)) for p in gen.stale(gen.generated())]
    assert not stale, f"{stale} are stale: run .venv/bin/python scripts/gen_docs.py"


def test_every_setting_is_described():
    from heedrank.settings import Settings

    assert [name for name, field in Settings.model_fields.items() if not field.description] == []


def test_readme_is_a_front_door():
    assert len(README.read_bytes()) <= README_MAX_BYTES
    assert _python_blocks(), "the README has no Python example"


def _run_blocks(slow: bool) -> None:
    namespace: dict[str, object] = {"__name__": "readme_example"}
    ran = 0
    for block in _python_blocks():
        if block.startswith(SLOW_MARK) and not slow:
            break  # later blocks may build on it
        exec(compile(block, "README.md", "exec"), namespace)  # noqa: S102 - the README's own examples
        ran += 1
    assert ran


def test_readme_python_examples_run():
    _run_blocks(slow=False)


@pytest.mark.slow
def test_readme_python_examples_run_with_the_lm():
    _run_blocks(slow=True)


def _numbers(text: str) -> list[str]:
    return re.findall(r"\d+(?:\.\d+)?", re.sub(r"(?<=\d),(?=\d{3})", "", text))


def _close(shown: str, value: float) -> bool:
    decimals = len(shown.split(".")[1]) if "." in shown else 0
    return abs(float(shown) - value) <= 0.5 * 10 ** -decimals + 1e-12


def test_what_ships_figures_are_the_cards():
    gen = _gen_docs()
    card = gen.shipped_card()
    text = README.read_text(encoding="utf-8")
    start, end = gen.MARKERS
    table = text.split(start, 1)[1].split(end, 1)[0]
    rows = [line for line in table.strip().splitlines()[2:] if line.startswith("|")]
    assert len(rows) == len(gen.WHAT_SHIPS)
    for row in rows:
        _, shown, field = (cell.strip() for cell in row.strip("|").split("|"))
        value = gen.card_field(card.data, field.strip("`"))
        if isinstance(value, str):
            assert shown.strip("`") == value, row
            continue
        if isinstance(value, list):
            assert [v.strip().strip("`") for v in shown.split(",")] == value, row
            continue
        if isinstance(value, dict) and "dense" in value:  # the default beside the first stage and the embedder
            expected = [value["first stage"], value["dense"], value["default"], value["p_vs_first_stage"],
                        value["p_vs_dense"]]
        elif isinstance(value, dict):
            served = value.get("fused", value.get("learned"))
            expected = [value["first stage"], served, value["p"]]
        else:
            expected = [value]
        got = _numbers(shown)
        assert len(got) == len(expected) and all(map(_close, got, expected)), f"{row} != card {field}: {expected}"


def _markdown_files() -> list[Path]:
    docs = ROOT / "docs"
    return [README, *sorted(p for p in docs.rglob("*.md") if p.name != "RESULTS.md")]


@pytest.mark.parametrize("page", _markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_links_point_to_files(page):
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.M | re.S)
    text = re.sub(r"`[^`\n]*`", "", text)  # code spans: formulas such as A[h][i,j](q)
    missing = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        path = target.split("#", 1)[0]
        if not path or re.match(r"[a-z]+:", path):
            continue
        if not (page.parent / path).exists():
            missing.append(target)
    assert not missing, f"{page.relative_to(ROOT)} links to missing files: {missing}"

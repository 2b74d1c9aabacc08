"""The README and the reference pages in docs/ say what the code does.

- the generated pages (``docs/cli.md``, ``docs/openapi.json``, ``docs/configuration.md`` and
  the README's "What ships" table) equal what ``scripts/gen_docs.py`` writes now;
- the README's Python examples run as written and print what their comments say, with no
  progress bar on stderr (the one that loads the LM only with ``-m slow``);
- every figure of the "What ships" table equals the shipped weights card's field it names;
- the README stays a front door (at most 16,000 bytes), and no link of the README or of a
  page in docs/ points to a missing file.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
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


def _expected_output(block: str) -> list[str]:
    """What a README Python block prints, read from its comments: the comment of a top-level
    ``print(...)`` line is the line it prints; the comment of a top-level ``for`` line is the
    lines its body prints, joined by ``", "``."""
    lines: list[str] = []
    for line in block.splitlines():
        code, _, comment = line.partition("  # ")
        if not comment or code.startswith((" ", "#")):
            continue
        if code.startswith("print("):
            lines.append(comment)
        elif code.startswith("for "):
            lines.extend(comment.split(", "))
    return lines


def _same_line(printed: str, expected: str) -> bool:
    """Equal word by word; a number may differ by one unit of the README's last decimal
    (another CPU's float arithmetic)."""
    got, want = printed.split(), expected.split()
    if len(got) != len(want):
        return False
    for g, w in zip(got, want):
        if g == w:
            continue
        if not re.fullmatch(r"-?\d+\.\d+", w) or not re.fullmatch(r"-?\d+(?:\.\d+)?", g):
            return False
        if abs(float(g) - float(w)) > 10 ** -len(w.split(".")[1]) + 1e-12:
            return False
    return True


BAR_SWITCHES = ("TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS", "HF_DATASETS_DISABLE_PROGRESS_BARS")
TQDM_FRAME = re.compile(r"\[\d+:\d\d(?:<[\d:?]+)?, [^\]]*/s\]")
"""A tqdm bar's timing field: ``[00:00, 949.97 examples/s]``, ``[00:00<?, ?it/s]``."""


def _run_blocks(slow: bool) -> None:
    """Run the README's Python blocks as written, in one fresh interpreter (later blocks build
    on earlier ones; without ``slow``, up to the first block marked ``# slow``): stdout must be
    what their comments say (:func:`_expected_output`), and stderr must hold no progress bar
    (they ask for none: ``show_progress=False``, a pipeline's searches)."""
    blocks = _python_blocks()
    if not slow:
        blocks = blocks[:next((i for i, b in enumerate(blocks) if b.startswith(SLOW_MARK)), len(blocks))]
    expected = [line for block in blocks for line in _expected_output(block)]
    assert blocks and all(_expected_output(b) for b in blocks), "every README Python block says what it prints"
    # without the switches a server started in this session left (heedrank.progress.quiet_progress_bars)
    env = {k: v for k, v in os.environ.items() if k not in BAR_SWITCHES}
    run = subprocess.run([sys.executable, "-c", "\n".join(blocks)], capture_output=True, timeout=600, cwd=ROOT, env=env)
    err = run.stderr.decode(errors="replace")  # bytes: text mode would turn a bar's "\r" into "\n"
    assert run.returncode == 0, err
    printed = run.stdout.decode().splitlines()
    assert len(printed) == len(expected) and all(map(_same_line, printed, expected)), (
        f"the README's Python examples print {printed}, their comments say {expected}")
    bars = [line for line in re.split(r"[\r\n]", err) if TQDM_FRAME.search(line)]
    assert not bars and "\r" not in err, f"progress bars on stderr: {bars or err!r}"


def test_readme_python_examples_print_what_they_say():
    _run_blocks(slow=False)


@pytest.mark.slow
def test_readme_python_examples_print_what_they_say_with_the_lm(default_lm):
    """``default_lm``: the packaged LM converted and cached once (the subprocess loads that copy)."""
    _run_blocks(slow=True)


def test_the_readme_output_is_read_from_its_comments():
    block = "x = 1  # not output\nprint(x)  # 1\nfor i in (2, 3):  # d2 0.5, d3 0.25\n    print(i)  # meaning, not output\n"
    assert _expected_output(block) == ["1", "d2 0.5", "d3 0.25"]
    assert _same_line("d1 0.771", "d1 0.77") and _same_line("d1 0.76", "d1 0.77") and not _same_line("d1 0.75", "d1 0.77")
    assert not _same_line("d2 0.77", "d1 0.77") and not _same_line("d1", "d1 0.77")
    for frame in ("Generating train split: 5 examples [00:00, 949.97 examples/s]",
                  "Loading weights:   0%|          | 0/272 [00:00<?, ?it/s]",
                  "Loading weights: 100%|##########| 272/272 [00:00<00:00, 33585.05it/s]"):
        assert TQDM_FRAME.search(frame), frame
    assert not TQDM_FRAME.search("INFO heedrank.index.builder: index of 5 documents written in 0.1 s")


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

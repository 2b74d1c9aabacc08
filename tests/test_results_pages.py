"""The result pages (docs/results/*.md) cite only files the repository holds, and their tag table parses.

A repository path cited in backticks must exist in the working tree, or, for code that left main,
at the commit of one of the ``exp/*`` tags listed in docs/results/index.md (checked with
``git cat-file`` where that commit is in this clone) when the section that cites it says so
(it names an ``exp/`` tag or says the code left main). ``scripts/tags.sh`` reads the same table:
one row per tag, the tag and a commit hash in backticks in its first two cells.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = ROOT / "docs" / "results"
INDEX = PAGES / "index.md"

# Top-level folders and files whose paths a page may cite; a token whose first component is not
# one of them (``runs/``, ``indexes/``, ``INDEX/``, ``../shared``) is a work path, not a citation.
# Folders that moved away (train/ went to lab/) stay listed, so that a stale citation fails.
TOP = ({p.name for p in ROOT.iterdir() if not p.name.startswith(".")} | {"train", "eval", "lab", "bench", "recipes"}) - {
    "runs", "indexes"}
TAG_ROW = re.compile(r"^\|\s*`(exp/[A-Za-z0-9._/-]+)`\s*\|\s*`([0-9a-f]{7,40})`\s*\|")
SPAN = re.compile(r"`([^`\n]+)`")
KEPT = re.compile(r"exp/|left main|leave main|at the tag|tag `")
TOKEN = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_./*-]*/[A-Za-z0-9_./*-]*")


def tag_table(text: str) -> list[tuple[str, str]]:
    """(tag, commit) for every row of the index's tag table, in order (what scripts/tags.sh parses)."""
    return [m.groups() for line in text.splitlines() if (m := TAG_ROW.match(line))]


def cited_paths(text: str) -> set[str]:
    """Repository paths cited in backticks: tokens with a slash whose first component is a top-level entry."""
    out = set()
    for span in SPAN.findall(text):
        for token in TOKEN.findall(span):
            path = token.split("::")[0].rstrip(".,:;")
            if path.split("/")[0] in TOP and "*" not in path:
                out.add(path.rstrip("/"))
    return out


DOTTED = re.compile(r"`(heedrank(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")


def _package_dirs() -> dict[str, Path]:
    """``heedrank.*`` package name -> folder, from pyproject.toml's [tool.setuptools.package-dir]."""
    table = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return {name: ROOT / folder for name, folder in table.items()}


def resolves(dotted: str, dirs: dict[str, Path]) -> bool:
    """Whether ``heedrank.pkg.module.Name`` names a module of the working tree and a top-level name in it."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        package = ".".join(parts[:cut])
        if package in dirs:
            break
    else:
        return False
    base, rest = dirs[package], parts[cut:]
    for i in range(len(rest), -1, -1):
        module = base.joinpath(*rest[:i])
        source = module.with_suffix(".py") if i else None
        if i and source.is_file():
            pass
        elif (module / "__init__.py").is_file():
            source = module / "__init__.py"
        else:
            continue
        names = rest[i:]
        if not names:
            return True
        return re.search(rf"^(?:class |def |async def )?{re.escape(names[0])}\b", source.read_text(), re.M) is not None
    return False


def _at_commit(commit: str, path: str) -> bool:
    r = subprocess.run(["git", "cat-file", "-e", f"{commit}:{path}"], cwd=ROOT, capture_output=True)
    return r.returncode == 0


def _has_commit(commit: str) -> bool:
    r = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=ROOT, capture_output=True)
    return r.returncode == 0


def test_the_tag_table_parses():
    rows = tag_table(INDEX.read_text())
    assert len(rows) >= 10, rows
    tags = [t for t, _ in rows]
    assert len(tags) == len(set(tags)), "a tag is listed twice"
    assert all(len(c) >= 12 for _, c in rows), "commits are written with at least 12 hex digits"


def test_scripts_tags_sh_reads_the_same_rows():
    script = (ROOT / "scripts" / "tags.sh").read_text()
    assert "docs/results/index.md" in script


def test_no_page_cites_a_missing_file():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    commits = [c for _, c in tag_table(INDEX.read_text()) if _has_commit(c)]
    missing = []
    for page in sorted(PAGES.glob("*.md")):
        for section in re.split(r"\n(?=#)", page.read_text()):
            # Only a section that says its code left main may cite a path main no longer holds.
            kept_by_tag = bool(KEPT.search(section))
            for path in sorted(cited_paths(section)):
                if (ROOT / path).exists():
                    continue
                if kept_by_tag and any(_at_commit(c, path) for c in commits):
                    continue
                missing.append(f"{page.name}: {path}")
    assert not missing, "cited paths that neither main nor an exp/* tag holds:\n" + "\n".join(missing)


def test_every_module_name_resolves():
    dirs = _package_dirs()
    missing = []
    for page in sorted(PAGES.glob("*.md")):
        for section in re.split(r"\n(?=#)", page.read_text()):
            if KEPT.search(section):
                continue  # code that left main: names are those of its tag
            missing += [f"{page.name}: {n}" for n in sorted(set(DOTTED.findall(section))) if not resolves(n, dirs)]
    assert not missing, "module names that main does not hold:\n" + "\n".join(missing)


def test_no_page_names_an_uncommitted_work_script():
    for page in sorted(PAGES.glob("*.md")):
        hits = re.findall(r"runs/[A-Za-z0-9_./-]*\.(?:py|sh)\b", page.read_text())
        assert not hits, f"{page.name} names scripts under the ignored runs/: {hits}"


CITATION = re.compile(r"docs/results/([a-z0-9-]+\.md)(?:,?\s+\\?\"([^\"\\]+))?")


def test_citations_name_a_page_and_its_heading():
    """Every ``docs/results/PAGE.md, "Heading"`` in the repository names a page and the start of one of its headings."""
    files = subprocess.run(["git", "ls-files", "*.py", "*.sh", "*.md"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    headings = {p.name: [h.replace("`", "").lower() for h in re.findall(r"^#+ (.+)$", p.read_text(), re.M)] for p in PAGES.glob("*.md")}
    wrong = []
    for name in files:
        path = ROOT / name
        if not path.is_file() or name.startswith("docs/results/") or name == "CHANGELOG.md":
            continue
        for page, heading in CITATION.findall(path.read_text(errors="replace")):
            if page not in headings:
                wrong.append(f"{name}: docs/results/{page} (no such page)")
            elif heading:
                text = re.sub(r"\s*\n\s*(?:#\s*)?", " ", heading).replace("`", "").strip().lower()
                if not any(h.startswith(text) for h in headings[page]):
                    wrong.append(f"{name}: docs/results/{page}, \"{text}\" (no such heading)")
    assert not wrong, "citations of the result pages that do not resolve:\n" + "\n".join(wrong)


def test_no_source_file_cites_a_missing_file():
    """Docstrings and comments of the code (``.py``, ``.sh``; tests aside) cite only paths the
    working tree holds: a path in backticks whose first component is a top-level entry
    (placeholders with ``<``, ``{``, ``*`` or ``$`` are not paths)."""
    files = subprocess.run(["git", "ls-files", "*.py", "*.sh"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    missing = []
    for name in files:
        if name.startswith("tests/") or not (ROOT / name).is_file():
            continue
        for double, single in re.findall(r"``([^`\n]+)``|`([^`\n]+)`", (ROOT / name).read_text(errors="replace")):
            span = double or single
            if any(c in span for c in "<{*$"):
                continue
            for token in TOKEN.findall(span):
                path = token.split("::")[0].rstrip(".,:;")
                if path.split("/")[0] in TOP and not (ROOT / path).exists():
                    missing.append(f"{name}: {path}")
    assert not missing, "paths cited in the code that the working tree does not hold:\n" + "\n".join(missing)

"""The package layering, read from the source with ``ast``: dependencies point one way
(``heedrank`` <- ``index`` <- ``retriever``; ``heedrank`` <- ``reranker``; the engines
(``heedrank.engine``) over those three, importing them only inside functions; ``api`` and
``eval`` above them; the lab (``heedrank.lab``: research and model building) above the whole
product side, imported by nothing but the CLI root, inside a function; nothing imports
``api``; the CLI is the one composition root), and
no two modules import each other, directly or through others, deferred imports included
(imports under ``if TYPE_CHECKING:`` are type-only and do not count).

Which folder holds which module is read from ``pyproject.toml`` (``[tool.setuptools.package-dir]``),
the one place that says it: the top-level folders install under ``heedrank.*``."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
PACKAGE_DIRS: dict[str, Path] = {pkg: ROOT / folder for pkg, folder in _SETUPTOOLS["package-dir"].items()}
"""Package -> its folder, as installed (``"heedrank.lab" -> ROOT / "lab"``)."""
PACKAGES: set[str] = set(_SETUPTOOLS["packages"])
LAB = "lab"
# layer -> the layers it may import (itself always allowed)
ALLOWED = {
    "core": {"core"},
    "index": {"core"},
    "retriever": {"core", "index"},
    "reranker": {"core"},
    "engine": {"core", "index", "retriever", "reranker"},
    "eval": {"core", "index", "retriever", "reranker", "engine"},
    "api": {"core", "index", "retriever", "reranker"},
    # the whole product side, and the CLI's shared option types (heedrank.cli.options) for its commands
    LAB: {"core", "index", "retriever", "reranker", "engine", "eval", "cli"},
    # the lab only from heedrank.cli.app, inside a function (test_only_the_cli_root_imports_the_lab)
    "cli": {"core", "index", "retriever", "reranker", "eval", LAB, "api", "engine"},
}
# layer -> the layers it may import at module level (the rest only inside functions)
AT_IMPORT = {"engine": {"core", "engine"}}
LAYERS = {"index", "retriever", "reranker", "api", "eval", "engine", LAB}


def _module_name(path: Path) -> str:
    """The installed module of a source file: the package whose folder (``package-dir``)
    holds it most closely, then the path below that folder."""
    pkg, folder = max(((p, f) for p, f in PACKAGE_DIRS.items() if path.is_relative_to(f)),
                      key=lambda pf: len(pf[1].parts))
    parts = list(path.relative_to(folder).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([pkg, *parts])


def _layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "core"
    if parts[1] in {"cli", "__main__"}:
        return "cli"
    return parts[1] if parts[1] in LAYERS else "core"


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, module: str, is_pkg: bool, *, deferred: bool = True) -> set[str]:
    """The ``heedrank`` modules ``tree`` imports; with ``deferred=False`` only those
    imported when the module is (not inside a function)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if not deferred and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_pkg else 0)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            found.add(name)
            found.update(f"{name}.{a.name}" for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {n for n in found if n == "heedrank" or n.startswith("heedrank.")}


def _graph(*, deferred: bool = True) -> dict[str, set[str]]:
    files = {p for d in PACKAGE_DIRS.values() for p in d.rglob("*.py")}
    modules = {_module_name(p): p for p in sorted(files)}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        raw = _imports(ast.parse(path.read_text()), name, path.name == "__init__.py", deferred=deferred)
        # keep the longest prefix that is a module of ours (``from a.b import c`` -> a.b or a.b.c)
        graph[name] = {m for m in raw if m in modules and m != name}
    return graph


GRAPH = _graph()
AT_IMPORT_GRAPH = _graph(deferred=False)


def test_graph_is_read() -> None:
    assert len(GRAPH) > 60
    assert {"heedrank.types", "heedrank.retriever.base"} <= GRAPH["heedrank.retriever.bm25"]
    assert "heedrank.data" in GRAPH["heedrank.eval.harness"]  # a deferred import counts


def test_the_block_contract_and_the_store_package() -> None:
    # the reranker and the index speak the core's header, key and protocols, never each other
    assert _layer("heedrank.blocks") == "core"
    assert "heedrank.blocks" in GRAPH["heedrank.index.kv.store"] and "heedrank.blocks" in GRAPH["heedrank.reranker.cached"]
    kv = {m for m in GRAPH if m.startswith("heedrank.index.kv.")}
    assert kv == {f"heedrank.index.kv.{m}" for m in ("format", "codec", "store", "maintenance", "build", "tiers", "manifest",
                                                      "budget", "shards", "directory", "ramcache", "writes")}
    # inside the package: the format at the bottom, maintenance below the store that calls it, the build on top
    assert not GRAPH["heedrank.index.kv.format"] & kv
    assert GRAPH["heedrank.index.kv.maintenance"] & kv == {"heedrank.index.kv.format"}
    assert "heedrank.index.kv.maintenance" in GRAPH["heedrank.index.kv.store"]
    assert not GRAPH["heedrank.index.kv.store"] & {"heedrank.index.kv.build"}


def test_the_mapping_is_pyprojects() -> None:
    assert _module_name(ROOT / "lab" / "train" / "loop.py") == "heedrank.lab.train.loop"
    assert _module_name(ROOT / "heedrank" / "cli" / "app.py") == "heedrank.cli.app"
    assert _module_name(ROOT / "index" / "kv" / "__init__.py") == "heedrank.index.kv"
    # every folder with an __init__.py under a mapped folder is a declared package, and back
    found = {_module_name(p) for d in PACKAGE_DIRS.values() for p in d.rglob("__init__.py")}
    assert found == PACKAGES, f"pyproject.toml packages: missing {sorted(found - PACKAGES)}, stale {sorted(PACKAGES - found)}"


def test_the_lab_layer_is_read() -> None:
    assert _layer("heedrank.lab.train.loop") == LAB and "heedrank.lab.train.loop" in GRAPH
    assert _layer("heedrank.lab.cli") == LAB
    assert "heedrank.lab.train.loop" in GRAPH["heedrank.lab.train.blockrank"]
    assert "heedrank.lab.study" in GRAPH["heedrank.lab.train.head_fit"]
    assert "heedrank.eval.metrics" in GRAPH["heedrank.lab.study"]  # the lab builds on the product...
    assert {layer for layer, allowed in ALLOWED.items() if LAB in allowed} == {"cli"}  # ...never the reverse
    assert "heedrank.lab.cli" in GRAPH["heedrank.cli.app"]


def test_only_the_cli_root_imports_the_lab() -> None:
    # heedrank lab is registered lazily: the lab's modules load only when it is invoked
    importers = sorted(m for m, deps in GRAPH.items() if _layer(m) != LAB and any(_layer(d) == LAB for d in deps))
    assert importers == ["heedrank.cli.app"]
    at_import = sorted(d for d in AT_IMPORT_GRAPH["heedrank.cli.app"] if _layer(d) == LAB)
    assert not at_import, f"heedrank.cli.app imports {at_import} at import time; import the lab inside a function"


def test_the_lab_takes_only_option_types_from_the_cli() -> None:
    used = sorted({d for m, deps in GRAPH.items() if _layer(m) == LAB for d in deps if _layer(d) == "cli"})
    assert used == ["heedrank.cli.options"]


def test_a_forbidden_edge_is_caught() -> None:
    tree = ast.parse("def f():\n    from heedrank.api.app import create_app\n")
    assert _imports(tree, "heedrank.reranker.icr", False) >= {"heedrank.api.app"}
    assert "api" not in ALLOWED[_layer("heedrank.reranker.icr")]


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_point_one_way(module: str) -> None:
    src = _layer(module)
    bad = sorted(m for m in GRAPH[module] if _layer(m) != src and _layer(m) not in ALLOWED[src])
    assert not bad, f"{module} ({src}) imports {bad}; allowed layers: {sorted(ALLOWED[src])}"


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if _layer(m) in AT_IMPORT))
def test_deferred_imports_stay_deferred(module: str) -> None:
    src = _layer(module)
    bad = sorted(m for m in AT_IMPORT_GRAPH[module] if _layer(m) not in AT_IMPORT[src])
    assert not bad, f"{module} ({src}) imports {bad} at import time; import them inside the functions that use them"


def test_the_engine_layer_is_read() -> None:
    assert _layer("heedrank.engine.ray") == "engine" and "heedrank.engine.ray" in GRAPH
    assert "heedrank.index.kv" in GRAPH["heedrank.engine.ray"]  # deferred: counted here...
    assert "heedrank.index.kv" not in AT_IMPORT_GRAPH["heedrank.engine.ray"]  # ...not at import


def test_no_import_cycles() -> None:
    # package __init__ modules re-export their children; an edge into a package's own
    # children from its __init__ is not a cycle of logic.
    graph = {m: {d for d in deps if not m or not d.startswith(m + ".")} for m, deps in GRAPH.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:  # Tarjan
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strong(v)
    assert not cycles, f"import cycles: {cycles}"

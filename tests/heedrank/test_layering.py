"""The package layering, read from the source with ``ast``: dependencies point one way
(``heedrank`` <- ``index`` <- ``retriever``; ``heedrank`` <- ``reranker``; the engines
(``heedrank.engine``) over those three, importing them only inside functions; ``api`` and
``eval`` above them; ``train`` above ``eval``, imported by nothing but the CLI; nothing
imports ``api``; the CLI is the one composition root), and
no two modules import each other, directly or through others, deferred imports included
(imports under ``if TYPE_CHECKING:`` are type-only and do not count)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAYER_DIRS = {"heedrank": "heedrank", "index": "index", "retriever": "retriever", "reranker": "reranker",
              "api": "api", "eval": "eval", "train": "train"}
# layer -> the layers it may import (itself always allowed)
ALLOWED = {
    "core": {"core"},
    "index": {"core"},
    "retriever": {"core", "index"},
    "reranker": {"core"},
    "engine": {"core", "index", "retriever", "reranker"},
    "eval": {"core", "index", "retriever", "reranker", "engine"},
    "train": {"core", "index", "retriever", "reranker", "engine", "eval"},
    "api": {"core", "index", "retriever", "reranker"},
    "cli": {"core", "index", "retriever", "reranker", "eval", "train", "api", "engine"},
}
# layer -> the layers it may import at module level (the rest only inside functions)
AT_IMPORT = {"engine": {"core", "engine"}}


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(["heedrank", *parts[1:]]) if parts[0] == "heedrank" else ".".join(["heedrank", *parts])


def _layer(module: str) -> str:
    parts = module.split(".")
    if len(parts) == 1:
        return "core"
    if parts[1] in {"cli", "__main__"}:
        return "cli"
    return parts[1] if parts[1] in {"index", "retriever", "reranker", "api", "eval", "engine", "train"} else "core"


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
    files = [p for d in LAYER_DIRS.values() for p in (ROOT / d).rglob("*.py")]
    modules = {_module_name(p): p for p in files}
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
    assert "heedrank.eval.dump" in GRAPH["heedrank.eval.harness"]  # a deferred import counts


def test_the_block_contract_and_the_store_package() -> None:
    # the reranker and the index speak the core's header, key and protocols, never each other
    assert _layer("heedrank.blocks") == "core"
    assert "heedrank.blocks" in GRAPH["heedrank.index.kv.store"] and "heedrank.blocks" in GRAPH["heedrank.reranker.cached"]
    kv = {m for m in GRAPH if m.startswith("heedrank.index.kv.")}
    assert kv == {f"heedrank.index.kv.{m}" for m in ("format", "codec", "store", "maintenance", "build", "tiers")}
    # inside the package: the format at the bottom, maintenance below the store that calls it, the build on top
    assert not GRAPH["heedrank.index.kv.format"] & kv
    assert GRAPH["heedrank.index.kv.maintenance"] & kv == {"heedrank.index.kv.format"}
    assert "heedrank.index.kv.maintenance" in GRAPH["heedrank.index.kv.store"]
    assert not GRAPH["heedrank.index.kv.store"] & {"heedrank.index.kv.build"}


def test_the_train_layer_is_read() -> None:
    assert _layer("heedrank.lab.train.loop") == "train" and "heedrank.lab.train.loop" in GRAPH
    assert "heedrank.lab.train.loop" in GRAPH["heedrank.lab.train.blockrank"]
    assert "heedrank.lab.study" in GRAPH["heedrank.lab.train.head_fit"]  # train builds on eval...
    assert "train" not in ALLOWED["eval"] and "train" in ALLOWED["cli"]  # ...never the reverse
    assert {layer for layer, allowed in ALLOWED.items() if "train" in allowed} == {"cli"}


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

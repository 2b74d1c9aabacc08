"""The bench scripts under test are files, not modules: :func:`load_bench` imports one by name."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH_DIR = Path(__file__).resolve().parents[2] / "bench"


def load_bench(name: str) -> ModuleType:
    """``bench/<name>.py`` imported as module ``heedrank_bench_<name>`` (registered in
    ``sys.modules``: its dataclasses look their module up)."""
    spec = importlib.util.spec_from_file_location(f"heedrank_bench_{name}", BENCH_DIR / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod

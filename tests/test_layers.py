"""The house's rules, checked: layers only look down, no import circle, no public name shadows a module."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import attnlab

ROOT = Path(__file__).resolve().parents[1]


def test_the_layer_contract_holds():
    """pyproject.toml's import-linter contract (the layers of docs/design.md): an upward import fails here."""
    lint = Path(sys.executable).with_name("lint-imports")
    res = subprocess.run([str(lint), "--config", str(ROOT / "pyproject.toml")], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-2000:]
    assert "Contracts: 1 kept, 0 broken." in res.stdout


def test_the_contract_has_no_exceptions():
    """No layer reaches up, not even by a named exception (the notebook display is registered from
    attnlab/__init__.py, above every layer)."""
    assert _named_exceptions() == set()


def _graph():
    import grimp

    return grimp.build_graph("attnlab")


def _named_exceptions() -> set[tuple[str, str]]:
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    return {tuple(s.strip() for s in line.split("->")) for c in config for line in c.get("ignore_imports", [])}


def test_no_module_imports_itself_through_others():
    """No import circle between modules (found by depth-first search), apart from the contract's named
    exceptions: a notebook's _repr_html_ draws the viewer, which shows maps, by design."""
    graph = _graph()
    for importer, imported in _named_exceptions():
        graph.remove_import(importer=importer, imported=imported)
    modules = sorted(graph.modules)
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(graph.find_modules_directly_imported_by(m) - {m}):  # a package importing its own extension
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state and (cycle := visit(n)):
                return cycle
        path.pop()
        state[m] = 2
        return None

    for m in modules:
        if m not in state and (cycle := visit(m)):
            pytest.fail("import circle: " + " -> ".join(cycle))


def test_every_module_imports_by_its_dotted_path_and_no_public_name_shadows_one():
    for info in pkgutil.walk_packages(attnlab.__path__, "attnlab."):
        module = importlib.import_module(info.name) if not info.name.endswith("._tiles") else None
        parent_name, _, child = info.name.rpartition(".")
        parent = importlib.import_module(parent_name)
        if hasattr(parent, child):
            assert getattr(parent, child) is module or module is None, (
                f"{parent_name}.{child} is both a module and another object"
            )
    for name in attnlab.__all__:
        if inspect.ismodule(getattr(attnlab, name)):  # a public module (attnlab.masks) is itself, nothing else
            assert getattr(attnlab, name) is importlib.import_module(f"attnlab.{name}")
            continue
        assert importlib.util.find_spec(f"attnlab.{name}") is None, f"attnlab.{name} names a public object and a module"

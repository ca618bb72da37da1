"""Functions a reader can hold: none in src/ over 80 lines (the design page asks for under ~60)."""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
LIMIT = 80


def function_lengths() -> list[tuple[int, str]]:
    """(lines, where) of every function and method under src/, nested ones counted on their own too."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                found.append((node.end_lineno - node.lineno + 1, f"{path.relative_to(SRC)}:{node.lineno} {node.name}"))
    return found


def test_no_function_is_over_80_lines():
    lengths = function_lengths()
    assert len(lengths) > 100  # the walk found the package
    assert [where for n, where in lengths if n > LIMIT] == []

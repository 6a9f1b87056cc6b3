"""Every function of the packages fits a screen: at most 60 lines, decorators left out, its
docstring in (an AST walk over every module of tangram, solvers, managers, topology and
evaluation; nested functions count on their own and inside the one that holds them)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("tangram", "solvers", "managers", "topology", "evaluation")
MOST = 60


def long_functions(source: str, most: int = MOST) -> list[tuple[str, int]]:
    """(name, lines) of each function in `source` over `most` lines."""
    return [
        (n.name, n.end_lineno - n.lineno + 1)
        for n in ast.walk(ast.parse(source))
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        and n.end_lineno - n.lineno + 1 > most
    ]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_function_is_over_60_lines(package):
    long = [
        f"{path.relative_to(ROOT)}: {name} ({n} lines)"
        for path in sorted((ROOT / package).rglob("*.py"))
        for name, n in long_functions(path.read_text())
    ]
    assert long == []


def test_the_walk_counts_lines_and_finds_methods_and_nested_functions():
    body = "\n".join(["    x = 1"] * 59)  # with the def line: 60 lines
    assert long_functions(f"def f():\n{body}\n") == []
    assert long_functions(f"def f():\n{body}\n    x = 2\n") == [("f", 61)]
    method = f"class C:\n    async def m(self):\n    {body.replace(chr(10), chr(10) + '    ')}\n"
    assert long_functions(method + "        y = 2\n") == [("m", 61)]
    nested = f"def outer():\n    def inner():\n    {body.replace(chr(10), chr(10) + '    ')}\n"
    assert long_functions(nested + "        y = 2\n") == [("outer", 62), ("inner", 61)]

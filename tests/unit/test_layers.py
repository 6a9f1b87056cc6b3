"""The layers import only downward (docs/architecture.md): an ast walk over every module of
the five packages, function bodies included, and import-linter's contracts from pyproject."""

from __future__ import annotations

import ast
import functools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("topology", "tangram", "solvers", "managers", "evaluation")


def layer(module: str) -> int:
    top = module.split(".")[0]
    if top == "topology":
        return 0
    if top == "tangram":
        return 3 if module.startswith(("tangram.runtime", "tangram.adapters")) else 1
    if top in ("solvers", "managers"):
        return 2
    return 4  # evaluation


@functools.cache
def modules() -> dict[str, Path]:
    found = {}
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports(name: str, path: Path) -> list[tuple[str, int, bool, bool]]:
    """(target, line, inside a function, under TYPE_CHECKING) for each project import. The
    target of `from pkg import name` is the module `pkg.name` when there is one (a submodule
    imported by name), else `pkg`."""
    tree = ast.parse(path.read_text())
    in_function: set[int] = set()
    type_only: set[int] = set()
    lazy_getattr: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inner = {id(c) for c in ast.walk(node) if c is not node}
            in_function |= inner
            if node.name == "__getattr__" and name == "tangram":
                lazy_getattr |= inner
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            type_only |= {id(c) for c in ast.walk(node)}
    base = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if id(node) in lazy_getattr:
            continue
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parent = ".".join(base.split(".")[: len(base.split(".")) - node.level + 1])
                source = f"{parent}.{node.module}" if node.module else parent
            else:
                source = node.module or ""
            named = [f"{source}.{a.name}" for a in node.names]
            targets = list(dict.fromkeys(n if n in modules() else source for n in named))
        else:
            continue
        for t in targets:
            if t.split(".")[0] in PACKAGES:
                out.append((t, node.lineno, id(node) in in_function, id(node) in type_only))
    return out


def test_no_import_goes_up_or_sideways():
    bad = []
    for name, path in modules().items():
        for target, line, _, type_only in imports(name, path):
            lo, lt = layer(name), layer(target)
            sideways = lo == lt == 2 and name.split(".")[0] != target.split(".")[0]
            if not type_only and (lt > lo or sideways):
                bad.append(f"{name}:{line} imports {target}")
    assert not bad, "\n".join(bad)


def test_no_function_local_import_of_a_project_module():
    bad = [
        f"{name}:{line} imports {target} inside a function"
        for name, path in modules().items()
        for target, line, local, _ in imports(name, path)
        if local
    ]
    assert not bad, "\n".join(bad)


def test_the_torch_modules_import_without_torch():
    """torch is imported on first use inside them, so callers import them at their top."""
    code = (
        "import sys; import managers.gpu.torch_backend, managers.gpu.tinylm; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr


def test_no_import_circle():
    """Imports under `if TYPE_CHECKING:` count: a circle of type-only imports is still two
    modules that each need the other to be read."""
    mods = modules()
    graph = {n: {t for t, _, _, _ in imports(n, p) if t in mods} for n, p in mods.items()}
    # a package importing its own submodules is not a circle; a submodule importing its package
    # back (or any longer loop) is
    state: dict[str, int] = {}
    cycles = []

    def visit(n: str, stack: list[str]) -> None:
        state[n] = 1
        for t in graph.get(n, ()):
            if t == n or t.startswith(n + "."):
                continue
            if state.get(t) == 1:
                cycles.append(stack[stack.index(t) :] + [t] if t in stack else [n, t])
            elif t not in state:
                visit(t, stack + [t])
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n, [n])
    assert not cycles, cycles


def test_importing_the_core_loads_no_higher_layer():
    code = (
        "import sys, tangram, tangram.scheduler, tangram.instance;"
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('solvers', 'managers', 'evaluation') or m.startswith('tangram.runtime')];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_import_linter_contracts_hold():
    lint = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    if not Path(lint).exists():
        pytest.skip("import-linter is not installed (pip install -e '.[test]')")
    proc = subprocess.run([lint, "--no-cache"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


def test_every_core_module_is_under_the_core_contract():
    import tomllib

    doc = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contract = next(
        c
        for c in doc["tool"]["importlinter"]["contracts"]
        if c["name"].startswith("the tangram core")
    )
    core = {
        n
        for n in modules()
        if n.startswith("tangram.") and not n.startswith(("tangram.runtime", "tangram.adapters"))
    }
    assert core <= set(contract["source_modules"]), sorted(core - set(contract["source_modules"]))

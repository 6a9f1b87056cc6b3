"""One registry mechanism for every family (`tangram.registry.Registry`): built-ins from lazy
tables, third parties' from entry points, run-time ones from `register`; and a plain source
checkout, with no installed metadata at all, still finds the default policy, every built-in
backend and the runtime's commands."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from managers.cpu.backends import BACKENDS as CPU_BACKENDS
from managers.gpu.backend import BACKENDS as GPU_BACKENDS
from solvers.registry import POLICIES
from tangram.registry import Registry
from tangram.runtime.cli import COMMANDS
from tangram.runtime.config import DEFAULT_POLICY

ROOT = Path(__file__).resolve().parents[2]


def test_lookup_order_and_laziness():
    r: Registry[object] = Registry("thing", {"path": "json:dumps", "nested": "os:path.join"})
    assert r.names() == ["nested", "path"] and "path" in r and "nope" not in r
    assert r.module_of("path") == "json"
    import json
    import os

    assert r.get("path") is json.dumps and r.get("nested") is os.path.join
    assert r.get("nope") is None
    marker = object()
    r.register("made", marker)
    assert r.get("made") is marker and r.names() == ["made", "nested", "path"]
    r.register("made", marker)  # the same object again is no conflict
    with pytest.raises(ValueError, match="registered twice"):
        r.register("made", object())
    with pytest.raises(ValueError, match="not 'module:attribute'"):
        Registry("thing", {"bad": "json.dumps"})


def test_a_missing_module_is_an_import_error_at_lookup_not_at_declaration():
    r: Registry[object] = Registry("thing", {"gone": "tangram_no_such_module:x"})
    assert "gone" in r
    with pytest.raises(ImportError):
        r.get("gone")


@pytest.mark.parametrize("registry", [POLICIES, CPU_BACKENDS, GPU_BACKENDS, COMMANDS])
def test_every_builtin_path_resolves(registry):
    for name in registry.builtin_names():
        if name == "torch":
            pytest.importorskip("torch")
        assert registry.get(name) is not None, name


def _site_without_this_distribution(tmp_path: Path) -> Path:
    """The interpreter's site-packages as links, less this project's installed metadata and
    editable finder: what a user who only cloned the tree has (plus the dependencies)."""
    site = Path(sysconfig.get_paths()["purelib"])
    fake = tmp_path / "site"
    fake.mkdir()
    for entry in site.iterdir():
        if entry.name.startswith(("arl_tangram", "__editable__")) or entry.suffix == ".pth":
            continue
        (fake / entry.name).symlink_to(entry)
    return fake


def test_a_source_checkout_without_metadata_finds_the_builtins(tmp_path):
    code = textwrap.dedent(f"""
        import importlib.metadata as md
        assert not list(md.entry_points(group="tangram.policies")), "metadata is visible"
        from solvers.registry import get_allocator, runtime_policies
        from managers.cpu.backends import create
        from managers.gpu.backend import create_backend
        from tangram.runtime.cli import commands
        assert {DEFAULT_POLICY!r} in runtime_policies(), runtime_policies()
        print(type(get_allocator({DEFAULT_POLICY!r})).__name__)
        print(create("sim").name, create_backend("sim").name)
        print(",".join(commands()))
    """)
    fake = _site_without_this_distribution(tmp_path)
    tree = tmp_path / "checkout"  # the packages only: an editable install leaves its
    tree.mkdir()  # *.egg-info in the source tree, which would be metadata
    for package in ("tangram", "solvers", "managers", "topology", "evaluation"):
        (tree / package).symlink_to(ROOT / package)
    done = subprocess.run(
        [sys.executable, "-S", "-c", code],
        cwd=tmp_path,
        text=True,
        capture_output=True,
        timeout=120,
        env={"PYTHONPATH": f"{tree}:{fake}", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    allocator, backends, commands = done.stdout.split("\n")[:3]
    assert allocator == "BackfillSrptAllocator"
    assert backends == "sim sim"
    assert {"serve", "image"} <= set(commands.split(","))


def test_a_third_party_plugin_is_found_through_its_entry_point(tmp_path):
    """An installed distribution's entry points (here a dist-info folder on the path) add a
    policy and a CPU backend without any code of ours naming them."""
    dist = tmp_path / "tangram_plugin_demo-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: tangram-plugin-demo\nVersion: 0.1\n"
    )
    (dist / "entry_points.txt").write_text(
        "[tangram.policies]\nmine = plugin_demo:Mine\n\n"
        "[tangram.cpu_backends]\nnull = plugin_demo:Null\n"
    )
    (tmp_path / "plugin_demo.py").write_text(
        textwrap.dedent("""
        from dataclasses import dataclass
        from managers.cpu.backends.sim import SimCpuBackend
        from solvers.minimal import MinAllocator

        @dataclass(frozen=True)
        class Mine(MinAllocator):
            knob: int = 1

        class Null(SimCpuBackend):
            name = "null"
    """)
    )
    code = (
        "from solvers.registry import get_allocator, available, runtime_policies\n"
        "from managers.cpu.backends import create\n"
        "a = get_allocator('mine', knob=3)\n"
        "assert a.knob == 3 and 'mine' in available() and 'mine' not in runtime_policies()\n"
        "print(type(a).__name__, create('null').name)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        text=True,
        capture_output=True,
        timeout=120,
        env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["Mine", "null"]

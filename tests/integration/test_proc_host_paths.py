"""Nothing of the host in a sandbox's /proc (issue 36 item 5): from inside every kind of bwrap
environment (plain, through the spawner and through nsenter; disk-bounded; from an image; a
fork child), the mount tables, cgroup paths, environments and command lines of every process it
can see name no host path the server knows (its state folder, work root, support folder,
layers, virtual environment, Python installation, home) and not the server's PID; a
sandbox's cgroup paths never climb above its own cgroup namespace (`..`)."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from managers.cpu import CpuManager
from managers.cpu.backends.bwrap.backend import BwrapBackend
from managers.cpu.backends.cgroup import fs
from managers.cpu.build import build
from managers.cpu.images import ImageStore
from managers.cpu.layers import LayerStore, unmount_below
from managers.cpu.request import ExecRequest

FILES = ("mountinfo", "mounts", "mountstats", "cgroup", "environ", "cmdline")
# every file of every process the command can see, each after a header line
PROBE = (
    "for p in /proc/self /proc/[0-9]*; do for f in " + " ".join(FILES) + "; do "
    "printf '\\n== %s/%s\\n' $p $f; cat $p/$f 2>/dev/null; done; done"
)
SYSTEM = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
WHY_NOT = BwrapBackend.probe()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=f"needs a bwrap sandbox: {WHY_NOT}")


def _layers_why_not() -> str | None:
    with tempfile.TemporaryDirectory() as d:
        return LayerStore(d).why_not


@pytest.fixture(scope="module")
def state() -> Path:
    d = Path(tempfile.mkdtemp(prefix="tangram-proc-test."))
    os.chmod(d, 0o755)
    if _layers_why_not() is None:
        build(ImageStore(d / "images"), "tools", [{"host": {"programs": ["sh", "cat"]}}])
    yield d
    unmount_below(d)
    shutil.rmtree(d, ignore_errors=True)


def host_paths(m: CpuManager, state: Path) -> dict[str, str]:
    """Every host folder the server knows, by what it is (system folders, which every
    sandbox sees at their own paths, left out)."""
    known = {
        "state folder": state,
        "layers folder": state / "layers",
        "support folder": m.backend.support,
        "virtual environment": sys.prefix,
        "Python installation": sys.base_prefix,
        "the Python's folder": os.path.dirname(os.path.realpath(sys.executable)),
        "home": os.environ.get("HOME", "/"),
    }
    paths = {}
    for what, p in known.items():
        for form in (os.path.normpath(str(p)), os.path.realpath(p)):
            if form != "/" and not form.startswith(tuple(s + "/" for s in SYSTEM)):
                paths[form] = what
    return paths


def leaks(text: str, paths: dict[str, str], work_root: str) -> list[str]:
    """What of the host `text` names: a known folder (as a whole path component sequence), a
    path below the work root (the sandbox's own /tmp is itself, not the host's), the PID."""
    edge = r"(?<![\w.@+~-])"  # not in the middle of a name or a longer path
    found = []
    for p, what in paths.items():
        if re.search(edge + re.escape(p) + r"(?![\w.@+~-])", text):
            found.append(f"{what} {p}")
    for root in {os.path.normpath(work_root), os.path.realpath(work_root)}:
        if re.search(edge + re.escape(root.rstrip("/") + "/") + r"\w", text):
            found.append(f"work root {root}")
    if re.search(rf"(?<![0-9A-Za-z]){os.getpid()}(?![0-9A-Za-z])", text):
        found.append(f"the server's PID {os.getpid()}")
    return found


def sections(out: str) -> dict[str, str]:
    """The probe's output by file (`/proc/<pid>/<file>`)."""
    parts = re.split(r"\n== (\S+)\n", "\n" + out)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def host_side(m: CpuManager, env_id: str) -> dict[str, str]:
    """The environment and command line of every process in the environment's cgroups (its
    sandbox's init, spawner or holder: unreadable from inside), read on the host."""
    pids = set()
    for folder in m.backend.folders(env_id):
        for procs in folder.rglob("cgroup.procs"):
            pids.update(int(p) for p in procs.read_text().split())
    seen = {}
    for pid in pids:
        for f in ("environ", "cmdline"):
            try:
                seen[f"host /proc/{pid}/{f}"] = Path(f"/proc/{pid}/{f}").read_bytes().decode()
            except OSError:
                continue  # exited meanwhile
    return seen


async def check(m: CpuManager, env: str, state: Path) -> None:
    r = await m.execute(ExecRequest(env, PROBE, timeout=60))
    assert r.exit_code == 0, r
    seen = sections(r.stdout)
    # the probe read what it should (so that nothing passes for want of reading)
    assert " /sandbox " in seen["/proc/self/mountinfo"], seen["/proc/self/mountinfo"]
    assert "TANGRAM_ENV_ID=" in seen["/proc/self/environ"]
    assert len([k for k in seen if k.endswith("/cgroup") and seen[k].strip()]) >= 2
    seen.update(host_side(m, env))
    paths = host_paths(m, state)
    found = {k: got for k, v in seen.items() if (got := leaks(v, paths, m.workdir_root))}
    assert found == {}, "\n".join(f"{k}: {v}\n{seen[k][:3000]}" for k, v in found.items())
    if fs.detect("probe").version == 1:  # (v2: see the backend's docstring)
        climbing = {
            k: v for k, v in seen.items() if k.endswith("/cgroup") and re.search(r":/\.\.(/|$)", v)
        }
        assert climbing == {}, climbing


def run(coro):
    return asyncio.run(coro)


@pytest.mark.parametrize("spawner", [True, False], ids=["spawner", "nsenter"])
def test_a_plain_sandbox_sees_no_host_path_in_proc(state: Path, spawner: bool) -> None:
    async def go():
        m = CpuManager(BwrapBackend(spawner=spawner), state_dir=str(state))
        await m.start()
        try:
            env = await m.open_env("proc-plain", 128)
            assert m.sandbox(env).spawned is spawner
            await check(m, env, state)
        finally:
            await m.close()

    run(go())


@pytest.mark.skipif(_layers_why_not() is not None, reason="needs overlayfs and loop devices")
def test_disk_image_and_fork_sandboxes_see_no_host_path_in_proc(state: Path) -> None:
    async def go():
        m = CpuManager("bwrap", state_dir=str(state))
        await m.start()
        try:
            disk = await m.open_env("proc-disk", 128, disk_mb=64)
            await check(m, disk, state)
            image = await m.open_env("proc-image", 128, image="tools", disk_mb=32)
            await check(m, image, state)
            (child,) = await m.fork_env(image, ["proc-child"])
            await check(m, child, state)
            await check(m, image, state)  # the parent after its fork
        finally:
            await m.close()

    run(go())

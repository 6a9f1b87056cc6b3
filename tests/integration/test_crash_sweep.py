"""A server SIGKILLed with commands running leaves cgroups, work folders and (without bwrap's
die-with-parent) processes; the next manager on the machine sweeps them before serving."""

from __future__ import annotations

import asyncio
import logging
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from managers.cpu import CpuManager
from managers.cpu.backends.bwrap.backend import BwrapBackend
from managers.cpu.backends.cgroup import fs
from managers.cpu.backends.cgroup.backend import CgroupBackend
from managers.cpu.backends.sim import SimCpuBackend
from managers.cpu.leftovers import dead_owner, owned_name, server_tag, sweep_workdirs
from topology import CpuNode

SERVER = """
import asyncio, sys
from tangram import Tangram

async def main():
    async with Tangram.local(cpu_backend=sys.argv[1]) as tg:
        envs = [await tg.open_env(f"crash-{i}", memory_mb=64) for i in range(2)]
        cmd = f"setsid sleep {sys.argv[2]} & sleep {sys.argv[2]}"
        runs = [asyncio.ensure_future(tg.exec(e, cmd, timeout=600)) for e in envs]
        await asyncio.sleep(1.5)
        print("ready", flush=True)
        await asyncio.gather(*runs)

asyncio.run(main())
"""


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def owned_by(pid: int, workdir_root: Path) -> list[Path]:
    """The cgroup folders and work folders named for server `pid`."""
    parents = {b.parent for b in fs.detect("probe").bases.values()} | {workdir_root}
    return [
        p
        for parent in parents
        if parent.is_dir()
        for p in parent.iterdir()
        if p.name.startswith(owned_name("", pid))
    ]


def wait_ready(proc: subprocess.Popen, timeout: float) -> None:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    line = proc.stdout.readline() if ready else ""
    if line.strip() != "ready":
        proc.kill()
        raise AssertionError(
            f"the server did not get ready: {line!r} {proc.stderr.read() if proc.stderr else ''}"
        )


@pytest.mark.cgroup
@pytest.mark.parametrize("backend", ["bwrap", "cgroup"])
def test_restart_after_sigkill_leaves_nothing(backend, tmp_path, procs_with):
    why = (BwrapBackend if backend == "bwrap" else CgroupBackend).probe()
    if why is not None:
        pytest.skip(f"{backend} backend unavailable: {why}")
    marker = f"{400 + uuid.uuid4().int % 500}.{uuid.uuid4().int % 10**6}"
    root = Path(tempfile.gettempdir())
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, backend, marker],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    try:
        wait_ready(proc, 60)
        assert len(procs_with(f"sleep\0{marker}")) >= 2
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        left = owned_by(proc.pid, root)
        assert left, "a SIGKILLed server leaves its cgroups and work folders"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    async def restart() -> None:
        m = CpuManager(backend)  # sweeps before it serves
        await m.start()
        await m.close()

    asyncio.run(restart())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and (
        owned_by(proc.pid, root) or procs_with(f"sleep\0{marker}")
    ):
        time.sleep(0.1)
    assert owned_by(proc.pid, root) == []
    assert procs_with(f"sleep\0{marker}") == []


def test_sweep_removes_only_dead_servers_folders_and_logs_it(tmp_path, caplog):
    dead, alive = dead_pid(), os.getpid()
    (tmp_path / f"tangram-{dead}-env-abc").mkdir()
    (tmp_path / f"tangram-{dead}-env-abc" / "f").write_text("x")
    (tmp_path / f"tangram-{alive}-env-def").mkdir()
    (tmp_path / "tangram-test-folder").mkdir()
    # today's names: the tag seals the PID (root) or is the PID; a forged seal is no one's
    (tmp_path / owned_name("env-ghi", dead)).mkdir()
    (tmp_path / owned_name("env-jkl", alive)).mkdir()
    forged = f"tangram-x{'0' * 10}-env-mno"
    (tmp_path / forged).mkdir()
    assert str(dead) not in server_tag(dead) or os.geteuid() != 0
    assert dead_owner(f"tangram-{dead}-env-abc") == dead
    assert dead_owner(owned_name("env-ghi", dead)) == dead
    assert dead_owner(f"tangram-{alive}-env-def") is None
    assert dead_owner(owned_name("env-jkl", alive)) is None and dead_owner(forged) is None
    assert dead_owner("tangram-test-folder") is None and dead_owner("other") is None
    with caplog.at_level(logging.WARNING, logger="managers.cpu.manager"):
        m = CpuManager(
            SimCpuBackend(),
            nodes={"n": CpuNode.flat("n", 2)},
            memory_mb={"n": 64},
            workdir_root=str(tmp_path),
        )
        asyncio.run(m.start())
    assert sorted(m.swept) == sorted(
        f"{tmp_path / name} (server pid {dead})"
        for name in (f"tangram-{dead}-env-abc", owned_name("env-ghi", dead))
    )
    assert any(f"server pid {dead}" in r.getMessage() for r in caplog.records)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"tangram-{alive}-env-def", owned_name("env-jkl", alive), forged, "tangram-test-folder"]
    )
    assert sweep_workdirs(tmp_path / "missing") == []

"""The affinity and sim backends, automatic selection, node choice and `backend unavailable`."""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid

import pytest

from managers.cpu import CpuManager, EnvironmentTable, ExecRequest
from managers.cpu.backends import started
from managers.cpu.backends.bwrap.backend import BwrapBackend
from managers.cpu.backends.sim import SimCpuBackend
from tangram.errors import BackendUnavailable, Infeasible, ValidationError
from tangram.pools import CorePool
from topology import CpuNode


def alive(pid: int) -> bool:
    """Running (not gone, not a zombie awaiting its reaper), allowing a moment to die."""
    for _ in range(100):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in "ZX":
                    return False
        except FileNotFoundError:
            return False
        time.sleep(0.01)
    return True


def test_affinity_backend_pins_and_kills():
    async def go():
        m = CpuManager("affinity")
        await m.start()
        try:
            env = await m.open_env("t", 64)
            o = await m.execute(ExecRequest(env, "sh -c 'cat /proc/self/status'"), cores=1)
            line = next(ln for ln in o.stdout.splitlines() if ln.startswith("Cpus_allowed_list"))
            assert line.split(":")[1].strip() == "0"
            o = await m.execute(ExecRequest(env, ("no-such-command-xyz",)))
            assert (o.status, o.exit_code) == ("error", 127)
            o = await m.execute(ExecRequest(env, "sleep 30 & echo $!; sleep 30", timeout=0.3))
            assert o.status == "timeout" and not alive(int(o.stdout))
            workdir = m.envs.get(env).workdir
        finally:
            await m.close()
        assert not os.path.exists(workdir)

    asyncio.run(go())


def test_auto_selection_logs_its_choice(caplog: pytest.LogCaptureFixture):
    async def go():
        with caplog.at_level(logging.INFO, logger="managers.cpu"):
            m = CpuManager("auto")
            await m.start()
        await m.close()
        return m.backend.name

    name = asyncio.run(go())
    assert any(f"cpu backend: {name}" in r.getMessage() for r in caplog.records)
    if os.geteuid() != 0:
        expected = "affinity"
    else:
        expected = "bwrap" if BwrapBackend.probe() is None else "cgroup"
    assert name in (expected, "docker")


def test_cgroup_without_root_names_the_fix():
    """A real unprivileged process asks for the cgroup backend."""
    if os.geteuid() != 0:
        pytest.skip("needs root to drop privileges for the check")
    from managers.cpu.backends.cgroup.backend import (
        CgroupBackend,  # imported before privileges drop
    )

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: an ordinary user
        try:
            os.setgid(65534)
            os.setuid(65534)
            try:
                asyncio.run(CpuManager("cgroup").start())
                msg = "started"
            except Exception as exc:
                msg = f"{type(exc).__name__} {exc}"
            auto = CpuManager("auto")  # falls back to what an ordinary user can run
            asyncio.run(auto.start())
            asyncio.run(auto.close())
            os.write(write, f"{auto.backend.name}|{msg}".encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        text = f.read()
    os.waitpid(pid, 0)
    assert CgroupBackend.probe() is None  # root here: available
    auto, text = text.split("|", 1)
    assert auto == "affinity"
    assert text.startswith("BackendUnavailable"), text
    assert "needs root" in text and "backend='affinity'" in text


def test_docker_engine_missing_says_how_to_fix():
    from managers.cpu.backends.docker import DockerBackend

    with pytest.raises(BackendUnavailable, match="start dockerd.*backend='cgroup'"):
        asyncio.run(DockerBackend(base_url="unix:///nonexistent/docker.sock").start())
    with pytest.raises(BackendUnavailable, match="start dockerd"):  # through the registry
        asyncio.run(started("docker", base_url="unix:///nonexistent/docker.sock"))


def test_unknown_backend_is_a_validation_error():
    with pytest.raises(ValidationError, match="cpu.backend"):
        CpuManager("kubernetes")


def test_sim_environments_balance_memory_and_bind_nodes():
    async def go():
        nodes = {f"n{i}": CpuNode.flat(f"n{i}", 4) for i in range(3)}
        m = CpuManager(
            SimCpuBackend(duration=lambda cmd, k: 8.0 / k),
            nodes=nodes,
            memory_mb={"n0": 1000, "n1": 1000, "n2": 1000},
        )
        await m.start()
        envs = [await m.open_env(f"traj{i}", 300) for i in range(6)]
        placed = [m.envs.get(e).node for e in envs]
        assert sorted(placed) == ["n0", "n0", "n1", "n1", "n2", "n2"]  # memory balanced
        assert m.binding("traj0") == placed[0] and m.binding("nobody") is None
        assert m.bindings()[("traj3", "cpu")] == placed[3]
        with pytest.raises(Infeasible, match="memory_mb"):
            await m.open_env("big", 500)
        with pytest.raises(ValidationError, match="already has environment"):
            await m.open_env("traj0", 10)
        o = await m.execute(ExecRequest(envs[0], "pytest -q", elastic=True), cores=4)
        assert o.status == "ok" and m.backend.execs[-1] == (
            envs[0],
            (0, 1, 2, 3),
            "pytest -q",
        )  # never rewritten
        o = await m.execute(ExecRequest(envs[0], "x", timeout=1.0), cores=2)
        assert o.status == "timeout"
        await m.close_env(envs[0])
        assert m.binding("traj0") is None and m.envs.memory_free(placed[0]) == 700
        await m.close()

    asyncio.run(go())


def test_node_choice_prefers_free_cores_now():
    pool = CorePool("cpu", {"a": CpuNode.flat("a", 2), "b": CpuNode.flat("b", 2)})
    table = EnvironmentTable({"a": 1000, "b": 4000})
    pool.place(2, node="b")  # b is less loaded by memory but has no free core now
    assert table.choose_node(pool, 100, min_cores=1) == "a"
    assert table.choose_node(pool, 2000, min_cores=1) == "b"  # only b has the memory


@pytest.mark.parametrize(
    "kw,field",
    [
        ({"command": ""}, "exec.command"),
        ({"command": ()}, "exec.command"),
        ({"timeout": 0}, "exec.timeout"),
        ({"output_cap": -1}, "exec.output_cap"),
        ({"env_id": ""}, "exec.env_id"),
    ],
)
def test_exec_request_validation_names_the_field(kw, field):
    args = {"env_id": "e", "command": "true", **kw}
    with pytest.raises(ValidationError, match=field):
        ExecRequest(**args)


def test_unknown_environment_and_wrong_payload_fail_clearly():
    async def go():
        m = CpuManager(SimCpuBackend(), nodes={"n": CpuNode.flat("n", 2)}, memory_mb={"n": 100})
        await m.start()
        o = await m.execute(ExecRequest(f"env-{uuid.uuid4().hex[:4]}", "true"))
        assert o.status == "failed" and "no open environment" in o.detail
        await m.close()

    asyncio.run(go())


class SlowCloseSim(SimCpuBackend):
    async def _close(self, env):
        await asyncio.sleep(0.02)  # a real backend awaits its teardown (cgroups, containers)
        await super()._close(env)


def test_two_closes_of_one_environment_at_once_both_succeed():
    async def go():
        m = CpuManager(SlowCloseSim(), nodes={"n": CpuNode.flat("n", 2)}, memory_mb={"n": 100})
        await m.start()
        env = await m.open_env("t", 50)
        await asyncio.gather(m.close_env(env), m.close_env(env), m.close())
        return m

    m = asyncio.run(go())
    assert m.envs.all() == [] and m.envs.memory_free("n") == 100

"""The cgroup backend against real cgroups (root): confinement, enforcement, faults, no leaks."""

from __future__ import annotations

import asyncio
import os
import time
import uuid

import pytest

from managers.cpu import CpuManager, ExecRequest
from managers.cpu.backends.cgroup import fs
from managers.cpu.backends.cgroup.backend import CgroupBackend
from managers.cpu.environments import EnvState
from tangram.actions import Action
from tangram.allocation import Assignment
from tangram.pools import Placement

pytestmark = [pytest.mark.cgroup, pytest.mark.usefixtures("need_cgroup")]
BUSY2 = "while :; do :; done & while :; do :; done & wait"


def allowed(stdout: str) -> set[int]:
    line = next(ln for ln in stdout.splitlines() if ln.startswith("Cpus_allowed_list"))
    return set(fs_cores(line.split(":", 1)[1]))


def fs_cores(text: str) -> list[int]:
    from topology.discovery import parse_cpulist

    return parse_cpulist(text.strip())


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


async def run_on(m: CpuManager, env_id: str, cores: tuple[int, ...], command, **kw):
    """Run as the scheduler would: take exactly `cores`, run, release."""
    env = m.envs.get(env_id)
    placement = Placement(env.node, cores=cores)
    m.pool.take(placement, len(cores))
    action = Action(
        f"a-{uuid.uuid4().hex[:6]}",
        {"cpu": len(cores)},
        trajectory=env.trajectory,
        payload=ExecRequest(env_id, command, **kw),
    )
    try:
        return await m.run(Assignment(action, {"cpu": len(cores)}, {"cpu": placement}))
    finally:
        m.pool.release(placement, len(cores))


@pytest.fixture
async def mgr():
    m = CpuManager("cgroup")
    await m.start()
    yield m
    await m.close()


def test_exec_runs_on_exactly_the_granted_cores():
    async def go():
        m = CpuManager("cgroup")
        await m.start()
        try:
            env = await m.open_env(f"t-{uuid.uuid4().hex[:6]}", 128)
            last = max(m.pool.cpu_node(m.envs.get(env).node).domain_of)
            # a grandchild sees the same mask: the whole tree is confined
            o = await run_on(m, env, (last,), "sh -c 'cat /proc/self/status'")
            assert o.status == "ok", o
            assert allowed(o.stdout) == {last}
            backend = m.backend
            assert isinstance(backend, CgroupBackend)
            slot = m.sandbox(env).cgroups.slots[0]
            assert fs.read(slot.folders["cpuset"] / "cpuset.cpus") == str(last)
            if backend.h.version == 1:
                assert fs.read(slot.folders["cpu"] / "cpu.cfs_quota_us") == str(fs.PERIOD_US)
                limit = fs.read(m.sandbox(env).cgroups.folders["memory"] / "memory.limit_in_bytes")
                assert int(limit) == 128 << 20
        finally:
            await m.close()

    asyncio.run(go())


def _rate(m: CpuManager, env: str, cores: tuple[int, ...]) -> tuple[float, list[float]]:
    """Core-seconds per second used by two busy processes granted `cores` for 2 s, and the
    seconds each CPU gave them (v1 cpuacct.usage_percpu; empty on v2)."""
    backend = m.backend
    acct = backend._env_folders(env)["cpuacct"] / "cpuacct.usage_percpu"

    def percpu() -> list[float]:
        return [int(x) / 1e9 for x in fs.read(acct).split()] if acct.exists() else []

    async def go():
        before, cpus, t0 = backend.cpu_seconds(env), percpu(), time.monotonic()
        o = await run_on(m, env, cores, BUSY2, timeout=2.0)
        wall = time.monotonic() - t0
        assert o.status == "timeout", o
        used = [b - a for a, b in zip(cpus, percpu())]
        return (backend.cpu_seconds(env) - before) / wall, used

    return asyncio.run(go())


def favour(backend: CgroupBackend, env: str) -> None:
    """Give the environment the largest CPU weight, so that other work on this machine (other
    tests, other users) does not crowd the measurement out: the quota alone must cap it."""
    folders = [backend.h.base("cpu"), backend._env_folders(env)["cpu"]]
    for f in folders:
        if backend.h.version == 1:
            fs.write(f / "cpu.shares", "262144")
        else:
            fs.write(f / "cpu.weight", "10000")


def test_enforcement_one_core_then_two():
    """Two busy processes: 1 granted core caps them at ~1 core-second per second (cpuacct) and
    only that CPU runs them; 2 cores: they get clearly more than one core gives (other work shares
    this machine and CFS need not move them onto a busy CPU, so the 2-core run is retried)."""
    m = CpuManager("cgroup")
    asyncio.run(m.start())
    try:
        env = asyncio.run(m.open_env(f"t-{uuid.uuid4().hex[:6]}", 128))
        favour(m.backend, env)
        cores = tuple(sorted(m.pool.cpu_node(m.envs.get(env).node).domain_of))[:2]
        if len(cores) < 2:
            pytest.skip("this machine has one core")
        one, per_cpu = _rate(m, env, (cores[1],))
        assert one <= 1.1, f"1 granted core used {one:.2f} core-s/s"
        if per_cpu:
            assert per_cpu[cores[0]] < 0.05 * sum(per_cpu), per_cpu
        best = 0.0
        for _ in range(3):
            two, _ = _rate(m, env, cores)
            best = max(best, two)
            if best > 1.6 * one:
                break
        print(f"1 core: {one:.2f} core-s/s, 2 cores: {best:.2f} core-s/s")
        assert best > 1.25 * one, f"2 cores: {best:.2f}, 1 core: {one:.2f}"
    finally:
        asyncio.run(m.close())


def test_faults_come_back_as_outcomes_and_kill_the_tree():
    async def go():
        m = CpuManager("cgroup")
        await m.start()
        try:
            env = await m.open_env(f"t-{uuid.uuid4().hex[:6]}", 128)
            o = await run_on(m, env, (0,), ("no-such-command-xyz", "arg"))
            assert (o.status, o.exit_code) == ("error", 127) and "not found" in o.detail
            o = await run_on(m, env, (0,), "echo partial; exit 3")
            assert (o.status, o.exit_code, o.stdout) == ("error", 3, "partial\n")
            # timeout: the command, its child and a child that left the session all die
            o = await run_on(
                m, env, (0,), "sleep 30 & echo $!; setsid sleep 31 & echo $!; sleep 32", timeout=0.5
            )
            assert o.status == "timeout" and "timeout" in o.detail, o
            pids = [int(p) for p in o.stdout.split()]
            assert len(pids) == 2 and not any(alive(p) for p in pids)
            # a background process left behind by a finished command does not keep the cores
            o = await run_on(m, env, (0,), "sleep 30 & echo $!")
            assert o.status == "ok" and not alive(int(o.stdout))
            # output flood: capped, drained, reported
            o = await run_on(m, env, (0,), "yes | head -c 3000000", output_cap=65536)
            assert o.status == "ok" and o.truncated and len(o.stdout) == 65536
            assert "truncated" in o.detail
            o = await run_on(m, env, (0,), "yes", timeout=0.5, output_cap=1024)
            assert o.status == "timeout" and o.truncated and len(o.stdout) == 1024
            # the cores of every failed exec came back
            assert m.pool.free() == m.pool.capacity()
        finally:
            await m.close()

    asyncio.run(go())


def test_concurrent_execs_of_one_environment_are_confined_separately():
    async def go():
        m = CpuManager("cgroup")
        await m.start()
        try:
            env = await m.open_env(f"t-{uuid.uuid4().hex[:6]}", 128)
            cores = sorted(m.pool.cpu_node(m.envs.get(env).node).domain_of)[:2]
            if len(cores) < 2:
                pytest.skip("this machine has one core")
            a, b = await asyncio.gather(
                *(run_on(m, env, (c,), "cat /proc/self/status; sleep 0.3") for c in cores)
            )
            assert (allowed(a.stdout), allowed(b.stdout)) == ({cores[0]}, {cores[1]})
            assert len(m.sandbox(env).cgroups.slots) == 2
        finally:
            await m.close()

    asyncio.run(go())


def test_elastic_pytest_gets_its_granted_cores_without_a_rewrite():
    async def go():
        m = CpuManager("cgroup")
        await m.start()
        try:
            env = await m.open_env(f"t-{uuid.uuid4().hex[:6]}", 128)
            fake = (
                'pytest() { echo "pytest $* $TANGRAM_CPUS $PYTEST_XDIST_AUTO_NUM_WORKERS '
                '${PYTEST_PLUGINS:-none}"; }; pytest -q tests; echo "run pytest now"'
            )
            n = m.pool.capacity()
            o = await m.execute(ExecRequest(env, fake, elastic=True), cores=n)
            assert o.stdout.splitlines() == [
                f"pytest -q tests {n} {n} tangram_pytest_grant",
                "run pytest now",
            ]
            o = await m.execute(ExecRequest(env, fake), cores=1)
            assert o.stdout.splitlines() == ["pytest -q tests 1 1 none", "run pytest now"]
        finally:
            await m.close()

    asyncio.run(go())


def test_removed_cgroup_marks_the_environment_broken():
    async def go():
        m = CpuManager("cgroup")
        await m.start()
        try:
            env = await m.open_env(f"t-{uuid.uuid4().hex[:6]}", 128)
            assert (await m.execute(ExecRequest(env, "true"))).status == "ok"
            m.backend._remove(m.backend._env_folders(env))  # someone deletes the cgroup
            o = await m.execute(ExecRequest(env, "true"))
            assert o.status == "failed" and "broken" in o.detail and env in o.detail
            assert m.envs.record(env).state is EnvState.BROKEN
            o = await m.execute(ExecRequest(env, "true"))
            assert o.status == "failed" and "broken" in o.detail
            assert m.pool.free() == m.pool.capacity()
        finally:
            await m.close()

    asyncio.run(go())


def test_nothing_is_left_after_close():
    async def go():
        m = CpuManager("cgroup")
        await m.start()
        backend = m.backend
        env = await m.open_env(f"t-{uuid.uuid4().hex[:6]}", 128)
        folders = backend.folders(env)
        workdir = m.envs.get(env).workdir
        assert all(f.is_dir() for f in folders) and os.path.isdir(workdir)
        # two concurrent execs (two slots), one still running when the environment closes
        task = asyncio.ensure_future(
            m.execute(ExecRequest(env, "sleep 30 & echo $!; sleep 30"), cores=1)
        )
        await m.execute(ExecRequest(env, "true"), cores=1)
        await asyncio.sleep(0.2)
        await m.close_env(env)
        outcome = await task
        assert outcome.status != "ok"
        assert not any(f.exists() for f in folders) and not os.path.exists(workdir)
        if outcome.stdout.strip():
            assert not alive(int(outcome.stdout.split()[0]))
        bases = backend.h.distinct()
        await m.close()
        assert not any(b.exists() for b in bases)

    asyncio.run(go())

"""The docker backend against a real engine (`.ci/dockerd.sh`): update, exec, enforcement, a
crashed container, and nothing left behind. Skipped, with the reason, where no engine runs."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import time
import uuid

import pytest

from managers.cpu import CpuManager, ExecRequest
from managers.cpu.backends.cgroup import fs
from managers.cpu.backends.docker import DockerBackend
from managers.cpu.environments import EnvState
from tangram.errors import BackendUnavailable

pytestmark = [pytest.mark.docker, pytest.mark.usefixtures("need_docker")]


def allowed(stdout: str) -> set[int]:
    from topology.discovery import parse_cpulist

    line = next(ln for ln in stdout.splitlines() if ln.startswith("Cpus_allowed_list"))
    return set(parse_cpulist(line.split(":", 1)[1].strip()))


async def open_docker(direct: bool = True) -> tuple[CpuManager, DockerBackend, str]:
    backend = DockerBackend(direct=direct)
    m = CpuManager(backend)
    await m.start()
    env = await m.open_env(f"t-{uuid.uuid4().hex[:6]}", 128)
    return m, backend, env


@pytest.mark.parametrize("direct", [True, False], ids=["cgroup-write", "container-update"])
def test_update_then_exec_confines_to_the_grant(direct: bool):
    async def go():
        m, backend, env = await open_docker(direct)
        try:
            cores = sorted(m.pool.cpu_node(m.envs.get(env).node).domain_of)
            for k in (1, len(cores)):
                o = await m.execute(ExecRequest(env, "cat /proc/self/status"), cores=k)
                assert o.status == "ok", o
                assert len(allowed(o.stdout)) == k
            attrs = backend.api.inspect_container(m.sandbox(env).id)["HostConfig"]
            if not direct:  # the engine's own record follows the grant
                assert attrs["CpusetCpus"] == fs.cpulist(tuple(cores))
                assert attrs["CpuQuota"] == len(cores) * fs.PERIOD_US
            assert attrs["Memory"] == 128 << 20
        finally:
            await m.close()

    asyncio.run(go())


def test_enforcement_one_core():
    async def go():
        m, backend, env = await open_docker()
        try:
            acct = m.sandbox(env).folders["cpuacct"] / "cpuacct.usage"
            before, t0 = int(fs.read(acct)), time.monotonic()
            o = await m.execute(
                ExecRequest(env, "while :; do :; done & while :; do :; done & wait", timeout=2.0),
                cores=1,
            )
            rate = (int(fs.read(acct)) - before) / 1e9 / (time.monotonic() - t0)
            assert o.status == "timeout", o
            assert rate <= 1.1, f"1 granted core used {rate:.2f} core-s/s"
            # the busy loops died with the exec: only the container's init is left
            left = fs.read(m.sandbox(env).folders["cpu"] / "cgroup.procs").split()
            assert left == [str(m.sandbox(env).init_pid)]
        finally:
            await m.close()

    asyncio.run(go())


def test_faults_in_the_container():
    async def go():
        m, _, env = await open_docker()
        try:
            o = await m.execute(ExecRequest(env, ("no-such-command-xyz",)))
            assert (o.status, o.exit_code) == ("error", 127) and "not found" in o.detail
            o = await m.execute(ExecRequest(env, "echo out; echo err >&2; exit 4"))
            assert (o.status, o.exit_code, o.stdout, o.stderr) == ("error", 4, "out\n", "err\n")
            o = await m.execute(ExecRequest(env, "yes | head -c 2000000", output_cap=4096))
            assert o.status == "ok" and o.truncated and len(o.stdout) == 4096
            o = await m.execute(ExecRequest(env, "sleep 30", timeout=0.5))
            assert o.status == "timeout"
            assert m.pool.free() == m.pool.capacity()
        finally:
            await m.close()

    asyncio.run(go())


def test_crashed_container_breaks_the_environment_clearly():
    async def go():
        m, backend, env = await open_docker()
        try:
            assert (await m.execute(ExecRequest(env, "true"))).status == "ok"
            backend.client.containers.get(m.sandbox(env).id).kill()
            o = await m.execute(ExecRequest(env, "true"))
            assert o.status == "failed", o
            assert "broken" in o.detail and "exited" in o.detail and env in o.detail
            assert m.envs.record(env).state is EnvState.BROKEN
            o = await m.execute(ExecRequest(env, "true"))
            assert o.status == "failed" and "broken" in o.detail
            assert m.pool.free() == m.pool.capacity()
            await m.close_env(env)
            assert backend.containers() == []
        finally:
            await m.close()

    asyncio.run(go())


def test_no_container_or_process_left_after_close():
    async def go():
        m, backend, env = await open_docker()
        try:
            env2 = await m.open_env(f"t-{uuid.uuid4().hex[:6]}", 64)
            assert len(backend.containers()) == 2
            o = await m.execute(ExecRequest(env, "sleep 30 & echo started"))
            assert o.status == "ok"
            left = fs.read(m.sandbox(env).folders["cpu"] / "cgroup.procs").split()
            assert left == [str(m.sandbox(env).init_pid)]  # the background sleep was killed
            await m.close_env(env)
            assert len(backend.containers()) == 1
        finally:
            await m.close()
        assert m.sandbox(env2) is None
        import docker

        client = docker.from_env()
        try:
            assert (
                client.containers.list(
                    all=True, filters={"label": f"tangram.backend={backend.tag}"}
                )
                == []
            )
        finally:
            client.close()

    asyncio.run(go())


def test_missing_image_says_how_to_fix():
    with pytest.raises(BackendUnavailable, match="docker-test-missing.*dockerd.sh"):
        asyncio.run(
            DockerBackend(image=f"docker-test-missing-{uuid.uuid4().hex[:6]}:latest").start()
        )


def test_container_is_hardened(monkeypatch):
    monkeypatch.setenv("TANGRAM_TOKEN", "server-secret")

    async def go():
        backend = DockerBackend(pids_max=30)
        m = CpuManager(backend)
        await m.start()
        try:
            env = await m.open_env(f"t-{uuid.uuid4().hex[:6]}", 128)
            status = await m.execute(ExecRequest(env, "cat /proc/self/status /proc/net/dev"))
            writes = await m.execute(
                ExecRequest(
                    env,
                    "echo x > /work/f && cat /work/f && echo y > /tmp/g && cat /tmp/g; "
                    "echo z > /etc/evil; echo z > /evil",
                )
            )
            seen = await m.execute(ExecRequest(env, "cat /proc/self/environ"))
            bomb = await m.execute(
                ExecRequest(
                    env,
                    "i=0; while [ $i -lt 100 ]; do sleep 20 & i=$((i+1)); done; wait",
                    timeout=20,
                )
            )
            name = m.sandbox(env).name
            attrs = backend.client.containers.get(name).attrs["HostConfig"]
            return status, writes, seen, bomb, attrs
        finally:
            await m.close()

    status, writes, seen, bomb, host = asyncio.run(go())
    lines = dict(ln.split(":", 1) for ln in status.stdout.splitlines() if ":" in ln)
    assert lines["Uid"].split()[0] != "0" and lines["CapEff"].strip() == "0000000000000000"
    assert lines["NoNewPrivs"].strip() == "1"
    assert "eth0" not in status.stdout  # network none: loopback only
    assert writes.stdout.split() == ["x", "y"] and writes.stderr.count("Read-only") == 2
    assert "server-secret" not in seen.stdout and "TANGRAM_ENV_ID=" in seen.stdout
    assert bomb.status == "error"
    assert host["CapDrop"] == ["ALL"] and host["ReadonlyRootfs"] is True
    assert host["PidsLimit"] == 30 and "no-new-privileges" in host["SecurityOpt"]
    assert host["NetworkMode"] == "none"


def test_dead_servers_containers_are_swept():
    async def go():
        backend = DockerBackend()
        await backend.start()
        dead = subprocess.Popen(["true"])
        dead.wait()
        c = backend.client.containers.run(
            backend.image,
            ["sleep", "1000"],
            detach=True,
            network_mode="none",
            labels={"tangram.server": f"{socket.gethostname()}/{dead.pid}"},
        )
        swept = backend.sweep()
        await backend.shutdown()
        return c.name, swept

    name, swept = asyncio.run(go())
    assert any(name in line and "server pid" in line for line in swept), swept

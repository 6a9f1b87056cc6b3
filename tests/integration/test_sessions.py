"""Shell sessions (managers/cpu/shells.py, managers/cpu/sessions/): a command's grant is the
session's cgroup's for the command alone (its cores before, during and after), a busy
background process gets no more than the allowance between commands, the background cores are
held from the pool while a session is open, a dead shell names itself and can be opened again,
bad input is refused naming the field, and nothing is left behind. Root and bwrap."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from managers.cpu import CpuManager, ExecRequest
from managers.cpu.backends.bwrap.backend import BwrapBackend
from managers.cpu.backends.cgroup import fs
from tangram.adapters import verl as adapter
from tangram.errors import ValidationError
from tangram.results import Status
from tangram.runtime.facade import Tangram
from tangram.runtime.ray import local_cluster
from topology import CpuNode

pytestmark = [pytest.mark.cgroup]


@pytest.fixture(scope="module", autouse=True)
def _bwrap() -> None:
    why = BwrapBackend.probe()
    if why is not None:
        pytest.skip(f"bwrap backend unavailable: {why}")


def _manager(**kw) -> CpuManager:
    nodes = {"local": CpuNode.flat("local", min(4, os.cpu_count() or 2))}
    return CpuManager("bwrap", nodes=nodes, memory_mb={"local": 4096}, **kw)


def _run(m, env, command, cores=(0,), **kw):
    """One command of session `default`, granted `cores` (as the scheduler's grant would)."""
    record = m.envs.record(env)
    req = ExecRequest(env, command, session=kw.pop("session", "default"), **kw)
    return m.run_in_session(record, req, cores)


def _slot(m, env, name="default"):
    return m.envs.record(env).sessions[name].slot


def _cpuset(slot) -> str:
    return fs.read(slot.folders["cpuset"] / "cpuset.cpus")


def test_a_command_gets_its_grant_for_its_run_alone():
    async def main():
        m = _manager()
        await m.start()
        try:
            env = await m.open_env("grant", 256)
            free = m.pool.free("local")
            await m.open_session(env, "default")
            bg = m.envs.record(env).background.cores
            assert m.pool.free("local") == free - len(bg) == free - 1  # held
            slot = _slot(m, env)
            before = (_cpuset(slot), slot.quota)
            grant = tuple(c for c in range(m.pool.capacity("local")) if c not in bg)[:1]
            running = asyncio.ensure_future(_run(m, env, "sleep 1; nproc", cores=grant))
            await asyncio.sleep(0.5)
            during = (_cpuset(slot), slot.quota)
            r = await running
            after = (_cpuset(slot), slot.quota)
            await m.close_session(env, "default")
            return before, during, after, r, bg, grant, free, m.pool.free("local")
        finally:
            await m.close()

    before, during, after, r, bg, grant, free, free_after = asyncio.run(main())
    assert before[0] == fs.cpulist(bg) and before[1].split()[0] == "10000"  # 0.1 of a core
    assert during[0] == fs.cpulist(grant) and during[1].startswith(str(len(grant) * 100000))
    assert after == before
    assert r.status is Status.OK and r.stdout.strip() == str(len(grant))
    assert free_after == free  # the background core came back with the last session


def test_a_busy_background_process_gets_no_more_than_its_allowance():
    async def main():
        m = _manager(background=0.1)
        await m.start()
        try:
            env = await m.open_env("busy", 256)
            await m.open_session(env, "default")
            r = await _run(m, env, "(while :; do :; done) & echo started")
            slot = _slot(m, env)
            used0, t0 = _usage(slot), time.monotonic()
            await asyncio.sleep(2.0)
            share = (_usage(slot) - used0) / (time.monotonic() - t0)
            return r, share
        finally:
            await m.close()

    r, share = asyncio.run(main())
    assert r.status is Status.OK, r
    assert share <= 0.13, f"a background loop used {share:.2f} of a core (allowance 0.1)"


def _usage(slot) -> float:
    return int(fs.read(slot.folders["cpuacct"] / "cpuacct.usage")) / 1e9


def test_a_dead_shell_names_itself_and_the_session_can_be_opened_again():
    async def main():
        m = _manager()
        await m.start()
        try:
            env = await m.open_env("dead", 256)
            await m.open_session(env, "default")
            gone = await _run(m, env, "exit 7")
            again = await _run(m, env, "echo x")
            await m.close_session(env, "default")
            await m.open_session(env, "default")
            fresh = await _run(m, env, "echo back")
            timed = await _run(m, env, "sleep 30", timeout=0.5)
            alive = await _run(m, env, "echo alive")
            return gone, again, fresh, timed, alive
        finally:
            await m.close()

    gone, again, fresh, timed, alive = asyncio.run(main())
    assert gone.status is Status.FAILED and "exited with code 7" in gone.detail
    assert again.status is Status.FAILED and "exited with code 7" in again.detail
    assert fresh.stdout == "back\n"
    assert timed.status is Status.TIMEOUT and "the session goes on" in timed.detail
    assert alive.stdout == "alive\n"


def test_bad_input_is_refused_naming_the_field_and_nothing_is_left():
    async def main():
        m = _manager()
        await m.start()
        try:
            env = await m.open_env("bad", 256)
            errors = []
            for name in ("", "../x", "a" * 65, "-x", 5, "a b"):
                try:
                    await m.open_session(env, name)
                except ValidationError as exc:
                    errors.append(exc.field)
            await m.open_session(env, "one")
            try:
                await m.open_session(env, "one")
            except ValidationError as exc:
                errors.append(exc.field)
            unknown = await _run(m, env, "true", session="nope")
            flood = await _run(m, env, "head -c 3000000 /dev/zero | tr '\\0' a", session="one",
                               output_cap=1000)  # fmt: skip
            record = m.envs.record(env)
            slot = record.sessions["one"].slot
            await m.close_env(env)
            return errors, unknown, flood, slot, m.pool.free("local"), m.pool.capacity("local")
        finally:
            await m.close()

    errors, unknown, flood, slot, free, capacity = asyncio.run(main())
    assert errors == ["session"] * 7
    assert unknown.status is Status.FAILED and "no open session 'nope'" in unknown.detail
    assert flood.status is Status.OK and flood.truncated and len(flood.stdout) <= 1000
    assert "truncated at 1000 bytes" in flood.detail
    assert not slot.folders["cpu"].exists()  # the environment's cgroups are gone
    assert free == capacity  # no background core held once the environment closed


def test_a_fork_carries_files_not_sessions(tmp_path):
    async def main():
        m = _manager(state_dir=str(tmp_path / "state"))
        await m.start()
        try:
            if m.roots is None:
                pytest.skip("no layers here (overlayfs or loop devices refused)")
            env = await m.open_env("parent", 256, disk_mb=64)
            await m.open_session(env, "default")
            await _run(m, env, "echo kept > /sandbox/f; export V=1")
            (child,) = await m.fork_env(env, ["child"])
            parent_sessions, child_sessions = m.sessions_of(env), m.sessions_of(child)
            got = await m.read_files(child, ["/sandbox/f"])
            return parent_sessions, child_sessions, got
        finally:
            await m.close()

    parent_sessions, child_sessions, got = asyncio.run(main())
    assert parent_sessions == [] and child_sessions == []
    assert got["/sandbox/f"] == b"kept\n"


def _tool_schema():
    """The tool's schema as verl passes it: its own type where verl imports, else a dict."""
    raw = {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a shell command in the trajectory's session.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}},
        },
    }
    if adapter.HAVE_VERL:
        from verl.tools.schemas import OpenAIFunctionToolSchema  # (optional: verl)

        return OpenAIFunctionToolSchema.model_validate(raw)
    return raw


def test_the_verl_tool_keeps_one_session_per_trajectory():
    """`session: true`: each tool call is one command of the trajectory's shell session, so
    its working folder and variables carry to the next call; release ends it."""
    runner = adapter.TangramRunner(lambda: Tangram.local(cpu_backend="bwrap"))
    tool = adapter.TangramTool({"session": True, "memory_mb": 256}, _tool_schema(), runner=runner)

    async def main():
        created = await tool.create("traj-s")
        iid = created if isinstance(created, str) else created[0]
        await tool.execute(iid, {"command": "cd /tmp && export K=v"})
        resp, _, metrics = await tool.execute(iid, {"command": "echo $K $(pwd)"})
        sessions = runner.tangram.sessions(tool.envs[iid])
        await tool.release(iid)
        return resp, metrics, sessions

    try:
        resp, metrics, sessions = asyncio.run(main())
    finally:
        runner.close()
    text = resp if isinstance(resp, str) else resp.text
    assert "v /tmp" in text and metrics["status"] == "ok"
    assert sessions == [adapter.SESSION]


def test_on_ray_a_session_lives_on_its_environments_node():
    """`Tangram.ray`: the session is opened by the node agent of the environment's machine,
    and each command, an action of the central scheduler, runs there in it."""
    pytest.importorskip("ray", reason="Ray is not installed")

    async def go(address: str):
        async with Tangram.ray(address, cpu_backend="bwrap", poll_s=0.2) as tg:
            env = await tg.open_env("ray-s", 128)
            await tg.open_session(env, "sh")
            await tg.run(env, "sh", "cd /tmp && export R=ray")
            r = await tg.run(env, "sh", "echo $R $(pwd)")
            listed = tg.sessions(env)
            await tg.close_session(env, "sh")
            return r, listed, tg.sessions(env)

    with local_cluster(nodes=1, cpus_per_node=2) as cluster:
        r, listed, after = asyncio.run(go(cluster.address))
    assert r.status is Status.OK and r.stdout == "ray /tmp\n", r
    assert listed == ["sh"] and after == []


def test_sessions_opened_at_once_in_one_environment_each_get_a_slot():
    """Eight opened together (each makes a cgroup slot, some in worker threads): none is
    refused for a slot another took (found by `tangram bench sessions --idle`: a 500); and
    once they are idle the server holds no more descriptors than before them."""

    async def main():
        m = _manager()
        await m.start()
        try:
            env = await m.open_env("many", 512)
            await m.open_session(env, "first")  # (the first makes what every session shares)
            held = len(os.listdir("/proc/self/fd"))
            await asyncio.gather(*(m.open_session(env, f"s{i}") for i in range(8)))
            outs = await asyncio.gather(
                *(_run(m, env, f"echo {i}", session=f"s{i}") for i in range(8))
            )
            idle = len(os.listdir("/proc/self/fd"))  # 8 more sessions, idle again
            assert idle <= held, (held, idle)  # the server holds no descriptor per session
            return [o.stdout for o in outs], [n for n in m.sessions_of(env) if n != "first"]
        finally:
            await m.close()

    outs, names = asyncio.run(main())
    assert outs == [f"{i}\n" for i in range(8)] and names == [f"s{i}" for i in range(8)]

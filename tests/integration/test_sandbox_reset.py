"""A reset bwrap sandbox keeps nothing of its earlier user (`managers.cpu.backends.bwrap.reset`):
each thing a command can leave behind is left by a first command, the sandbox is reset, and a
second command looks for it. Then the same through `/run_code`'s warm pool, which reuses reset
sandboxes, and whose environments no client may address. Skips where bwrap cannot run."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile

import httpx
import pytest

from managers.cpu import CpuManager, ExecRequest
from managers.cpu.backends.affinity import AffinityBackend
from managers.cpu.backends.bwrap import reset as bwrap_reset
from managers.cpu.backends.bwrap.backend import BwrapBackend
from managers.cpu.backends.bwrap.layout import server_python
from managers.cpu.backends.cgroup import fs as cgroupfs
from tangram.runtime.facade import Tangram
from tangram.runtime.sandboxfusion import DEFAULT_MEMORY_MB, warm
from tangram.runtime.sandboxfusion.warm import warm_pool
from tangram.runtime.server import create_app, serve_in_thread

REASON = BwrapBackend.probe()
pytestmark = [
    pytest.mark.cgroup,
    pytest.mark.skipif(REASON is not None, reason=f"bwrap backend unavailable: {REASON}"),
]

LEAVE = r"""
set -e
mkdir -p /sandbox/deep/er && echo secret > /sandbox/deep/er/f && echo x > /sandbox/.hidden
mkdir /sandbox/locked && echo y > /sandbox/locked/z && chmod 000 /sandbox/locked
ln -s /etc/passwd /sandbox/link
echo secret > /tmp/t && mkdir /tmp/d && echo secret > /tmp/d/f && echo secret > /dev/shm/s
setsid sh -c 'sleep 300' </dev/null >/dev/null 2>&1 &
( sh -c 'sleep 301 &' & ) </dev/null >/dev/null 2>&1
ipcmk -M 4096 >/dev/null && ipcmk -S 2 >/dev/null && ipcmk -Q >/dev/null
ipcs | grep -c 0x || true
"""
LOOK = r"""
ls -A /sandbox /tmp /dev/shm
echo "ipc: $(ipcs | grep -c 0x)"
echo "sleepers: $(cat /proc/[0-9]*/comm 2>/dev/null | grep -c '^sleep$')"
"""


def run(coro):
    return asyncio.run(coro)


def test_a_reset_sandbox_keeps_no_file_process_or_ipc_object():
    async def go():
        m = CpuManager(BwrapBackend())
        await m.start()
        try:
            env = await m.open_env("t", 256)
            before = await m.execute(ExecRequest(env, LOOK))
            left = await m.execute(ExecRequest(env, LEAVE))
            sleepers = [p for p in _pids_of(m, env) if _cmdline(p).startswith("sleep 30")]
            dirty = await m.execute(ExecRequest(env, LOOK))
            why = await m.reset_env(env)
            after = await m.execute(ExecRequest(env, LOOK))
            again = await m.reset_env(env)  # a reset of a reset sandbox is as good
            return before, left, sleepers, dirty, why, after, again
        finally:
            await m.close()

    before, left, sleepers, dirty, why, after, again = run(go())
    assert left.status == "ok", left.stderr
    # the daemons died with their exec (its slot is killed when it ends), the rest is there
    assert "ipc: 3" in dirty.stdout and "sleepers: 0" in dirty.stdout
    assert "secret" not in dirty.stdout and "deep" in dirty.stdout  # the leftovers were there
    assert left.stdout.split()[-1] == "3"  # the shared memory, the semaphores, the queue
    assert why is None and again is None
    assert after.status == "ok", after.stderr
    assert after.stdout == before.stdout, (before.stdout, after.stdout)
    assert "ipc: 0" in after.stdout and "sleepers: 0" in after.stdout
    for pid in sleepers:  # the daemons of the first command were killed, not just hidden
        assert not os.path.exists(f"/proc/{pid}") or _cmdline(pid) == ""
    assert os.path.exists("/etc/passwd")  # the link was removed, not what it named


FEW = r"""
echo a > /sandbox/f && echo b > /sandbox/.h && ln -s /etc/passwd /sandbox/l && echo e > /sandbox/usr
echo c > /tmp/t && mkfifo /tmp/p && echo d > /dev/shm/s
"""


def test_a_small_leftover_is_reset_on_the_loop_and_the_rest_in_the_thread():
    """After the first reset (the thread's, which opens the IPC listings inside the sandbox's
    namespace), a command that leaves a few files, a link and a FIFO is reset on the loop
    (`quick_reset`); one that also leaves a System V object, or a folder, is sent to the
    thread, and is reset all the same. The sandbox has a read-only bind under /tmp (as where
    the server's Python lives under /tmp, in a fresh clone's CI): kept, and no reason to go
    to the thread. The bind is one folder down, so /tmp holds a folder that holds it."""
    outer = tempfile.mkdtemp(prefix="tangram-ro-", dir="/tmp")
    host = os.path.join(outer, "inner")
    os.mkdir(host)
    os.chmod(outer, 0o755)
    os.chmod(host, 0o755)
    try:
        before, first, seen = run(_small_leftovers(host))
    finally:
        shutil.rmtree(outer)
    assert first is None
    assert [(status, quick, why) for status, quick, why, _ in seen] == [
        ("ok", None, None),
        ("ok", bwrap_reset.SLOW, None),
        ("ok", bwrap_reset.SLOW, None),
    ]
    for *_, after in seen:
        assert after.stdout == before.stdout, (before.stdout, after.stdout)
    assert os.path.exists("/etc/passwd")


async def _small_leftovers(host: str):
    m = CpuManager(BwrapBackend(ro_paths=(*server_python(), host)))
    await m.start()
    try:
        env = await m.open_env("t", 256)
        sandbox = m.sandbox(env)
        before = await m.execute(ExecRequest(env, LOOK))
        first = await m.reset_env(env)
        seen = []
        for leave in (FEW, FEW + "ipcmk -M 4096 >/dev/null", FEW + "mkdir /tmp/d"):
            left = await m.execute(ExecRequest(env, leave))
            quick = bwrap_reset.quick_reset(sandbox.env, sandbox.holder, sandbox.cgroups)
            why = await m.reset_env(env) if quick is bwrap_reset.SLOW else quick
            seen.append((left.status, quick, why, (await m.execute(ExecRequest(env, LOOK)))))
        return before, first, seen
    finally:
        await m.close()


def test_a_mount_under_tmp_survives_a_reset_and_the_rest_goes(tmp_path_factory):
    """A sandbox set up with a read-only bind under /tmp (the server's Python in a virtual
    environment under /tmp, as in a fresh clone's CI) resets: the mount and the folders that
    hold it stay, everything a command wrote beside them goes."""
    host = tempfile.mkdtemp(prefix="tangram-ro-", dir="/tmp")
    os.chmod(host, 0o755)  # readable by the sandbox's uid
    with open(os.path.join(host, "kept"), "w") as f:
        f.write("host file")
    inside = f"/tmp/{os.path.basename(host)}"
    try:

        async def go():
            m = CpuManager(BwrapBackend(ro_paths=(*server_python(), host)))
            await m.start()
            try:
                env = await m.open_env("t", 256)
                left = await m.execute(ExecRequest(env, "echo x > /tmp/mine; mkdir /tmp/d"))
                why = await m.reset_env(env)
                after = await m.execute(ExecRequest(env, f"ls -A /tmp; cat {inside}/kept"))
                return left, why, after
            finally:
                await m.close()

        left, why, after = run(go())
    finally:
        shutil.rmtree(host)
    assert left.status == "ok", left.stderr
    assert why is None, why
    words = after.stdout.split()
    assert words[-2:] == ["host", "file"] and os.path.basename(host) in words, after.stdout
    assert "mine" not in words and "d" not in words, after.stdout


def test_posix_message_queues_are_refused():
    """They would outlive a reset (the sandbox keeps its IPC namespace) and cannot be listed
    to remove: `mq_open` answers EPERM."""
    probe = (
        "import ctypes, sys; libc = ctypes.CDLL(None, use_errno=True); "
        "fd = libc.mq_open(b'/tq', 0o102, 0o600, None); print(fd, ctypes.get_errno())"
    )

    async def go():
        m = CpuManager(BwrapBackend())
        await m.start()
        try:
            env = await m.open_env("t", 256)
            return await m.execute(ExecRequest(env, ["python3", "-c", probe]))
        finally:
            await m.close()

    r = run(go())
    assert r.status == "ok", r.stderr
    assert r.stdout.split() == ["-1", "1"]  # EPERM


def test_a_backend_without_isolation_says_it_cannot_reset(tmp_path):
    async def go():
        m = CpuManager(AffinityBackend(), workdir_root=str(tmp_path))
        await m.start()
        try:
            env = await m.open_env("t", 128)
            return await m.reset_env(env), await m.reset_env("no-such-env")
        finally:
            await m.close()

    mine, unknown = run(go())
    assert mine is not None and "does not reset" in mine
    assert unknown == "it is not open"


def test_favordynmods_is_set_keeping_the_mounts_options():
    """At start the cgroup backend sets `favordynmods` on the cgroup2 mount, and keeps the
    options the mount had (a remount without them would drop them). (The option is not
    cleared first: that would toggle a host-wide setting under the tests running beside this
    one; on a fresh machine the first start is the one that sets it.)"""
    if cgroupfs.cgroup2_mount() is None:
        pytest.skip("no cgroup2 mount")
    before = set(_cgroup2_options())

    async def start() -> None:
        m = CpuManager(BwrapBackend())
        await m.start()
        await m.close()

    run(start())
    after = set(_cgroup2_options())
    assert cgroupfs.FAVOR in after
    assert before - {cgroupfs.FAVOR} <= after


def test_run_code_reuses_reset_sandboxes_and_refuses_their_ids(tmp_path, monkeypatch):
    """One warm sandbox, reused: each request leaves a file in /tmp and a daemon behind, and
    the next finds neither; the id in a response reaches no pooled sandbox afterwards."""
    monkeypatch.setenv("TANGRAM_SANDBOXFUSION_WARM", "1")
    tg = Tangram(cpu=CpuManager(BwrapBackend(), workdir_root=str(tmp_path)))
    code = (
        "import os, subprocess\n"
        "print(sorted(os.listdir('/tmp')), sorted(os.listdir('.')))\n"
        "open('/tmp/mark', 'w').write('x'); open('left', 'w').write('x')\n"
        "subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
    )
    with serve_in_thread(create_app(tg)) as url, httpx.Client(base_url=url, timeout=60) as c:
        seen, envs = [], set()
        for _ in range(4):
            d = c.post("/run_code", json={"code": code, "language": "python"}).json()
            assert d["status"] == "Success", d
            seen.append(d["run_result"]["stdout"].strip())
            envs.add(d["tangram"]["env_id"])
            pool = warm_pool(tg, DEFAULT_MEMORY_MB)
            for _ in range(200):
                if pool is not None and not pool.filling:
                    break
                asyncio.run(asyncio.sleep(0.02))
        pool = warm_pool(tg, DEFAULT_MEMORY_MB)
        assert pool is not None and pool.reused >= 2
        env_id = next(e for e in envs if e in pool.mine)  # a response's, still pooled
        refused = [
            c.post(f"/v1/envs/{env_id}/exec", json={"command": "true"}),
            c.put(f"/v1/envs/{env_id}/files", json={"files": {"a": "eA=="}}),
            c.delete(f"/v1/envs/{env_id}"),
            c.post("/run_code", json={"code": "print(1)", "language": "python", "env_id": env_id}),
        ]
    # (the /tmp a sandbox was set up with may hold the folder of a mount: a server Python
    # under /tmp)
    assert all("'mark'" not in s and "'left'" not in s for s in seen), seen
    assert len(envs) < 4  # a sandbox served more than one request
    for r in refused:
        assert r.status_code == 422, r.text
        assert "env_id" in r.text and "/run_code sandboxes" in r.text


def _pids_of(m: CpuManager, env: str) -> list[int]:
    out: list[int] = []
    for folder in m.backend.folders(env):
        for sub in [folder, *(p for p in folder.rglob("*") if p.is_dir())]:
            out += cgroupfs.pids(sub)
    return sorted(set(out))


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def _cgroup2_options() -> list[str]:
    found = cgroupfs.cgroup2_mount()
    assert found is not None
    return [*found[1], *found[2]]


async def _one_warm(tg: Tangram) -> warm.WarmPool:
    """`tg`'s `/run_code` pool (size 1), once its one warm sandbox is ready."""
    pool = warm_pool(tg, DEFAULT_MEMORY_MB)
    assert pool is not None
    pool.warm()
    for _ in range(500):
        if pool.idle == 1 and not pool.filling:
            break
        await asyncio.sleep(0.01)
    return pool


def test_a_request_waits_for_a_sandbox_being_reset_rather_than_open_one(tmp_path, monkeypatch):
    """With no warm sandbox ready but one being reset, `take` gets that one (about 1 ms)
    instead of opening a new sandbox (~15 ms of CPU); a sandbox reset `REUSE - 1` times is
    closed, not reset again."""
    monkeypatch.setenv("TANGRAM_SANDBOXFUSION_WARM", "1")
    monkeypatch.setenv("TANGRAM_SANDBOXFUSION_REUSE", "3")
    # the mechanism, not its bound: a loaded machine's reset may pass RESET_WAIT_S
    monkeypatch.setattr(warm, "RESET_WAIT_S", 30.0)
    tg = Tangram(cpu=CpuManager(BwrapBackend(), workdir_root=str(tmp_path)))

    async def scenario():
        await tg.start()
        try:
            pool = await _one_warm(tg)
            a = await pool.take(DEFAULT_MEMORY_MB)  # the warm one; no refill (it comes back)
            opened = tg.status().envs
            pool.release(a)  # reset in the background
            b = await pool.take(DEFAULT_MEMORY_MB)  # waits for it
            same = (b == a, tg.status().envs == opened, pool.reused)
            pool.release(b)
            c = await pool.take(DEFAULT_MEMORY_MB)  # its third request: the last one
            pool.release(c)
            for _ in range(500):
                if not pool.filling and a not in pool.mine:
                    break
                await asyncio.sleep(0.01)
            return same, c == a, a in pool.mine
        finally:
            await tg.shutdown()

    (same_env, no_new, reused), third, kept = run(scenario())
    assert same_env and no_new and reused == 1, (same_env, no_new, reused)
    assert third and not kept, (third, kept)  # served 3 requests (REUSE): closed, the pool refilled


def test_a_slow_reset_does_not_hold_the_next_request(tmp_path, monkeypatch):
    """A request that leaves 20,000 files makes its sandbox's reset take far longer than
    `RESET_WAIT_S`: the next request opens its own sandbox instead of waiting for it, and the
    slow one still comes back to the pool, reset."""
    monkeypatch.setenv("TANGRAM_SANDBOXFUSION_WARM", "1")
    tg = Tangram(cpu=CpuManager(BwrapBackend(), workdir_root=str(tmp_path)))
    many = "mkdir many && cd many && seq 20000 | xargs touch"

    async def scenario():
        await tg.start()
        try:
            pool = await _one_warm(tg)
            a = await pool.take(DEFAULT_MEMORY_MB)
            left = await tg.exec(a, many, cpu=1, timeout=120)
            misses = pool.misses
            pool.release(a)  # its reset removes 20,000 files
            b = await pool.take(DEFAULT_MEMORY_MB)
            opened_own = (b != a, pool.misses == misses + 1)
            pool.release(b)
            for _ in range(3000):
                if not pool.filling:
                    break
                await asyncio.sleep(0.01)
            return left, opened_own, pool.reused, a in pool.mine
        finally:
            await tg.shutdown()

    left, (other, missed), reused, kept = run(scenario())
    assert left.ok, left.stderr
    assert other and missed
    assert reused >= 1 and kept  # the slow reset finished and the sandbox went back

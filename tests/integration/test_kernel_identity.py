"""Issue 22, finding 1: no kernel channel between environments. From inside real bwrap
sandboxes, each system call the seccomp filter refuses is tried (and must fail with the
filter's errno), keys cannot pass from one environment to the next, uids are never reused nor
shared by two servers, and the sandbox shows nothing of the host in /proc/1/cmdline."""

from __future__ import annotations

import asyncio
import json
import os
import resource
import subprocess
import sys

import pytest

from managers.cpu import CpuManager, ExecRequest, seccomp
from managers.cpu.backends.bwrap.backend import BwrapBackend
from managers.cpu.backends.cgroup.backend import CgroupBackend
from managers.cpu.uids import UidAllocator

pytestmark = [pytest.mark.cgroup]

# Each call with arguments that would succeed (or fail on its arguments, not with EPERM) where
# no filter refuses it. Numbers come from libseccomp's table for this machine.
PROBE = r"""
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
nr = json.loads(sys.argv[1])
buf = ctypes.create_string_buffer(512)
ts = ctypes.create_string_buffer(16)
s = ctypes.c_char_p
calls = {
    "add_key": (s(b"user"), s(b"k"), s(b"v"), 1, ctypes.c_int(-4)),
    "keyctl": (0, ctypes.c_int(-4), 0),
    "request_key": (s(b"user"), s(b"nokey"), None, 0),
    "mq_open": (s(b"tangram-no-such-queue"), 0, 0, None),
    "io_uring_setup": (4, buf), "io_uring_enter": (-1, 0, 0, 0, None, 0),
    "io_uring_register": (-1, 0, None, 0), "bpf": (0, buf, 72), "perf_event_open": (buf, 0, -1,
    -1, 0), "userfaultfd": (0,), "init_module": (None, 0, s(b"")),
    "finit_module": (-1, s(b""), 0), "delete_module": (s(b"x"), 0),
    "kexec_load": (0, 0, None, 0), "kexec_file_load": (-1, -1, 0, s(b""), 0),
    "clock_settime": (0, ts), "clock_adjtime": (0, buf), "settimeofday": (None, None),
    "unshare": (0x10000000,), "setns": (-1, 0),
    "mount": (s(b"none"), s(b"/tmp"), s(b"tmpfs"), 0, None), "umount2": (s(b"/tmp"), 0),
    "pivot_root": (s(b"."), s(b".")), "open_tree": (-100, s(b"/tmp"), 0),
    "move_mount": (-1, s(b""), -1, s(b""), 0), "fsopen": (s(b"tmpfs"), 0),
    "fsconfig": (-1, 0, None, None, 0), "fsmount": (-1, 0, 0), "fspick": (-100, s(b"/tmp"), 0),
    "mount_setattr": (-1, s(b""), 0, None, 0), "clone3": (buf, 88),
}
out = {}
for name, args in calls.items():
    ctypes.set_errno(0)
    r = libc.syscall(nr[name], *args)
    out[name] = 0 if r >= 0 else ctypes.get_errno()
# clone(CLONE_NEWUSER | SIGCHLD), fork-like: a child that got through exits at once
ctypes.set_errno(0)
r = libc.syscall(nr["clone"], 0x10000000 | 17, None, None, None, None)
if r == 0:
    os._exit(0)
if r > 0:
    os.waitpid(r, 0)
out["clone(CLONE_NEWUSER)"] = 0 if r >= 0 else ctypes.get_errno()
r = libc.syscall(nr["ptrace"], 16, 1, None, None)  # PTRACE_ATTACH to the sandbox's init
out["ptrace(ATTACH, 1)"] = 0 if r >= 0 else ctypes.get_errno()
print(json.dumps(out))
"""


def numbers() -> dict[str, int]:
    import pyseccomp

    names = [*seccomp.BLOCKED, "clone", "clone3", "ptrace"]
    return {n: pyseccomp.resolve_syscall(pyseccomp.Arch.NATIVE, n) for n in names}


@pytest.fixture(scope="module")
def bwrap_or_skip() -> None:
    why = BwrapBackend.probe()
    if why is not None:
        pytest.skip(f"bwrap backend unavailable: {why}")


@pytest.fixture(scope="module", params=["native", "python"])
def inside(bwrap_or_skip, request) -> dict[str, int]:
    """The probe's errno per call, run once inside a sandbox, with each loader (the C one,
    and the Python one used where the host has no C compiler)."""

    async def go():
        m = CpuManager(BwrapBackend())
        await m.start()
        try:
            env = await m.open_env("t", 256)
            return await m.execute(
                ExecRequest(env, ["/usr/bin/python3", "-c", PROBE, json.dumps(numbers())])
            )
        finally:
            await m.close()

    with pytest.MonkeyPatch.context() as mp:
        if request.param == "python":
            mp.setattr(seccomp, "build_native", lambda folder: False)
        o = asyncio.run(go())
    assert o.status == "ok", o
    return json.loads(o.stdout)


@pytest.mark.parametrize("name", sorted(seccomp.BLOCKED))
def test_each_blocked_call_fails_inside(inside, name):
    assert inside[name] == 1, f"{name} answered errno {inside[name]} inside, not EPERM"  # EPERM


def test_namespaces_through_clone_are_refused_and_clone3_falls_back(inside):
    assert inside["clone(CLONE_NEWUSER)"] == 1
    assert inside["clone3"] == 38  # ENOSYS: libc falls back to clone, whose flags are seen


def test_ptrace_of_the_sandboxs_init_fails(inside):
    assert inside["ptrace(ATTACH, 1)"] == 1


def test_the_probe_can_fail_without_the_filter(bwrap_or_skip):
    """The same probe as an unprivileged uid on the host, without the filter: the calls that an
    unprivileged process may make get through (so the tests above do test the filter)."""
    done = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            "/usr/bin/python3",
            "-c",
            PROBE,
            json.dumps(numbers()),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd="/",
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["keyctl"] == 0 and out["add_key"] == 0 and out["open_tree"] == 0
    assert out["setns"] == 9  # EBADF: the call ran


def test_keys_cannot_pass_between_environments(bwrap_or_skip):
    """Env A stores a key (if it can), is closed; env B gets another uid and finds no key."""

    async def go():
        m = CpuManager(BwrapBackend())
        await m.start()
        try:
            a = await m.open_env("a", 128)
            a_uid = (await m.execute(ExecRequest(a, "id -u"))).stdout.strip()
            keys = await m.execute(
                ExecRequest(
                    a,
                    [
                        "/usr/bin/python3",
                        "-c",
                        (
                            "import ctypes; l = ctypes.CDLL(None, use_errno=True); "
                            f"print(l.syscall({numbers()['add_key']}, b'user', b'secret', b'v', "
                            "1, -4), "
                            "ctypes.get_errno())"
                        ),
                    ],
                )
            )
            await m.close_env(a)
            b = await m.open_env("b", 128)
            b_uid = (await m.execute(ExecRequest(b, "id -u"))).stdout.strip()
            listed = await m.execute(ExecRequest(b, "cat /proc/keys /proc/key-users"))
            return a_uid, keys, b_uid, listed
        finally:
            await m.close()

    a_uid, keys, b_uid, listed = asyncio.run(go())
    assert keys.stdout.split() == ["-1", "1"]  # add_key refused: EPERM
    assert a_uid != b_uid
    assert "secret" not in listed.stdout


def test_uids_are_never_reused_and_two_servers_never_share(bwrap_or_skip, tmp_path):
    """Two allocators on one registry (two servers on a host) and many takes: all distinct.
    The second half runs in another process, as a second server would."""
    reg = tmp_path / "ranges"
    a = UidAllocator(3_000_000, reg, size=100)
    first = [a.take() for _ in range(250)]  # three ranges
    other = subprocess.run(
        [
            sys.executable,
            "-c",
            (
                "import sys; from pathlib import Path; from managers.cpu.uids import UidAllocator; "
                f"u = UidAllocator(3_000_000, Path({str(reg)!r}), size=100); "
                "print(*[u.take() for _ in range(150)])"
            ),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert other.returncode == 0, other.stderr
    second = [int(x) for x in other.stdout.split()]
    more = [a.take() for _ in range(100)]
    allu = first + second + more
    assert len(set(allu)) == len(allu) == 500
    assert min(allu) >= 3_000_000


def test_closed_environments_uids_are_not_given_again(bwrap_or_skip):
    async def go():
        m = CpuManager(BwrapBackend())
        await m.start()
        seen = []
        try:
            for i in range(3):
                e = await m.open_env(f"t{i}", 64)
                seen.append((await m.execute(ExecRequest(e, "id -u"))).stdout.strip())
                await m.close_env(e)
        finally:
            await m.close()
        return seen

    seen = asyncio.run(go())
    assert len(set(seen)) == 3


def test_nothing_of_the_host_in_init_and_a_private_writable_dev_shm(bwrap_or_skip):
    async def go():
        m = CpuManager(BwrapBackend())
        await m.start()
        try:
            e = await m.open_env("t", 128)
            init = await m.execute(ExecRequest(e, "tr '\\0' ' ' </proc/1/cmdline"))
            shm = await m.execute(
                ExecRequest(
                    e,
                    [
                        "/usr/bin/python3",
                        "-c",
                        (
                            "import multiprocessing as mp; l = mp.Lock(); l.acquire(); "
                            "l.release(); "
                            "open('/dev/shm/x', 'w').write('1'); print('ok')"
                        ),
                    ],
                )
            )
            e2 = await m.open_env("u", 128)
            other = await m.execute(ExecRequest(e2, "ls /dev/shm"))
            return init, shm, other
        finally:
            await m.close()

    init, shm, other = asyncio.run(go())
    assert "tangram-" not in init.stdout and str(os.getpid()) not in init.stdout.split()
    assert "/sandbox" not in init.stdout and "bind" not in init.stdout
    assert shm.stdout.strip() == "ok", shm
    assert "x" not in other.stdout.split()  # private to each environment


def _loop_cpu_s() -> float:
    """CPU time (user + system) of this thread: the event loop that reads commands' output."""
    r = resource.getrusage(resource.RUSAGE_THREAD)
    return r.ru_utime + r.ru_stime


def test_a_flood_of_output_is_dropped_in_the_sandbox_not_read_by_the_server(bwrap_or_skip):
    """1 GB to stdout with a 64 KiB cap: the server's loop spends next to no CPU on it (it
    reads ~the cap); the command ends on its own
    (not at its timeout) and what it writes to stderr after the flood still arrives."""
    flood = "dd if=/dev/zero bs=1M count=1000 2>/tmp/dd; echo after >&2; tail -1 /tmp/dd >&2"

    async def go(backend):
        m = CpuManager(backend)
        await m.start()
        try:
            e = await m.open_env("t", 256)
            before = _loop_cpu_s()
            o = await m.execute(ExecRequest(e, flood, timeout=300, output_cap=65536))
            return o, _loop_cpu_s() - before
        finally:
            await m.close()

    o, cpu = asyncio.run(go(BwrapBackend()))
    _, ref = asyncio.run(go(CgroupBackend()))  # same run: a server that drains it all
    print(
        f"\n1 GB of output past a 64 KiB cap: {cpu:.3f} s of the loop's CPU (same run, "
        f"drained by the server as the cgroup backend does: {ref:.3f} s)"
    )
    assert o.status == "ok" and o.truncated and len(o.stdout) == 65536, o.detail
    assert "after" in o.stderr and "1048576000 bytes" in o.stderr
    assert cpu < 0.08  # draining it all here costs ~0.25 s (the reference printed above)


def _namespace_fds() -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.split(":", 1)[0] in ("mnt", "pid", "net", "ipc", "uts", "cgroup"):
            found.append(target)
    return found


def test_the_server_holds_no_namespace_of_an_environment(bwrap_or_skip):
    """Nothing in the server keeps a sandbox's namespaces (and so its /tmp tmpfs) alive: with
    environments open and after they are closed, it holds no namespace descriptor."""

    async def go():
        m = CpuManager(BwrapBackend())
        await m.start()
        try:
            envs = [await m.open_env(f"t{i}", 64) for i in range(3)]
            for e in envs:
                await m.execute(ExecRequest(e, "head -c 1000000 /dev/zero > /tmp/x"))
            while_open = _namespace_fds()
            for e in envs:
                await m.close_env(e)
            return while_open, _namespace_fds()
        finally:
            await m.close()

    while_open, after = asyncio.run(go())
    assert while_open == [] and after == []


def test_one_servers_environment_exhausting_inotify_leaves_anothers_unharmed(bwrap_or_skip):
    """Per-uid kernel limits are per environment, across servers too: A (of one server)
    holds every inotify instance its uid may have (fs.inotify.max_user_instances) while B (of
    a second server on this host, same default uid base), concurrently, still gets one."""
    hog = (
        "import ctypes, time\n"
        "l = ctypes.CDLL(None, use_errno=True)\n"
        "n = 0\n"
        "while l.inotify_init() >= 0:\n"
        "    n += 1\n"
        "print(n, ctypes.get_errno(), flush=True)\n"
        "time.sleep(3)\n"
    )
    probe = (
        "import ctypes; l = ctypes.CDLL(None, use_errno=True); "
        "print(l.inotify_init(), ctypes.get_errno())"
    )

    async def go():
        m, n = CpuManager(BwrapBackend()), CpuManager(BwrapBackend())
        await asyncio.gather(m.start(), n.start())
        try:
            a = await m.open_env("a", 128)
            b = await n.open_env("b", 128)
            held = asyncio.ensure_future(
                m.execute(ExecRequest(a, ["/usr/bin/python3", "-c", hog], timeout=60))
            )
            await asyncio.sleep(1.5)  # A holds them all by now
            other = await n.execute(ExecRequest(b, ["/usr/bin/python3", "-c", probe]))
            return await held, other
        finally:
            await m.close()
            await n.close()

    held, other = asyncio.run(go())
    n, err = held.stdout.split()
    assert int(n) >= 1 and err == "24", held.stdout  # EMFILE: A hit its uid's limit
    fd, err = other.stdout.split()
    assert int(fd) >= 0, other.stdout  # B's own uid still has its instances

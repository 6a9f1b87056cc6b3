"""Run by `test_rootless` as the unprivileged user: open two environments on the bwrap backend
and try every channel from one to the other; print what was seen, as JSON, for the test to
judge. Each attempt is paired with the same attempt inside the environment that made the
object, so a check cannot pass because the object was never made."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import uuid

from managers.cpu import CpuManager, ExecRequest, subids
from managers.cpu.backends.bwrap.backend import BwrapBackend
from managers.cpu.leftovers import owned_name

MARK = f"tangram-mark-{uuid.uuid4().hex[:8]}"
ABSTRACT = f"tangram-abstract-{uuid.uuid4().hex[:8]}"
LISTEN = (
    "import socket,time\n"
    "s=socket.socket(socket.AF_UNIX)\n"
    f"s.bind(b'\\0{ABSTRACT}')\n"
    "s.listen(1)\n"
    "time.sleep(60)\n"
)
CONNECT = (
    "import socket\n"
    "s=socket.socket(socket.AF_UNIX)\n"
    "try:\n"
    f"    s.connect(b'\\0{ABSTRACT}'); print('connected')\n"
    "except OSError as e:\n"
    "    print('refused', e.errno)\n"
)
SHM = "import os; fd=os.open('/dev/shm/{m}', os.O_CREAT|os.O_RDWR, 0o666); os.write(fd, b'x')"


async def sh(m: CpuManager, env: str, cmd: str) -> str:
    r = await m.execute(ExecRequest(env, cmd, timeout=20))
    return (r.stdout + r.stderr).strip()


def host_pids(mark: str) -> list[int]:
    found = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/cmdline", "rb") as f:
                    if mark.encode() in f.read():
                        found.append(int(p))
            except OSError:
                pass
    return found


async def plant(m: CpuManager, a: str) -> dict:
    """What environment `a` leaves for `b` to find: a process, a file in its work folder and
    in /tmp, POSIX and System V shared memory, an abstract unix socket."""
    py = sys.executable if os.path.exists(sys.executable) else "python3"
    return {
        "uid": await sh(m, a, "id -u"),
        "files": await sh(m, a, f"echo s > /sandbox/{MARK}; echo s > /tmp/{MARK}; echo ok"),
        "shm": await sh(m, a, f'{py} -c "{SHM.format(m=MARK)}"; ls /dev/shm'),
        "sysv": await sh(m, a, "ipcmk -M 4096 2>&1; ipcs -m | grep -c 0x || true"),
    }


def live(m: CpuManager, a: str) -> asyncio.Task:
    """An exec of `a` that runs while `b` probes: a process named by the mark and an abstract
    socket listening (an exec's leftovers die with it, so they must live inside one)."""
    py = sys.executable if os.path.exists(sys.executable) else "python3"
    cmd = (
        f'{py} -c "{LISTEN}" & sleep 0.5; {py} -c "{CONNECT}"; '
        f"ls /proc | grep -c '^[0-9]'; exec {py} -c 'import time; time.sleep(6)' {MARK}"
    )
    return asyncio.ensure_future(m.execute(ExecRequest(a, cmd, timeout=20)))


async def probe(m: CpuManager, b: str, a_workdir: str, a_pids: list[int]) -> dict:
    py = sys.executable if os.path.exists(sys.executable) else "python3"
    kills = "; ".join(f"kill -9 {p} 2>&1 || echo refused" for p in a_pids) or "echo none"
    return {
        "uid": await sh(m, b, "id -u"),
        "files": await sh(m, b, f"cat /sandbox/{MARK} /tmp/{MARK} {a_workdir}/{MARK} 2>&1"),
        "shm": await sh(m, b, "ls /dev/shm"),
        "sysv": await sh(m, b, "ipcs -m | grep -c 0x || true"),
        # (the pattern does not match itself: a bracket in the grep's own command line)
        "proc": await sh(m, b, f"grep -l '{MARK[:-1]}[{MARK[-1]}]' /proc/[0-9]*/cmdline; echo end"),
        "connect": await sh(m, b, f'{py} -c "{CONNECT}"'),
        "kill": await sh(m, b, kills),
        "pids": await sh(m, b, "ls /proc | grep -c '^[0-9]'"),
    }


def _plant(folder: str, uid: int) -> None:
    """(In a user namespace mapping `uid`) what a dead server's environment left: a work
    folder of its uid's, mode 0700, with files below."""
    os.makedirs(f"{folder}/deep")
    with open(f"{folder}/deep/file", "w") as f:
        f.write("left")
    for p in (f"{folder}/deep/file", f"{folder}/deep", folder):
        os.chown(p, uid, uid)
        os.chmod(p, 0o700)


def plant_dead_servers_folder() -> str:
    ids = subids.subids()
    dead = subprocess.Popen(["true"])
    dead.wait()
    folder = os.path.join(tempfile.gettempdir(), owned_name("env-left", pid=dead.pid))
    uid = ids.uid + ids.count - 2
    ns = subids.make_userns(uid, ids.gid + ids.count - 2)
    try:
        subids.in_userns(ns, _plant, folder, uid, here=True)
    finally:
        os.close(ns)
    return folder


async def main() -> dict:
    left = plant_dead_servers_folder()
    planted = os.path.isdir(left)
    m = CpuManager(BwrapBackend())
    await m.start()  # (its sweep removes the dead server's folder)
    swept = planted and not os.path.exists(left)
    try:
        a = await m.open_env("a", 256)
        b = await m.open_env("b", 256)
        planted = await plant(m, a)
        running = live(m, a)
        await asyncio.sleep(2)
        a_workdir = m.envs.get(a).workdir
        a_pids = host_pids(MARK)
        st = os.stat(a_workdir)
        seen = await probe(m, b, a_workdir, a_pids)
        alive = host_pids(MARK)  # B's kill must not have reached it
        done = await running
        planted["live"] = (done.stdout + done.stderr).strip()
        return {
            "mark": MARK,
            "backend": m.backend.describe(),
            "lost": m.backend.guarantees_lost,
            "server_uid": os.getuid(),
            "a": planted,
            "b": seen,
            "a_host_pids": a_pids,
            "a_alive_after": alive,
            "a_workdir_owner": st.st_uid,
            "a_workdir_mode": oct(st.st_mode & 0o777),
            "dead_servers_folder_swept": swept,
        }
    finally:
        await m.close()


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main())))

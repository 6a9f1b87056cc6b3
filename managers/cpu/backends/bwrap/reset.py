"""Resetting a used bwrap sandbox to the state of a never-used one (`BwrapSandbox.reset`).

A sandbox's namespaces and cgroups cost ~15 ms of CPU to build and tear down (`tangram bench
sandboxfusion --latency`), more than the `print(1)` it runs. A caller that serves many short,
independent requests (the `/run_code` warm pool) can instead reset one between requests. What a
command can leave behind in its sandbox, and what the reset does about each:

- processes (daemons, `setsid`, double forks): every exec slot's cgroup is killed and waited
  for until it is empty; only the sandbox's own init and spawner may remain, in the holder's
  slot, and anything else there (which no command can move itself into: the sandbox has no
  cgroup files) makes the reset fail;
- files: everything in the work folder (`/sandbox`), in the private `/tmp` and in `/dev/shm`
  is removed by the server (root, through the init's `/proc/PID/root`, with every process of
  the sandbox but its own dead, so nothing can race the walk; links are unlinked, never
  followed: `managers.cpu.removal`). The rest of the file system is read-only to it;
- System V IPC (shared memory, semaphores, message queues) in the sandbox's IPC namespace:
  removed, from a server thread kept for it that joins that namespace (no process started);
- POSIX message queues outlive their processes too, but cannot be listed without a mount of
  their own: `mq_open` is refused by every sandbox's seccomp filter (`seccomp.BLOCKED`);
- keyrings, the other per-uid state outside the namespaces: refused by the filter as well;
- sockets die with their processes; the network namespace has loopback only.

Where it runs: a reset whose leftovers are small and simple (no process but the sandbox's own,
no System V object, at most `QUICK_ENTRIES` entries in each wiped folder and none a folder but
one that holds a mount of its own: the common `/run_code` request) is done on the event loop
(`quick_reset`, ~20 system calls); any other in the one reset thread (`reset`), which also joins
the IPC namespace. A thread hop, and
the interpreter lock the two threads then pass back and forth, cost more CPU than such a reset.

What it does not reset: the uid (the same for the sandbox's life; every file of it is gone), the
cgroups' counters (CPU time, the peak memory, the OOM count: the backend reads them as
differences), and the spawner, which is the server's own program. A reset that cannot be
completed says why, and the caller closes the environment instead.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import re
import threading
from concurrent.futures import ThreadPoolExecutor

from managers.cpu.backends.bwrap import holder as hold
from managers.cpu.backends.bwrap.layout import _Holder
from managers.cpu.backends.cgroup import fs
from managers.cpu.backends.cgroup.backend import EnvCgroups
from managers.cpu.environments import Environment
from managers.cpu.removal import remove_tree
from managers.cpu.subids import in_userns

CLONE_NEWIPC = 0x08000000
IPC_RMID = 0
INSIDE_WIPED = ("tmp", "dev/shm")  # the sandbox's own writable folders besides its work folder
_SYSVIPC = {"shm": "shmctl", "sem": "semctl", "msg": "msgctl"}
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
# the one thread resets run in: it joins each sandbox's IPC namespace to remove its objects (a
# thread's IPC namespace is its own, so the server's other threads never see one), and runs
# nothing but resets, so the namespace it is left in does not matter (one thread, one hop per
# reset: the loop's default executor then a second thread for the IPC part cost twice the hops)
_HERE = threading.local()  # `resets` is set in the reset thread only
_RESETS = ThreadPoolExecutor(
    max_workers=1,
    thread_name_prefix="tangram-reset",
    initializer=setattr,
    initargs=(_HERE, "resets", True),
)


SLOW = "slow"  # what `quick_reset` answers when the reset thread must do it
QUICK_ENTRIES = 16  # a folder with at most this many entries, none a folder, is emptied inline


async def reset_env(
    env: Environment, holder: _Holder, e: EnvCgroups, userns: int | None = None
) -> str | None:
    """Reset `env`'s sandbox: on the loop when what the request left is small and simple
    (`quick_reset`: the common case, ~20 system calls), else in the reset thread (`reset`):
    a thread hop and the lock the two threads then pass back and forth cost more CPU than
    such a reset itself (measured: ~0.8 ms per `/run_code` request on 2 cores). Rootless
    (`userns`, the environment's user namespace): all of it in a child that joined it, which
    alone may reach the files of the environment's uid and join its IPC namespace."""
    if userns is not None:
        why = _unusable(env, holder)  # (here: the child is not the holder's parent)
        if why is not None:
            return why
        return await asyncio.to_thread(_reset_rootless, env, holder, e, userns)
    why = quick_reset(env, holder, e)
    if why is SLOW:
        return await asyncio.get_running_loop().run_in_executor(_RESETS, reset, env, holder, e)
    return why


def _unusable(env: Environment, holder: _Holder) -> str | None:
    if holder.spawner is None or not holder.healthy():
        return "its sandbox is not running"
    if env.root is not None or env.lower is not None or env.network:
        return "it has an image root or the host's network"
    return None


def quick_reset(env: Environment, holder: _Holder, e: EnvCgroups) -> str | None:
    """The reset, on the loop, where it is bounded: no process but the sandbox's own is left
    (one counter read), no System V IPC object (listings the reset thread opened inside its
    namespace at the first reset: such a listing reads the namespace it was opened in), and
    each wiped folder holds at most `QUICK_ENTRIES` entries, none a folder. `SLOW` otherwise."""
    why = _unusable(env, holder)
    if why is not None:
        return why
    if holder.mounts is None or holder.ipc_lists is None:  # the first reset: the thread's
        return SLOW
    if not fs.alone(e.folders.get("pids"), holder.own) or _has_ipc(holder.ipc_lists):
        return SLOW
    dirfd = hold.open_holder(holder.pid, holder.started)
    if dirfd is None:
        return "its sandbox's init is gone"
    try:
        found = [_few_files(f, inside, m) for f, inside, m in _wiped(env, dirfd, holder.mounts)]
        if any(names is None for names in found):
            return SLOW
        left = [p for names in found for n in names or () for p in remove_tree(n)]
        return f"could not remove {'; '.join(left[:3])}" if left else None
    finally:
        os.close(dirfd)


def _wiped(env: Environment, dirfd: int, mounts: frozenset[str]):
    """The folders a reset empties, each with the name prefix and the mounts it keeps: the
    work folder (which holds no mount: its entries' names are not the sandbox's paths), then
    the sandbox's own /tmp and /dev/shm through its init's root."""
    yield env.workdir, "", frozenset()
    for inside in INSIDE_WIPED:
        yield f"/proc/self/fd/{dirfd}/root/{inside}", f"/{inside}", mounts


def _few_files(folder: str, inside: str, mounts: frozenset[str]) -> list[str] | None:
    """The paths of `folder`'s entries when they are at most `QUICK_ENTRIES`, none a folder;
    None otherwise, or when it cannot be read. The sandbox's own mounts are kept, and a folder
    that holds one (a read-only bind of the server's Python under /tmp) is looked into."""
    try:
        with os.scandir(folder) as it:
            entries = [e for _, e in zip(range(QUICK_ENTRIES + 1), it)]
    except OSError:
        return None
    paths: list[str] = []
    for entry in entries:
        named = f"{inside}/{entry.name}"
        if named in mounts:
            continue
        if any(m.startswith(named + "/") for m in mounts):
            below = _few_files(entry.path, named, mounts)
            if below is None:
                return None
            paths += below
        elif entry.is_dir(follow_symlinks=False):
            return None
        else:
            paths.append(entry.path)
        if len(paths) > QUICK_ENTRIES:
            return None
    return paths if len(entries) <= QUICK_ENTRIES else None


def _has_ipc(lists: tuple[int, ...]) -> bool:
    """Whether any System V IPC object is listed (each listing: a header line, then one line
    per object); True when a listing cannot be read."""
    try:
        return any(os.pread(fd, 65536, 0).count(b"\n") > 1 for fd in lists)
    except OSError:
        return True


def reset(env: Environment, holder: _Holder, e: EnvCgroups) -> str | None:
    """Reset `env`'s sandbox (blocking, in the reset thread: `reset_env`); None when done,
    else why not."""
    why = _unusable(env, holder)
    return why if why is not None else _reset_usable(env, holder, e)


def _reset_usable(env: Environment, holder: _Holder, e: EnvCgroups) -> str | None:
    why = None if fs.alone(e.folders.get("pids"), holder.own) else _kill_leftovers(e, holder)
    if why is not None:
        return why
    dirfd = hold.open_holder(holder.pid, holder.started)
    if dirfd is None:
        return "its sandbox's init is gone"
    try:
        if holder.mounts is None:
            holder.mounts = _mount_points(dirfd)
        left = [
            p for f, inside, m in _wiped(env, dirfd, holder.mounts) for p in _empty(f, inside, m)
        ]
        if left:
            return f"could not remove {'; '.join(left[:3])}"
        return _clear_ipc(dirfd, holder)
    finally:
        os.close(dirfd)


def _reset_rootless(env: Environment, holder: _Holder, e: EnvCgroups, userns: int) -> str | None:
    """A rootless reset: the leftover processes killed here (the server may signal the
    environment's uid: it owns its user namespace), the files and IPC objects wiped by a
    helper that joined that namespace (`wipe_owned`)."""
    why = None if fs.alone(e.folders.get("pids"), holder.own) else _kill_leftovers(e, holder)
    if why is not None:
        return why
    return in_userns(userns, wipe_owned, env, holder.pid, holder.started)


def wipe_owned(env: Environment, pid: int, started: int) -> str | None:
    """(In the environment's user namespace: `subids.in_userns`) empty the folders a reset
    empties and remove its System V IPC objects, joining its IPC namespace: the process is
    the namespace's helper, which serves this environment only."""
    dirfd = hold.open_holder(pid, started)
    if dirfd is None:
        return "its sandbox's init is gone"
    try:
        mounts = _mount_points(dirfd)
        left = [p for f, inside, m in _wiped(env, dirfd, mounts) for p in _empty(f, inside, m)]
        if left:
            return f"could not remove {'; '.join(left[:3])}"
        _HERE.resets = True
        return _clear_ipc(dirfd, _NoListings())
    finally:
        os.close(dirfd)


class _NoListings:
    """(A holder's stand-in for `_clear_ipc` in a helper: it keeps no listings.)"""

    ipc_lists = ()


def _kill_leftovers(e: EnvCgroups, holder: _Holder) -> str | None:
    """Kill what the commands left in the exec slots; None when only the sandbox's own
    processes remain, else why not."""
    for slot in e.slots:
        folder = slot.folders["cpu"]
        if slot is not holder.slot and fs.pids(folder):  # (one read where nothing was left)
            fs.kill_all(folder)
            if fs.pids(folder):
                return "processes of its commands did not die"
    stray = set(fs.pids(holder.slot.folders["cpu"])) - holder.own
    return f"processes {sorted(stray)} beside its init" if stray else None


def _empty(folder: str, inside: str = "", mounts: frozenset[str] = frozenset()) -> list[str]:
    """Remove everything in `folder` (the sandbox's `inside`), keeping the folder and the
    sandbox's own mounts below it (`mounts`, as the sandbox names them: a read-only bind of
    the server's Python under /tmp, say) with the folders that hold them; returns what could
    not be removed. Nothing of the sandbox but its init and spawner runs, and a command can
    mount nothing, so the mounts are those the sandbox was set up with."""
    left: list[str] = []
    try:
        names = os.listdir(folder)
    except OSError as exc:
        return [f"{folder}: {exc.strerror}"]
    for name in names:
        path, named = os.path.join(folder, name), f"{inside}/{name}"
        if named in mounts:
            continue
        if any(m.startswith(named + "/") for m in mounts):  # holds a mount: empty around it
            left += _empty(path, named, mounts)
        else:
            left += remove_tree(path)
    return left


def _mount_points(dirfd: int) -> frozenset[str]:
    """The mount points of the sandbox's mount namespace, as its own paths (from its init's
    mountinfo: field 5, with the kernel's octal escapes undone)."""
    fd = os.open("mountinfo", os.O_RDONLY | os.O_CLOEXEC, dir_fd=dirfd)
    with os.fdopen(fd) as f:
        points = [line.split()[4] for line in f if line.strip()]
    return frozenset(_unescape(p) for p in points)


def _unescape(path: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), path)


def _clear_ipc(dirfd: int, holder: _Holder) -> str | None:
    """Remove every System V IPC object of the namespace of the process `dirfd` names: this
    thread (the reset thread, `_RESETS`) joins that namespace first; there, it opens the
    listings `quick_reset` reads later (`holder.ipc_lists`) if it has not yet."""
    if not getattr(_HERE, "resets", False):  # would leave a server thread in its namespace
        return "not in the reset thread"
    try:
        ns = os.open("ns/ipc", os.O_RDONLY | os.O_CLOEXEC, dir_fd=dirfd)
    except OSError as exc:
        return f"cannot open its IPC namespace ({exc.strerror})"
    try:
        if _libc.setns(ns, CLONE_NEWIPC) != 0:
            return f"cannot join its IPC namespace ({os.strerror(ctypes.get_errno())})"
    finally:
        os.close(ns)
    why = _remove_ipc_objects()
    if why is None and holder.ipc_lists is None:
        flags = os.O_RDONLY | os.O_CLOEXEC
        holder.ipc_lists = tuple(os.open(f"/proc/sysvipc/{k}", flags) for k in _SYSVIPC)
    return why


def _remove_ipc_objects() -> str | None:
    """In the joined namespace: /proc/sysvipc lists the reader's own namespace's objects."""
    for kind, call in _SYSVIPC.items():
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                rows = f.read().splitlines()[1:]
        except OSError as exc:
            return f"cannot list its {kind} objects ({exc.strerror})"
        remove = getattr(_libc, call)
        for row in rows:
            ident = int(row.split()[1])
            args = (ident, 0, IPC_RMID, None) if kind == "sem" else (ident, IPC_RMID, None)
            rc = remove(*args)
            if rc != 0 and ctypes.get_errno() not in (22, 43):  # EINVAL, EIDRM: already gone
                return f"cannot remove {kind} {ident} ({os.strerror(ctypes.get_errno())})"
    return None

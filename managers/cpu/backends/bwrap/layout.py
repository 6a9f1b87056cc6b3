"""The pieces of a bwrap sandbox that are not the backend's state: where things are inside,
the host files every sandbox sees, the uid drop, the holder's payload and its record
(`_Holder`). Split from `bwrap` by job; see it for what the sandbox is."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import select
import shlex
import subprocess
import sys
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from managers.cpu.backends.base import EnvironmentBroken
from managers.cpu.backends.bwrap import holder as hold
from managers.cpu.backends.bwrap import spawner as fast
from managers.cpu.backends.bwrap import toolkit
from managers.cpu.backends.cgroup import fs
from managers.cpu.backends.cgroup.backend import JOIN_FAILED, EnvCgroups, Slot, joined
from managers.cpu.environments import Environment
from tangram.errors import BackendUnavailable

INSIDE_WORK = "/sandbox"  # not /work: the server's own Python may live under /work
INSIDE_SUPPORT = "/opt/tangram"
# + net; + cgroup, made by bwrap or before it (`rooted_at_env`)
ISOLATE = ("--unshare-pid", "--unshare-ipc", "--unshare-uts")
NAMESPACES = ("mnt", "pid", "net", "ipc", "uts", "cgroup")
HOLDER_START_S = 10.0
HOLDER_SCRIPT = "echo ready; exec sleep infinity"
HOLDER_LAUNCHER = "start-spawner.sh"  # in the support folder: see `_install_launcher`
SYSTEM_LINKS = ("bin", "lib", "lib32", "lib64", "libx32", "sbin")
# runs the seccomp loader inside (always visible: /usr is bound); else the server's own
LOADER_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else None


# the one thread that starts every sandbox (`BwrapSandbox.start_holder`): it lives as long as
# the process, so bwrap's --die-with-parent (which follows the spawning thread) holds
SPAWNING = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tangram-sandbox-spawn")


def discard_spawned(done: Future) -> None:
    """Kill a sandbox started for an open that was cancelled meanwhile."""
    if done.cancelled() or done.exception() is not None:
        return
    proc, info_r, ours = done.result()
    with contextlib.suppress(ProcessLookupError):
        proc.kill()
    with contextlib.suppress(OSError):
        os.close(info_r)
    if ours is not None:
        ours.close()
    with contextlib.suppress(Exception):
        proc.wait(5)


def server_python() -> tuple[str, ...]:
    """The folders of the server's own Python (its virtual environment and base installation),
    outside /usr: bound read-only at their own paths where the kernel refuses the views that
    hide them (`bwrap.views`), so that commands can run `sys.executable`."""
    found: list[str] = []
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix):
        real = os.path.realpath(p)
        if (
            not real.startswith(("/usr/", "/etc/"))
            and real not in ("/", "/usr")
            and real not in found
        ):
            found.append(real)
    return tuple(found)


def _system_binds(ro_paths: tuple[str, ...]) -> list[str]:
    """The read-only host files every sandbox sees: /usr, /etc, the merged-/usr links (or the
    folders themselves on a host without merged /usr); `_extra_binds` adds `ro_paths` after the
    sandbox's own /tmp is mounted (a virtual environment under /tmp stays visible)."""
    args = ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    for name in SYSTEM_LINKS:
        host = Path("/") / name
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir():
            args += ["--ro-bind", str(host), str(host)]
    return args


def _extra_binds(ro_paths: tuple[str, ...]) -> list[str]:
    """Each of `ro_paths` that exists, read-only at its own path, below folders that the
    sandbox's user may enter (the host's may be root's only, like /root). Given after the
    sandbox's mounts, so a path under /tmp or /opt is not hidden by them."""
    args: list[str] = []
    made: set[str] = {"/", "/tmp", "/opt", "/usr", "/etc", "/proc", "/dev"}
    for p in ro_paths:
        for parent in reversed(Path(p).parents[:-1]):
            if str(parent) not in made:
                made.add(str(parent))
                args += ["--perms", "0755", "--dir", str(parent)]
        args += ["--ro-bind-try", p, p]
    return args


def rooted_at_env(e: EnvCgroups, slot: Slot, unshare: str, argv: tuple[str, ...]) -> list[str]:
    """The holder's start on cgroup v1 (`argv`: bwrap, without --unshare-cgroup): its shell
    joins the environment's own cgroups, makes the cgroup namespace there (`unshare`), then
    joins its slot; so the sandbox sees its environment's cgroup as `/` and each exec's slot as
    `/x<i>`, never a path that climbs out of it (`/../x1`). (Cgroup v2 lets no process into a
    cgroup with slots below it: there bwrap makes the namespace, in the holder's slot.)"""
    writes = " && ".join(
        f"echo 0 >{shlex.quote(str(f / 'cgroup.procs'))}" for f in dict.fromkeys(e.folders.values())
    )
    join = f"{{ {writes}; }} 2>/dev/null || {{ echo '{JOIN_FAILED}' >&2; exit 125; }}"
    return joined(join, (unshare, "--cgroup", *joined(slot.join, argv)))


def _drop_to(uid: int) -> list[str]:
    """`setpriv` as the sandbox's last step: the uid, no groups, no capabilities, no_new_privs."""
    return [
        "setpriv",
        f"--reuid={uid}",
        f"--regid={uid}",
        "--clear-groups",
        "--no-new-privs",
        "--bounding-set=-all",
        "--inh-caps=-all",
        "--ambient-caps=-all",
        "--",
    ]


def _descriptors_to_spare() -> bool:
    """True while this process uses under half its open-file limit: a spawner holds one
    descriptor per environment (its socket), so past that new environments take the nsenter
    path, which holds none (`holder`), and the capacity stays that of the limit."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return True
    try:
        return len(os.listdir("/proc/self/fd")) < soft // 2
    except OSError:
        return False


def image_root(env: Environment) -> str | None:
    """The image tree that is the sandbox's root (its merged layers as root; rootless, its
    lower layer: the overlay is mounted inside), None for the host's system files."""
    return env.root if env.root is not None else env.lower


def _idle(env: Environment) -> list[str]:
    """The holder's payload: say ready, then sleep (with the host's programs in an image)."""
    if image_root(env) is None:
        return ["sh", "-c", HOLDER_SCRIPT]
    return [
        *toolkit.run(INSIDE_SUPPORT, "sh"),
        "-c",
        'echo ready; exec "$@"',
        "sh",
        *toolkit.run(INSIDE_SUPPORT, "sleep"),
        "infinity",
    ]


def launcher_script(spawner: tuple[str, ...]) -> str:
    """The spawner's start script (`BwrapBackend._install_launcher`): $1 is the uid, $2 the
    spawner's socket."""
    drop = " ".join(_drop_to(0)).replace("=0", '="$1"')  # --reuid="$1" --regid="$1"
    return f'exec {drop} {" ".join(spawner)} "$2" {INSIDE_WORK}\n'


def image_loader(env: Environment, loader: tuple[str, ...]) -> tuple[str, ...]:
    """The seccomp loader for a sandbox whose root is an image: the native one (`loader`, the
    backend's), run by the host's copied dynamic loader (the Python one needs the host's
    Python, not there)."""
    if len(loader) != 1:
        raise EnvironmentBroken(
            f"environment {env.id} has an image root, whose commands "
            "need the native seccomp loader: install a C compiler (cc)"
        )
    return tuple(toolkit.run_path(INSIDE_SUPPORT, loader[0]))


@dataclass(slots=True)
class _Holder:
    """An environment's long-lived sandbox: the bwrap process and its init (by PID and start
    time), whose namespaces each exec enters."""

    proc: subprocess.Popen
    pid: int  # the sandbox's init, whose namespaces each exec enters (see `holder`)
    started: int  # its start time: a recycled PID never passes for it
    slot: Slot  # the cgroup slot it lives in (a restarted holder reuses it)
    spawner: fast.Spawner | None = None  # the fast path (`spawner.py`), where it runs
    own: frozenset[int] = frozenset()  # the processes in its slot once it was up (a reset's check)
    # its mount points as it names them, read at its first reset: they never change after its
    # set-up (its commands can mount nothing: the seccomp filter refuses every mount call)
    mounts: frozenset[str] | None = None
    # /proc/sysvipc listings opened inside its IPC namespace (`bwrap.reset`), read from outside
    ipc_lists: tuple[int, ...] | None = None

    def alive(self) -> bool:
        return self.proc.poll() is None

    def healthy(self) -> bool:
        """Alive, and so is its spawner (a command of the sandbox may have killed it)."""
        return self.alive() and (self.spawner is None or self.spawner.dead is None)

    def release(self) -> None:
        for fd in self.ipc_lists or ():
            hold.close_quietly(fd)
        self.ipc_lists = None
        if self.spawner is not None:
            self.spawner.close()
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        with contextlib.suppress(Exception):
            self.proc.wait(5)


def kill_rest(e: EnvCgroups | None, leaf: Path, holder: _Holder) -> None:
    """After an exec: kill what is left in its slot `leaf`, unless nothing is left anywhere in
    the environment `e` but the sandbox's own processes (one counter read, not a listing)."""
    if e is None or not fs.alone(e.folders.get("pids"), holder.own):
        fs.kill_all(leaf)


def hold_ready(env: Environment, slot: Slot, proc: subprocess.Popen, info_r: int) -> _Holder:
    """Wait until the sandbox is set up, then open its namespaces."""
    try:
        with os.fdopen(info_r, "rb") as info:
            raw = info.read()  # bwrap closes it once its init runs
        pid = int(json.loads(raw)["child-pid"])
        # the payload starts only when every mount is in place: enter no sooner
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], HOLDER_START_S)
        if not ready or proc.stdout.readline() != b"ready\n":
            raise OSError(f"no sign of life within {HOLDER_START_S:g} s")
        started = hold.start_time(pid)
        if started is None:
            raise OSError("the sandbox's init exited")
    except (ValueError, KeyError, OSError) as exc:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait(HOLDER_START_S)
        assert proc.stderr is not None
        err = proc.stderr.read().decode(errors="replace").strip()
        raise BackendUnavailable(
            f"the sandbox of environment {env.id} did not start ({err or exc})"
        ) from exc
    finally:
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    return _Holder(proc, pid, started, slot)


def trial_argv(uid: int) -> list[str]:
    """A sandbox as every environment gets one, running `/bin/true` as `uid`: the probe that
    bubblewrap works here (as root, or inside a user namespace rootless)."""
    return [
        "bwrap",
        *ISOLATE,
        "--unshare-cgroup",
        "--unshare-net",
        *_system_binds(()),
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--",
        *_drop_to(uid),
        "/bin/true",
    ]

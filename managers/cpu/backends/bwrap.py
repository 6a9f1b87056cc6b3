"""The `bwrap` backend: the cgroup backend's grant, with each exec in a bubblewrap sandbox (root).

Each environment has one long-lived sandbox: `bwrap` (as root, so it can mount what the sandbox
sees) holding the namespaces below with an idle `sleep` (the holder, in a cgroup slot of its own
inside the environment's cgroup). What an exec runs: the cgroup backend's joining shell (as
root, it moves itself into the exec's slot cgroup: cpuset, quota, and the environment's memory
and pids limits), which `exec`s `nsenter` into the holder's namespaces (named by file
descriptors this backend holds open, so a recycled PID can never redirect it), which runs
`setpriv` to become the environment's own unprivileged uid (`uid_base` + a slot number, never 0)
with every capability set cleared (the bounding set too) and `no_new_privs` set, which `exec`s
the command. Entering costs a few milliseconds where building a sandbox per exec costs ~15.
A holder that died is restarted before the next exec. Inside:

- a new mount namespace holding only the host's system files, read-only (`/usr`, `/etc` and
  the `/bin`, `/lib*`, `/sbin` links, the server's Python installation so `sys.executable` runs,
  plus `ro_paths`), a fresh `/proc` of its own PID namespace, a minimal `/dev`, a private `/tmp`
  (tmpfs, one per environment) and the environment's work directory, writable, at `/sandbox`
  (HOME). No `/sys`, no cgroup files, no other environment's folders;
- with an image (`Environment.root`, see `managers.cpu.layers`): that tree is `/` instead (the
  host's system files, the server's Python and the tmpfs `/tmp` are not there; `/tmp` and
  `/sandbox` are the image's, in the environment's writable layer), and the sandbox starts and
  is entered with the host's `setpriv`, `sh` and `sleep` run through the host's loader from
  `/opt/tangram/host` (`toolkit`), so an image needs none of them;
- new PID, IPC, UTS and cgroup namespaces; a new network namespace (loopback only) unless the
  environment was opened with `network=True`;
- `--die-with-parent`: the sandbox and everything in its PID namespace die with the server;
  every command starts in a session of its own, with no terminal.

Each environment has its own host uid and its work directory is mode 0700, owned by it, so an
environment cannot read another's files even where it could name them. There is no user
namespace around the command (bwrap would then resolve mounts as that uid, and the server's
Python often lives under a folder only root may enter); a command may create one of its own, as
any unprivileged user may, which gives it no access to anything its uid lacks. The price is the
namespace setup per exec (`tangram bench exec` measures it beside raw subprocess).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from managers.cpu.backends import toolkit
from managers.cpu.backends.base import EnvironmentBroken, register
from managers.cpu.backends.cgroup import DEFAULT_PIDS_MAX, CgroupBackend, Slot, joined
from managers.cpu.grant import SAFE_PATH, command_env
from managers.cpu.pool import Environment
from managers.cpu.request import Command, argv_of
from tangram.errors import BackendUnavailable, ValidationError
from tangram.results import Result

DEFAULT_UID_BASE = 2_000_000  # far above the host's users and the usual subuid ranges
INSIDE_WORK = "/sandbox"  # not /work: the server's own Python may live under /work
INSIDE_SUPPORT = "/opt/tangram"
ISOLATE = ("--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup")  # + net
NAMESPACES = ("mnt", "pid", "net", "ipc", "uts", "cgroup")
NSENTER_FLAG = {"mnt": "--mount", "pid": "--pid", "net": "--net", "ipc": "--ipc", "uts": "--uts",
                "cgroup": "--cgroup"}
HOLDER_START_S = 10.0
SYSTEM_LINKS = ("bin", "lib", "lib32", "lib64", "libx32", "sbin")


def server_python() -> tuple[str, ...]:
    """The folders of the server's own Python (its virtual environment and base installation),
    outside /usr: bound read-only so that commands can run `sys.executable`."""
    found: list[str] = []
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix):
        real = os.path.realpath(p)
        if not real.startswith(("/usr/", "/etc/")) and real not in ("/", "/usr") \
                and real not in found:
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


def _drop_to(uid: int) -> list[str]:
    """`setpriv` as the sandbox's last step: the uid, no groups, no capabilities, no_new_privs."""
    return ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs",
            "--bounding-set=-all", "--inh-caps=-all", "--ambient-caps=-all", "--"]


def _idle(env: Environment) -> list[str]:
    """The holder's payload: say ready, then sleep (with the host's programs in an image)."""
    if env.root is None:
        return ["sh", "-c", "echo ready; exec sleep infinity"]
    return [*toolkit.run(INSIDE_SUPPORT, "sh"), "-c", 'echo ready; exec "$@"', "sh",
            *toolkit.run(INSIDE_SUPPORT, "sleep"), "infinity"]


@dataclass(slots=True)
class _Holder:
    """An environment's long-lived sandbox: the bwrap process and its namespaces, held open."""

    proc: subprocess.Popen
    fds: dict[str, int]  # namespace -> an open fd of /proc/<sandbox init>/ns/<namespace>
    slot: Slot  # the cgroup slot it lives in (a restarted holder reuses it)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def release(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        with contextlib.suppress(Exception):
            self.proc.wait(5)
        for fd in self.fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()


class BwrapBackend(CgroupBackend):
    name = "bwrap"
    roots = True

    def __init__(self, parent: str | None = None, pids_max: int = DEFAULT_PIDS_MAX,
                 uid_base: int = DEFAULT_UID_BASE, ro_paths: tuple[str, ...] | None = None
                 ) -> None:
        """`uid_base`: environments run as uid_base, uid_base + 1, ... on the host (must not
        be anyone's uid); `ro_paths`: the host paths each sandbox sees read-only besides the
        system's (a toolchain under /opt, a virtual environment); default: the server's own
        Python (`server_python`), () for none."""
        if ro_paths is None:
            ro_paths = server_python()
        if isinstance(uid_base, bool) or not isinstance(uid_base, int) or uid_base < 1000:
            raise ValidationError("cpu.uid_base", uid_base,
                                  "must be an integer >= 1000 (the first sandbox uid)")
        if isinstance(ro_paths, str) or not all(isinstance(p, str) and p.startswith("/")
                                                for p in ro_paths):
            raise ValidationError("cpu.ro_paths", ro_paths, "must be a list of absolute paths")
        why = self.probe()
        if why is not None:
            raise BackendUnavailable(why)
        super().__init__(parent, pids_max)
        self.uid_base = uid_base
        self._uids: dict[str, int] = {}
        self._holders: dict[str, _Holder] = {}
        self._system = _system_binds(())
        self._extra = _extra_binds(tuple(ro_paths))
        self._bwrap = shutil.which("bwrap") or "bwrap"

    @classmethod
    def probe(cls) -> str | None:
        why = CgroupBackend.probe()
        if why is not None:
            return why
        missing = [t for t in ("bwrap", "setpriv") if shutil.which(t) is None]
        if missing:
            return (f"{' and '.join(missing)} not found: install bubblewrap (Debian: "
                    f"`apt-get install bubblewrap`; setpriv is in util-linux)")
        trial = ["bwrap", *ISOLATE, "--unshare-net", *_system_binds(()), "--proc", "/proc", "--dev",
                 "/dev", "--", *_drop_to(DEFAULT_UID_BASE), "/bin/true"]
        try:
            done = subprocess.run(trial, capture_output=True, timeout=10, cwd="/", env={})
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"bwrap could not start a sandbox ({exc})"
        if done.returncode != 0:
            return (f"bwrap cannot create a sandbox here ({done.stderr.decode().strip()}): it "
                    f"needs root with CAP_SYS_ADMIN (mount and PID namespaces) and a setpriv "
                    f"that knows --no-new-privs and --bounding-set (util-linux >= 2.33)")
        return None

    def describe(self) -> str:
        limit = f"{self.pids_max} pids" if self.h.pids else "no pids limit"
        return f"bwrap (a sandbox per environment; {super().describe()}; {limit})"

    async def open(self, env: Environment, cores: tuple[int, ...]) -> None:
        await super().open(env, cores)
        taken = set(self._uids.values())
        uid = env.uid if env.uid is not None else next(
            self.uid_base + i for i in range(len(taken) + 1) if self.uid_base + i not in taken)
        if env.root is not None:
            toolkit.install(self.support)
        try:
            os.chown(env.workdir, uid, uid)
            os.chmod(env.workdir, 0o700)
        except OSError as exc:
            await super().close(env)
            raise BackendUnavailable(f"cannot hand the work directory {env.workdir} of "
                                     f"environment {env.id} to its uid {uid} ({exc})") from exc
        self._uids[env.id] = uid
        try:
            slot = self._slot(env, self._envs[env.id])  # never freed: the holder lives in it
            self._confine(slot, cores)
            await self._start_holder(env, slot)
        except BaseException:
            await self.close(env)
            raise

    async def _start_holder(self, env: Environment, slot: Slot) -> None:
        """Start the environment's sandbox in its cgroup slot and hold its namespaces open;
        raises `BackendUnavailable` saying why when it does not come up. Spawned from the
        loop's thread: `--die-with-parent` follows the spawning thread, which lives as long as
        the server."""
        proc, info_r = self._spawn_holder(env, slot)
        self._holders[env.id] = await asyncio.to_thread(self._hold, env, slot, proc, info_r)

    def _spawn_holder(self, env: Environment, slot: Slot) -> tuple[subprocess.Popen, int]:
        info_r, info_w = os.pipe()
        sandbox = (self._bwrap, *ISOLATE, *([] if env.network else ["--unshare-net"]),
                   "--hostname", "tangram", "--die-with-parent", "--cap-drop", "ALL",
                   "--info-fd", str(info_w),
                   *(self._system if env.root is None else ["--bind", env.root, "/"]),
                   "--proc", "/proc", "--dev", "/dev",
                   *(["--perms", "1777", "--tmpfs", "/tmp"] if env.root is None else []),
                   "--bind", env.workdir, INSIDE_WORK, "--perms", "0755", "--dir", "/opt",
                   "--ro-bind", str(self.support), INSIDE_SUPPORT,
                   *(self._extra if env.root is None else []), "--chdir", "/",
                   "--", *_idle(env))
        try:
            proc = subprocess.Popen(joined(slot.join, sandbox), cwd="/", env={"PATH": SAFE_PATH},
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, pass_fds=(info_w,),
                                    start_new_session=True)
        except OSError:
            os.close(info_r)
            raise
        finally:
            os.close(info_w)
        return proc, info_r

    def _hold(self, env: Environment, slot: Slot, proc: subprocess.Popen,
              info_r: int) -> _Holder:
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
            fds = {ns: os.open(f"/proc/{pid}/ns/{ns}", os.O_RDONLY) for ns in NAMESPACES}
        except (ValueError, KeyError, OSError) as exc:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(HOLDER_START_S)
            assert proc.stderr is not None
            err = proc.stderr.read().decode(errors="replace").strip()
            raise BackendUnavailable(f"the sandbox of environment {env.id} did not start "
                                     f"({err or exc})") from exc
        finally:
            for stream in (proc.stdout, proc.stderr):
                if stream is not None:
                    stream.close()
        return _Holder(proc, fds, slot)

    async def exec(self, env: Environment, cores: tuple[int, ...], command: Command,
                   timeout: float, output_cap: int, elastic: bool = False) -> Result:
        holder = self._holders.get(env.id)
        if holder is not None and not holder.alive() and env.id in self._envs:
            holder.release()
            del self._holders[env.id]
            try:
                await self._start_holder(env, holder.slot)
            except BackendUnavailable as exc:
                raise EnvironmentBroken(f"environment {env.id} is broken: {exc}") from exc
        return await super().exec(env, cores, command, timeout, output_cap, elastic)

    def _fds(self, env: Environment) -> tuple[int, ...]:
        holder = self._holders.get(env.id)
        return tuple(holder.fds.values()) if holder is not None else ()

    def _launch(self, env: Environment, join: str, command: Command) -> list[str]:
        holder = self._holders.get(env.id)
        if holder is None or not holder.fds:
            raise EnvironmentBroken(f"environment {env.id} is broken: its sandbox is gone")
        enter = [f"{NSENTER_FLAG[ns]}=/proc/self/fd/{fd}" for ns, fd in holder.fds.items()]
        drop = _drop_to(self._uids[env.id])
        if env.root is not None:  # the image has no setpriv of its own: the host's, copied
            drop = [*toolkit.run(INSIDE_SUPPORT, "setpriv"), *drop[1:]]
        return joined(join, ("nsenter", *enter, f"--wdns={INSIDE_WORK}", "--", *drop,
                             *argv_of(command)))

    def _environ(self, env: Environment, cores: tuple[int, ...], elastic: bool) -> dict[str, str]:
        return command_env(env.id, len(cores), INSIDE_WORK, elastic=elastic,
                           plugin_dir=INSIDE_SUPPORT)

    async def close(self, env: Environment) -> None:
        holder = self._holders.pop(env.id, None)
        await super().close(env)  # kills everything in its cgroups, the holder too
        if holder is not None:
            await asyncio.to_thread(holder.release)
        self._uids.pop(env.id, None)

    def owner(self, env: Environment) -> int | None:
        return self._uids.get(env.id)

    async def suspend(self, env: Environment) -> None:
        holder = self._holders.get(env.id)
        if holder is not None:
            await asyncio.to_thread(holder.release)
        await super().suspend(env)

    async def resume(self, env: Environment) -> None:
        holder = self._holders.pop(env.id, None)
        if holder is not None:
            await self._start_holder(env, holder.slot)

    async def shutdown(self) -> None:
        for holder in self._holders.values():
            holder.release()
        self._holders.clear()
        await super().shutdown()


register("bwrap", BwrapBackend)

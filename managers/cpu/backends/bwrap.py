"""The `bwrap` backend: the cgroup backend's grant, with each exec in a bubblewrap sandbox (root).

Each environment has one long-lived sandbox: `bwrap` (as root, so it can mount what the sandbox
sees) holding the namespaces below with an idle `sleep` (the holder, in a cgroup slot of its own
inside the environment's cgroup). What an exec runs: the cgroup backend's joining shell (as
root, it moves itself into the exec's slot cgroup: cpuset, quota, and the environment's memory
and pids limits), which `exec`s `nsenter` into the holder's namespaces (through a descriptor of
the holder's /proc directory opened per exec and checked against its start time, so a recycled
PID can never redirect it, and the server holds no descriptor per environment: `holder`), which
runs `setpriv` to become the environment's own unprivileged uid (never reused, never another
server's: `managers.cpu.uids`) with every capability set cleared (the bounding set too) and
`no_new_privs` set, which runs the seccomp loader (`managers.cpu.seccomp`: it loads the filter,
then runs the command with its output capped inside the sandbox), which `exec`s the command.
Entering costs a few milliseconds where building a sandbox per exec costs ~15.
The fast path (default, `spawner=True`, where the server's Python is visible inside): the
holder is a resident spawner (`spawner.py`) that starts each command in the exec's slot from
inside the sandbox, with the same uid, capabilities and `no_new_privs` as `setpriv` gives, and
through the same seccomp loader (the holder itself runs under the filter too); the nsenter path
above stays as the reference. A holder (or spawner) that died is restarted before the next exec.
Inside:

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
Python often lives under a folder only root may enter), and the seccomp filter refuses the
command one of its own. bwrap reads its arguments from a descriptor (`--args`), so the
sandbox's init shows no host path in /proc/1/cmdline; `/dev/shm` is a private tmpfs. The price
is the namespace setup per exec (`tangram bench exec` measures it beside raw subprocess).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import resource
import select
import shlex
import shutil
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from managers.cpu import seccomp
from managers.cpu.backends import cgroupfs as fs
from managers.cpu.backends import holder as hold
from managers.cpu.backends import spawner as fast
from managers.cpu.backends import toolkit
from managers.cpu.backends.base import EnvironmentBroken
from managers.cpu.backends.cgroup import DEFAULT_PIDS_MAX, CgroupBackend, Slot, joined
from managers.cpu.backends.limits import raise_if_out_of_files
from managers.cpu.grant import SAFE_PATH, command_env
from managers.cpu.pool import Environment
from managers.cpu.request import Command, argv_of
from managers.cpu.uids import DEFAULT_UID_BASE, UidAllocator
from tangram.errors import BackendUnavailable, ValidationError
from tangram.results import Result

INSIDE_WORK = "/sandbox"  # not /work: the server's own Python may live under /work
INSIDE_SUPPORT = "/opt/tangram"
ISOLATE = ("--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup")  # + net
NAMESPACES = ("mnt", "pid", "net", "ipc", "uts", "cgroup")
HOLDER_START_S = 10.0
HOLDER_SCRIPT = "echo ready; exec sleep infinity"
HOLDER_LAUNCHER = "start-spawner.sh"  # in the support folder: see `_install_launcher`
SYSTEM_LINKS = ("bin", "lib", "lib32", "lib64", "libx32", "sbin")
# runs the seccomp loader inside (always visible: /usr is bound); else the server's own
LOADER_PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable


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


def _idle(env: Environment) -> list[str]:
    """The holder's payload: say ready, then sleep (with the host's programs in an image)."""
    if env.root is None:
        return ["sh", "-c", HOLDER_SCRIPT]
    return [*toolkit.run(INSIDE_SUPPORT, "sh"), "-c", 'echo ready; exec "$@"', "sh",
            *toolkit.run(INSIDE_SUPPORT, "sleep"), "infinity"]


@dataclass(slots=True)
class _Holder:
    """An environment's long-lived sandbox: the bwrap process and its init (by PID and start
    time), whose namespaces each exec enters."""

    proc: subprocess.Popen
    pid: int  # the sandbox's init, whose namespaces each exec enters (see `holder`)
    started: int  # its start time: a recycled PID never passes for it
    slot: Slot  # the cgroup slot it lives in (a restarted holder reuses it)
    spawner: fast.Spawner | None = None  # the fast path (`spawner.py`), where it runs

    def alive(self) -> bool:
        return self.proc.poll() is None

    def healthy(self) -> bool:
        """Alive, and so is its spawner (a command of the sandbox may have killed it)."""
        return self.alive() and (self.spawner is None or self.spawner.dead is None)

    def release(self) -> None:
        if self.spawner is not None:
            self.spawner.close()
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        with contextlib.suppress(Exception):
            self.proc.wait(5)


class BwrapBackend(CgroupBackend):
    name = "bwrap"
    roots = True

    def __init__(self, parent: str | None = None, pids_max: int = DEFAULT_PIDS_MAX,
                 uid_base: int = DEFAULT_UID_BASE, ro_paths: tuple[str, ...] | None = None,
                 spawner: bool = True) -> None:
        """`uid_base`: environments run as uid_base, uid_base + 1, ... on the host (must not
        be anyone's uid); `ro_paths`: the host paths each sandbox sees read-only besides the
        system's (a toolchain under /opt, a virtual environment); default: the server's own
        Python (`server_python`), () for none; `spawner`: start commands through a resident
        spawner in each sandbox (`spawner.py`; needs the server's Python visible inside)
        instead of entering the sandbox per exec."""
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
        self._uid_source = UidAllocator(uid_base)  # a host-wide range of this server's own
        self._uids: dict[str, int] = {}
        self._entering: int | None = None  # the /proc/<holder> fd of the exec being launched
        self._entering_cap = 0  # and its output cap
        self._holders: dict[str, _Holder] = {}
        self._system = _system_binds(())
        self._extra = _extra_binds(tuple(ro_paths))
        self._bwrap = shutil.which("bwrap") or "bwrap"
        python = os.path.realpath(sys.executable)
        self._spawner = spawner and any(python.startswith(p.rstrip("/") + "/")
                                        for p in (*ro_paths, "/usr"))
        self._spawner_installed = False

    @classmethod
    def probe(cls) -> str | None:
        why = CgroupBackend.probe() or seccomp.unavailable()
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
        try:
            # never an earlier environment's, never another server's; a fork's children share
            # their parent's (the files they inherit are its), `Environment.uid`
            uid = env.uid if env.uid is not None else self._uid_source.take()
        except BaseException:
            await super().close(env)
            raise
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
            if self._spawner and not self._spawner_installed:
                fast.install(self.support)
                self._install_launcher()
                self._spawner_installed = True
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
        proc, info_r, ours = self._spawn_holder(env, slot)
        try:
            holder = await asyncio.to_thread(self._hold, env, slot, proc, info_r)
        except BaseException:
            if ours is not None:
                ours.close()
            raise
        holder.spawner = fast.Spawner(ours) if ours is not None else None
        self._holders[env.id] = holder

    def _ensure_bases(self) -> None:
        fresh = not self._made_bases
        super()._ensure_bases()
        if fresh:
            self._filter, native = seccomp.install(self.support)
            self._loader = ((f"{INSIDE_SUPPORT}/{seccomp.NATIVE_NAME}",) if native else
                            (LOADER_PYTHON, "-I", "-S", f"{INSIDE_SUPPORT}/{seccomp.LOADER_NAME}"))

    def _install_launcher(self) -> None:
        """The spawner's start inside: a script in the support folder, so the sandbox's init
        (bwrap's argv) names no host path. $1 is the uid, $2 the spawner's socket."""
        drop = " ".join(_drop_to(0)).replace("=0", '="$1"')  # --reuid="$1" --regid="$1"
        script = self.support / HOLDER_LAUNCHER
        script.write_text(f'exec {drop} {shlex.quote(sys.executable)} -I -S '
                          f'{INSIDE_SUPPORT}/{fast.INSIDE_NAME} "$2" {INSIDE_WORK}\n')
        script.chmod(0o644)

    def _spawn_holder(self, env: Environment, slot: Slot
                      ) -> tuple[subprocess.Popen, int, socket.socket | None]:
        fds: list[int] = []
        info_r = -1
        ours = theirs = None
        try:
            info_r, info_w = os.pipe()
            fds += [info_w]
            filter_fd = hold.data_fd(self._filter.read_bytes())
            fds.append(filter_fd)
            if self._spawner and env.root is None and _descriptors_to_spare():
                # (it needs the server's Python inside, and holds one descriptor here)
                ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                # a script inside starts it, so the sandbox's init shows no host path
                payload = ("/bin/sh", f"{INSIDE_SUPPORT}/{HOLDER_LAUNCHER}",
                           str(self._uids[env.id]), str(theirs.fileno()))
                # only what setpriv needs to drop to the uid and clear every set, itself included
                caps = ["--cap-drop", "ALL",
                        *(a for c in fast.SETPRIV_CAPS for a in ("--cap-add", c))]
            else:
                payload = tuple(_idle(env))
                caps = ["--cap-drop", "ALL"]
            sandbox = [*ISOLATE, *([] if env.network else ["--unshare-net"]),
                       "--hostname", "tangram", "--die-with-parent", *caps,
                       "--info-fd", str(info_w), "--seccomp", str(filter_fd),
                       *(self._system if env.root is None else ["--bind", env.root, "/"]),
                       "--proc", "/proc", "--dev", "/dev",
                       "--perms", "1777", "--tmpfs", "/dev/shm",  # private, charged to the env
                       # an image's /tmp is its own layer's (bounded by its disk)
                       *(["--perms", "1777", "--tmpfs", "/tmp"] if env.root is None else []),
                       "--bind", env.workdir, INSIDE_WORK, "--perms", "0755", "--dir", "/opt",
                       "--ro-bind", str(self.support), INSIDE_SUPPORT,
                       *(self._extra if env.root is None else []), "--chdir", "/"]
            args = hold.args_fd(sandbox)  # /proc/1/cmdline inside: no host path, no PID
            fds.append(args)
            passed = (*fds, *(() if theirs is None else (theirs.fileno(),)))
            proc = subprocess.Popen(joined(slot.join, (self._bwrap, "--args", str(args), "--",
                                                       *payload)),
                                    cwd="/", env={"PATH": SAFE_PATH},
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, pass_fds=passed,
                                    start_new_session=True)
        except OSError as exc:
            if info_r >= 0:
                os.close(info_r)
            if ours is not None:
                ours.close()
            raise_if_out_of_files(exc)
            raise
        finally:
            for fd in fds:
                os.close(fd)
            if theirs is not None:
                theirs.close()
        return proc, info_r, ours

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
            started = hold.start_time(pid)
            if started is None:
                raise OSError("the sandbox's init exited")
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
        return _Holder(proc, pid, started, slot)

    async def exec(self, env: Environment, cores: tuple[int, ...], command: Command,
                   timeout: float, output_cap: int, elastic: bool = False) -> Result:
        holder = self._holders.get(env.id)
        if holder is not None and not holder.healthy() and env.id in self._envs:
            holder.release()
            del self._holders[env.id]
            try:
                await self._start_holder(env, holder.slot)
            except BackendUnavailable as exc:
                raise EnvironmentBroken(f"environment {env.id} is broken: {exc}") from exc
        self._entering_cap = output_cap  # the loader drops output past it, in the sandbox
        return await super().exec(env, cores, command, timeout, output_cap, elastic)

    async def _run(self, env: Environment, slot: Slot, cores: tuple[int, ...],
                   command: Command, timeout: float, output_cap: int, elastic: bool,
                   fds: tuple[int, ...] = ()) -> Result:
        holder = self._holders.get(env.id)
        if holder is None or holder.spawner is None:
            return await super()._run(env, slot, cores, command, timeout, output_cap, elastic,
                                      fds)
        leaf = slot.folders["cpu"]
        # the same loader as the nsenter path: the filter again, and output capped inside
        argv = (*self._loader, f"{INSIDE_SUPPORT}/{seccomp.FILTER_NAME}", str(output_cap),
                *argv_of(command))
        return await holder.spawner.run(argv, env=self._environ(env, cores, elastic),
                                        cgroups=slot.procs, home=holder.slot.procs,
                                        timeout=timeout, output_cap=output_cap,
                                        kill_rest=lambda: fs.kill_all(leaf))

    def _fds(self, env: Environment) -> tuple[int, ...]:
        """Open the holder's /proc directory for this exec (closed in `_fds_done`); `_launch`,
        called right after with no await between, names it."""
        holder = self._holders.get(env.id)
        if holder is not None and holder.spawner is not None:  # the spawner enters nothing
            self._entering = None
            return ()
        self._entering = None if holder is None else hold.open_holder(holder.pid, holder.started)
        return () if self._entering is None else (self._entering,)

    def _fds_done(self, fds: tuple[int, ...]) -> None:
        for fd in fds:
            hold.close_quietly(fd)

    def _launch(self, env: Environment, join: str, command: Command) -> list[str]:
        dirfd, self._entering = self._entering, None
        if dirfd is None:
            raise EnvironmentBroken(f"environment {env.id} is broken: its sandbox is gone")
        drop = _drop_to(self._uids[env.id])
        loader = self._loader
        if env.root is not None:  # the image has none of the host's programs: the copies
            drop = [*toolkit.run(INSIDE_SUPPORT, "setpriv"), *drop[1:]]
            loader = self._image_loader(env)
        loader = (*loader, f"{INSIDE_SUPPORT}/{seccomp.FILTER_NAME}", str(self._entering_cap))
        return joined(join, ("nsenter", *hold.nsenter_args(dirfd, NAMESPACES),
                             f"--wdns={INSIDE_WORK}", "--", *drop, *loader, *argv_of(command)))

    def _image_loader(self, env: Environment) -> tuple[str, ...]:
        """The seccomp loader for a sandbox whose root is an image: the native one, run by the
        host's copied dynamic loader (the Python one needs the host's Python, not there)."""
        if len(self._loader) != 1:
            raise EnvironmentBroken(f"environment {env.id} has an image root, whose commands "
                                    "need the native seccomp loader: install a C compiler (cc)")
        return tuple(toolkit.run_path(INSIDE_SUPPORT, self._loader[0]))

    def _environ(self, env: Environment, cores: tuple[int, ...], elastic: bool) -> dict[str, str]:
        return command_env(env.id, len(cores), INSIDE_WORK, elastic=elastic,
                           plugin_dir=INSIDE_SUPPORT)

    async def close(self, env: Environment) -> None:
        holder = self._holders.pop(env.id, None)
        try:
            await super().close(env)  # kills everything in its cgroups, the holder too
        finally:
            if holder is not None:
                await asyncio.to_thread(holder.release)
            self._uids.pop(env.id, None)  # never handed out again (see `uids`)

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
        holders = list(self._holders.values())
        self._holders.clear()
        await asyncio.to_thread(lambda: [h.release() for h in holders])  # off the loop
        await super().shutdown()

"""The `bwrap` backend: the cgroup backend's grant, with each exec in a bubblewrap sandbox (root).

What an exec runs: the cgroup backend's joining shell (as root, it moves itself into the exec's
slot cgroup: cpuset, quota, and the environment's memory and pids limits), which `exec`s `bwrap`
(as root, so it can mount what the sandbox sees), which runs `setpriv` inside the sandbox to
become the environment's own unprivileged uid (`uid_base` + a slot number, never 0) with every
capability set cleared (the bounding set too) and `no_new_privs` set, which `exec`s the command.
Inside:

- a new mount namespace holding only the host's system files, read-only (`/usr`, `/etc` and
  the `/bin`, `/lib*`, `/sbin` links, the server's Python installation so `sys.executable` runs,
  plus `ro_paths`), a fresh `/proc` of its own PID namespace, a minimal `/dev`, a private `/tmp`
  (tmpfs) and the environment's work directory, writable, at `/sandbox` (HOME). No `/sys`, no
  cgroup files, no other environment's folders;
- new PID, IPC, UTS and cgroup namespaces; a new network namespace (loopback only) unless the
  environment was opened with `network=True`;
- `--die-with-parent` and `--new-session`: the sandbox dies with the server and cannot reach
  the server's terminal.

Each environment has its own host uid and its work directory is mode 0700, owned by it, so an
environment cannot read another's files even where it could name them. There is no user
namespace around the command (bwrap would then resolve mounts as that uid, and the server's
Python often lives under a folder only root may enter); a command may create one of its own, as
any unprivileged user may, which gives it no access to anything its uid lacks. The price is the
namespace setup per exec (`tangram bench exec` measures it beside raw subprocess).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from managers.cpu.backends.base import register
from managers.cpu.backends.cgroup import DEFAULT_PIDS_MAX, CgroupBackend, joined
from managers.cpu.grant import command_env
from managers.cpu.pool import Environment
from managers.cpu.request import Command, argv_of
from tangram.errors import BackendUnavailable, ValidationError

DEFAULT_UID_BASE = 2_000_000  # far above the host's users and the usual subuid ranges
INSIDE_WORK = "/sandbox"  # not /work: the server's own Python may live under /work
INSIDE_SUPPORT = "/opt/tangram"
ISOLATE = ("--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup")  # + net
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
    folders themselves on a host without merged /usr), and any `ro_paths` that exist, each below
    folders that the sandbox's user may enter (the host's may be root's only, like /root)."""
    args = ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    for name in SYSTEM_LINKS:
        host = Path("/") / name
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir():
            args += ["--ro-bind", str(host), str(host)]
    made: set[str] = set()
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


class BwrapBackend(CgroupBackend):
    name = "bwrap"

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
        self._system = _system_binds(tuple(ro_paths))
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
        return f"bwrap (sandbox per exec; {super().describe()}; {limit})"

    async def open(self, env: Environment, cores: tuple[int, ...]) -> None:
        await super().open(env, cores)
        taken = set(self._uids.values())
        uid = next(self.uid_base + i for i in range(len(taken) + 1)
                   if self.uid_base + i not in taken)
        try:
            os.chown(env.workdir, uid, uid)
            os.chmod(env.workdir, 0o700)
        except OSError as exc:
            await super().close(env)
            raise BackendUnavailable(f"cannot hand the work directory {env.workdir} of "
                                     f"environment {env.id} to its uid {uid} ({exc})") from exc
        self._uids[env.id] = uid

    def _launch(self, env: Environment, join: str, command: Command) -> list[str]:
        sandbox = [
            self._bwrap, *ISOLATE, *([] if env.network else ["--unshare-net"]),
            "--hostname", "tangram", "--die-with-parent", "--new-session",
            *self._system, "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
            "--bind", env.workdir, INSIDE_WORK, "--perms", "0755", "--dir", "/opt",
            "--ro-bind", str(self.support), INSIDE_SUPPORT,
            "--chdir", INSIDE_WORK, "--", *_drop_to(self._uids[env.id]), *argv_of(command)]
        return joined(join, tuple(sandbox))

    def _environ(self, env: Environment, cores: tuple[int, ...], elastic: bool) -> dict[str, str]:
        return command_env(env.id, len(cores), INSIDE_WORK, elastic=elastic,
                           plugin_dir=INSIDE_SUPPORT)

    async def close(self, env: Environment) -> None:
        await super().close(env)
        self._uids.pop(env.id, None)


register("bwrap", BwrapBackend)

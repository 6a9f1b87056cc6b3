"""The `bwrap` backend: the cgroup backend's grant, with each exec in a bubblewrap sandbox (root).

What an exec runs: the cgroup backend's joining shell (as root, it moves itself into the exec's
slot cgroup: cpuset, quota, and the environment's memory and pids limits), which then `exec`s
`setpriv` to drop to the environment's own unprivileged uid, which `exec`s `bwrap`. Inside:

- a new mount namespace holding only the host's system files, read-only (`/usr`, `/etc` and
  the `/bin`, `/lib*`, `/sbin` links, plus `ro_paths`), a fresh `/proc` of its own PID
  namespace, a minimal `/dev`, a private `/tmp` (tmpfs) and the environment's work directory,
  writable, at `/work` (HOME). No `/sys`, no cgroup files, no other environment's folders;
- new PID, IPC, UTS and cgroup namespaces; a new network namespace (loopback only) unless the
  environment was opened with `network=True`;
- a user namespace mapping the environment's uid (`uid_base` + a slot number, never 0), with
  every capability dropped, `no_new_privs` set and no nested user namespaces;
- `--die-with-parent` and `--new-session`: the sandbox dies with the server and cannot reach
  the server's terminal.

Each environment has its own host uid and its work directory is mode 0700, owned by it, so an
environment cannot read another's files even where it could name them. The price is the
namespace setup per exec (`tangram bench exec` measures it beside raw subprocess).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from managers.cpu.backends.base import register
from managers.cpu.backends.cgroup import DEFAULT_PIDS_MAX, CgroupBackend, joined
from managers.cpu.grant import command_env
from managers.cpu.pool import Environment
from managers.cpu.request import Command, argv_of
from tangram.errors import BackendUnavailable, ValidationError

DEFAULT_UID_BASE = 2_000_000  # far above the host's users and the usual subuid ranges
INSIDE_WORK = "/work"
INSIDE_SUPPORT = "/opt/tangram"
SYSTEM_LINKS = ("bin", "lib", "lib32", "lib64", "libx32", "sbin")


def _system_binds(ro_paths: tuple[str, ...]) -> list[str]:
    """The read-only host files every sandbox sees: /usr, /etc, the merged-/usr links (or the
    folders themselves on a host without merged /usr), and any `ro_paths` that exist."""
    args = ["--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    for name in SYSTEM_LINKS:
        host = Path("/") / name
        if host.is_symlink():
            args += ["--symlink", os.readlink(host), str(host)]
        elif host.is_dir():
            args += ["--ro-bind", str(host), str(host)]
    for p in ro_paths:
        args += ["--ro-bind-try", p, p]
    return args


class BwrapBackend(CgroupBackend):
    name = "bwrap"

    def __init__(self, parent: str | None = None, pids_max: int = DEFAULT_PIDS_MAX,
                 uid_base: int = DEFAULT_UID_BASE, ro_paths: tuple[str, ...] = ()) -> None:
        """`uid_base`: environments run as uid_base, uid_base + 1, ... on the host (must not
        be anyone's uid); `ro_paths`: more host paths each sandbox sees read-only (a
        toolchain under /opt, a virtual environment)."""
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
        self._setpriv = shutil.which("setpriv") or "setpriv"

    @classmethod
    def probe(cls) -> str | None:
        why = CgroupBackend.probe()
        if why is not None:
            return why
        missing = [t for t in ("bwrap", "setpriv") if shutil.which(t) is None]
        if missing:
            return (f"{' and '.join(missing)} not found: install bubblewrap (Debian: "
                    f"`apt-get install bubblewrap`; setpriv is in util-linux)")
        trial = ["setpriv", f"--reuid={DEFAULT_UID_BASE}", f"--regid={DEFAULT_UID_BASE}",
                 "--clear-groups", "bwrap", "--unshare-all", "--unshare-user",
                 "--disable-userns", "--cap-drop", "ALL", *_system_binds(()), "--proc",
                 "/proc", "--dev", "/dev", "/bin/true"]
        try:
            done = subprocess.run(trial, capture_output=True, timeout=10, cwd="/", env={})
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"bwrap could not start a sandbox ({exc})"
        if done.returncode != 0:
            return (f"bwrap cannot create a sandbox here ({done.stderr.decode().strip()}): the "
                    f"kernel must allow unprivileged user namespaces "
                    f"(sysctl user.max_user_namespaces > 0, kernel.unprivileged_userns_clone=1)")
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
        uid = str(self._uids[env.id])
        sandbox = [
            self._setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
            self._bwrap, "--unshare-user", "--disable-userns", "--unshare-pid", "--unshare-ipc",
            "--unshare-uts", "--unshare-cgroup", *([] if env.network else ["--unshare-net"]),
            "--hostname", "tangram", "--cap-drop", "ALL", "--die-with-parent", "--new-session",
            *self._system, "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
            "--bind", env.workdir, INSIDE_WORK, "--ro-bind", str(self.support), INSIDE_SUPPORT,
            "--chdir", INSIDE_WORK, "--", *argv_of(command)]
        return joined(join, tuple(sandbox))

    def _environ(self, env: Environment, cores: tuple[int, ...], elastic: bool) -> dict[str, str]:
        return command_env(env.id, len(cores), INSIDE_WORK, elastic=elastic,
                           plugin_dir=INSIDE_SUPPORT)

    async def close(self, env: Environment) -> None:
        await super().close(env)
        self._uids.pop(env.id, None)


register("bwrap", BwrapBackend)

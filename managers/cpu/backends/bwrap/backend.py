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
under the same seccomp filter (bwrap loads it before the spawner starts, and the commands
inherit it: no loader per exec); the nsenter path above stays as the reference. A holder (or
spawner) that died is restarted before the next exec.
Inside:

- a new mount namespace holding only the host's system files, read-only (`/usr`, `/etc` and
  the `/bin`, `/lib*`, `/sbin` links, plus `ro_paths`), the server's Python under
  `/opt/tangram/python` (`TANGRAM_PYTHON`), a fresh `/proc` of its own PID namespace, a minimal
  `/dev`, a private `/tmp` (tmpfs, one per environment) and the environment's work directory,
  writable, at `/sandbox` (HOME). No `/sys`, no cgroup files, no other environment's folders.
  Its mount table names no host folder and no server PID: the work folder, the support
  folder and the Python are filesystems of their own on the host (`bwrap.views`);
- with an image (`Environment.root`, see `managers.cpu.layers`): that tree is `/` instead (the
  host's system files, the server's Python and the tmpfs `/tmp` are not there; `/tmp` and
  `/sandbox` are the image's, in the environment's writable layer), and the sandbox starts and
  is entered with the host's `setpriv`, `sh` and `sleep` run through the host's loader from
  `/opt/tangram/host` (`toolkit`), so an image needs none of them;
- new PID, IPC, UTS and cgroup namespaces (on cgroup v1 the latter is rooted at the
  environment's cgroup, `bwrap.layout.rooted_at_env`: each exec's slot shows as `/x<i>`; on v2,
  where no process may sit in a cgroup with slots below it, at the holder's slot, so an exec's
  shows as `/../x<i>`); a new network namespace (loopback only) unless the environment was
  opened with `network=True`;
- `--die-with-parent`: the sandbox and everything in its PID namespace die with the server;
  every command starts in a session of its own, with no terminal.

Each environment has its own host uid and its work directory is mode 0700, owned by it, so an
environment cannot read another's files even where it could name them. There is no user
namespace around the command (bwrap would then resolve mounts as that uid, and the server's
Python often lives under a folder only root may enter), and the seccomp filter refuses the
command one of its own. bwrap reads its arguments from a descriptor (`--args`), so the
sandbox's init shows no host path in /proc/1/cmdline (nor the environment of a command the
host path it was started from: the entering shell's `PWD` is unset); `/dev/shm` is a private
tmpfs. The price
is the namespace setup per exec (`tangram bench exec` measures it beside raw subprocess).

An exec granted GPUs (a vector exec) does not go through the spawner: its cgroup-joining shell
runs `nsenter` into the holder's network, IPC, UTS and cgroup namespaces (not its mounts),
which runs a one-off bwrap (`bwrap.start.device_sandbox_args`) in the holder's PID namespace
(`--pidns`, so its /proc is the environment's) that mounts the environment's files exactly as
the holder does plus, in its own /dev, the granted GPUs' `/dev/nvidia<i>` and the driver's
control nodes that exist (`--dev-bind`, from `device_dir`, default /dev), and no other GPU's
node; then the same uid drop and seccomp loader as the nsenter path (which closes every
descriptor above 2). So the command sees the environment's processes, network and files, the
granted GPUs only, and its own /tmp and /dev/shm (an image's /tmp is the image's, shared). A
granted GPU whose node is missing fails the exec naming `gpus`. (Device nodes are named by the
GPU's index: where the driver's minor numbers differ from NVML's order, point `device_dir` at a
folder that maps them.)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import shlex
import shutil
import socket
import subprocess
import sys
import weakref
from collections.abc import Callable
from typing import Any

from managers.cpu import seccomp, subids
from managers.cpu.backends.base import EnvironmentBroken
from managers.cpu.backends.bwrap import holder as hold
from managers.cpu.backends.bwrap import reset as bwrap_reset
from managers.cpu.backends.bwrap import rootless as rl
from managers.cpu.backends.bwrap import spawner as fast
from managers.cpu.backends.bwrap import toolkit, views
from managers.cpu.backends.bwrap.layout import (
    HOLDER_LAUNCHER,
    INSIDE_SUPPORT,
    INSIDE_WORK,
    LOADER_PYTHON,
    NAMESPACES,
    SPAWNING,
    _descriptors_to_spare,
    _drop_to,
    _extra_binds,
    _Holder,
    _idle,
    _system_binds,
    discard_spawned,
    hold_ready,
    image_loader,
    image_root,
    kill_rest,
    launcher_script,
    rooted_at_env,
    server_python,
)
from managers.cpu.backends.bwrap.start import (
    DEVICE_NAMESPACES,
    IDLE_CAPS,
    device_sandbox_args,
    gpu_device_nodes,
    popen_holder,
    probe_sandbox,
    sandbox_args,
    spawner_payload,
)
from managers.cpu.backends.cgroup import fs
from managers.cpu.backends.cgroup.backend import (
    DEFAULT_PIDS_MAX,
    CgroupBackend,
    CgroupSandbox,
    EnvCgroups,
    Slot,
    joined,
)
from managers.cpu.backends.limits import raise_if_out_of_files
from managers.cpu.environments import Environment
from managers.cpu.images import ImageStore
from managers.cpu.leftovers import owned_name, sweep_workdirs
from managers.cpu.mounts import remove_folder
from managers.cpu.node import default_state_dir
from managers.cpu.request import ExecSpec
from managers.cpu.sessions.shell import (
    HOST_NAME,
    KERNEL_NAME,
    ShellSession,
    host_key,
    install_host,
)
from managers.cpu.uids import DEFAULT_UID_BASE, UidAllocator
from tangram.errors import BackendUnavailable, ValidationError
from tangram.results import Result, Status

log = logging.getLogger(__name__)


class BwrapBackend(CgroupBackend):
    name = "bwrap"
    roots = True
    gpu_mode = "devices"
    isolates = True
    inside_work = INSIDE_WORK
    inside_support = INSIDE_SUPPORT

    def __init__(
        self,
        parent: str | None = None,
        pids_max: int = DEFAULT_PIDS_MAX,
        uid_base: int = DEFAULT_UID_BASE,
        ro_paths: tuple[str, ...] | None = None,
        spawner: bool = True,
        favor_dynmods: bool = True,
        device_dir: str = "/dev",
    ) -> None:
        """`uid_base`: environments run as uid_base, uid_base + 1, ... on the host (must not
        be anyone's uid); `ro_paths`: host paths each sandbox sees read-only at their own
        paths besides the system's and the server's own Python (which it sees under
        /opt/tangram, `TANGRAM_PYTHON`: `bwrap.views`), such as a toolchain under /opt;
        default none; `spawner`: start commands through a resident spawner in each sandbox
        (`spawner.py`) instead of entering the sandbox per exec; `favor_dynmods`: the cgroup
        backend's; `device_dir`: where the GPUs' device nodes are (`nvidia<i>`, `nvidiactl`,
        ...) that an exec granted GPUs gets bound in. Checks its options only: the trial
        sandbox runs at `start`."""
        if ro_paths is None:
            ro_paths = ()
        if isinstance(uid_base, bool) or not isinstance(uid_base, int) or uid_base < 1000:
            raise ValidationError(
                "cpu.uid_base", uid_base, "must be an integer >= 1000 (the first sandbox uid)"
            )
        if isinstance(ro_paths, str) or not all(
            isinstance(p, str) and p.startswith("/") for p in ro_paths
        ):
            raise ValidationError("cpu.ro_paths", ro_paths, "must be a list of absolute paths")
        if not isinstance(device_dir, str) or not device_dir.startswith("/"):
            raise ValidationError("cpu.device_dir", device_dir, "must be an absolute path")
        super().__init__(parent, pids_max, favor_dynmods)
        self.device_dir = device_dir
        self.uid_base = uid_base
        self.ro_paths = tuple(ro_paths)
        self.rootless = rl.rootless()  # no root: a user namespace per environment (`rootless`)
        # rootless, `open_env(image=...)` comes here: the overlay is mounted inside the sandbox
        self.engine_images = self.rootless
        # a host-wide range of this server's own; without root, the user's subordinate range
        self._uid_source: UidAllocator | subids.SubUidAllocator | None = (
            None if self.rootless else UidAllocator(uid_base)
        )
        self._sandboxes: set[BwrapSandbox] = set()  # open ones (their holders: `_shutdown`)
        self._want_spawner = spawner
        self._spawner = False  # decided at `start`
        self._spawner_installed = False
        self._session_host_installed = False
        self._python = sys.executable  # the server's Python inside (`bwrap.views`): at `start`
        self._python_folder = self.support.with_name(owned_name(f"{self.tag}-python"))
        self._python_view: tuple[str, list[str]] | None = None
        self._drop_python: weakref.finalize | None = None
        self._unshare: str | None = None  # v1: makes the holder's cgroup namespace

    def _start(self) -> None:
        if self.rootless and self._uid_source is None:
            self._uid_source = subids.SubUidAllocator(subids.subids())
        super()._start()  # the probe: a trial sandbox; the support folder
        if self._drop_python is None and not self.rootless:
            self._drop_python = weakref.finalize(self, remove_folder, str(self._python_folder))
            self._python_view = views.install_python(
                self._python_folder, self.support, INSIDE_SUPPORT
            )
        if self._python_view is None:  # the kernel refused the views: at its own paths
            self._extra = _extra_binds((*server_python(), *self.ro_paths))
        else:
            self._extra = [*_extra_binds(self.ro_paths), *self._python_view[1]]
        self._python = sys.executable if self._python_view is None else self._python_view[0]
        self._system = _system_binds(())
        self._bwrap = shutil.which("bwrap") or "bwrap"
        v1 = self.h.version == 1 and not self.rootless  # (rootless: bwrap makes it)
        self._unshare = shutil.which("unshare") if v1 else None
        self._spawner = self._want_spawner  # its Python (where it is not native) is there
        if self.rootless:
            self.guarantees_lost = rl.LOST
            self._say_rootless()

    def _say_rootless(self) -> None:
        """What the rootless sandbox runs as and under, and what it lacks beside root's."""
        source = self._uid_source
        assert isinstance(source, subids.SubUidAllocator)
        ids = source.ids
        log.warning(
            "bwrap without root: environments run as %s's subordinate uids (%d-%d), in user "
            "namespaces of their own, under the delegated cgroups %s; lost beside root: %s",
            ids.user,
            ids.uid + 1,
            ids.uid + ids.count - 1,
            self.h.base("cpu").parent,
            rl.LOST,
        )

    def _install_support(self) -> None:
        """The support folder is a tmpfs of its own (`bwrap.views`)."""
        if self._drop_support is None and not self.rootless:  # (a mount: root's)
            try:
                views.own_support(self.support)
            except OSError as exc:
                raise BackendUnavailable(f"cannot mount the support folder ({exc})") from exc
        super()._install_support()

    def inside_python(self, env: Environment) -> str | None:
        return None if image_root(env) is not None else self._python  # an image has its own

    def _own_view(self, env: Environment) -> bool:
        """Give a plain environment's work folder a filesystem of its own (`bwrap.views`);
        whether it did (a disk-bounded one is a layer's overlay already, an image's is the
        image's)."""
        if env.root is not None or os.path.ismount(env.workdir) or self.rootless:
            return False
        try:
            views.own_workdir(env.workdir)
        except OSError as exc:
            raise_if_out_of_files(exc)  # a host limit (503), not a broken mount
            raise BackendUnavailable(
                f"cannot mount the work folder of environment {env.id} ({exc})"
            ) from exc
        return True

    @classmethod
    def probe(cls) -> str | None:
        return rl.probe() if rl.rootless() else probe_sandbox()

    def describe(self) -> str:
        if self._h is None:
            return f"{self.name} (not started)"
        limit = f"{self.pids_max} pids" if self.h.pids else "no pids limit"
        mode = "; rootless: subordinate uids, delegated cgroups" if self.rootless else ""
        return f"bwrap (a sandbox per environment; {super().describe()}; {limit}{mode})"

    async def _open(self, env: Environment, cores: tuple[int, ...]) -> BwrapSandbox:
        if env.image is not None:
            env = await asyncio.to_thread(self._with_image, env)
        sandbox = BwrapSandbox(self, env, self._make_cgroups(env, cores))
        self._workdirs.add(env.workdir)
        try:
            # never an earlier environment's, never another server's (`new_owner`); a fork
            # child's own where layers are idmapped, else its parent's (`Roots.inherited_uid`)
            sandbox.uid = env.uid if env.uid is not None else self.new_owner()
            sandbox.own_workdir = self._own_view(env)
            if self.rootless:
                await asyncio.to_thread(sandbox.enter_userns)
            else:
                self._make_workdir(env, sandbox.uid)
            if image_root(env) is not None:
                toolkit.install(self.support)
            if self._spawner and not self._spawner_installed:
                self._install_launcher(
                    fast.install(self.support, INSIDE_SUPPORT, shlex.quote(self._python))
                )
                self._spawner_installed = True
            slot = await asyncio.to_thread(self._holder_slot, sandbox.cgroups, cores)
            await sandbox.start_holder(slot)
        except BaseException:
            await sandbox._close()
            raise
        self._sandboxes.add(sandbox)
        return sandbox

    def _with_image(self, env: Environment) -> Environment:
        """(Rootless) `env` with its image's tree as the lower layer of the overlay its sandbox
        mounts as / (`rootless.overlay_prefix`); the image is the node's store's, by name or
        digest (`tangram image import`, this user's state folder)."""
        if not self.rootless:
            raise ValidationError("env.image", env.image, "the bwrap backend takes it as root")
        store = ImageStore(f"{default_state_dir()}/images")
        image = store.resolve(env.image or "", "env.image")  # NotFound naming it
        rl.make_image_dirs(env.workdir, image.rootfs)
        return dataclasses.replace(env, lower=image.rootfs)

    def _holder_slot(self, e: EnvCgroups, cores: tuple[int, ...]) -> Slot:
        """The holder's slot (never freed: the holder lives in it) and one exec slot made
        ahead, so the first exec makes none. Run in a thread: each cgroup mkdir takes
        milliseconds, which the event loop would wait for."""
        slot = self._slot(e)
        self._confine(slot, cores)
        ahead = self._slot(e)
        self._confine(ahead, cores)
        e.free.append(ahead)
        return slot

    def _ensure_bases(self) -> None:
        fresh = not self._made_bases
        super()._ensure_bases()
        if fresh and self.rootless:  # (its slots' cgroup.procs are the uids' to write: no
            for base in self.h.distinct():  # other user may list the folders to find them)
                base.chmod(0o711)
        if fresh:
            self._filter, native = seccomp.install(self.support)
            self._loader = (
                (f"{INSIDE_SUPPORT}/{seccomp.NATIVE_NAME}",)
                if native
                else (
                    LOADER_PYTHON or self._python,
                    "-I",
                    "-S",
                    f"{INSIDE_SUPPORT}/{seccomp.LOADER_NAME}",
                )
            )

    def _install_launcher(self, spawner: tuple[str, ...]) -> None:
        """The spawner's start inside (`launcher_script`): the sandbox's init names no host path."""
        script = self.support / HOLDER_LAUNCHER
        script.write_text(launcher_script(spawner))
        script.chmod(0o644)

    def new_owner(self) -> int | None:
        if self._uid_source is None:  # (rootless, before start: the range is read at start)
            self._uid_source = subids.SubUidAllocator(subids.subids())
        try:
            return self._uid_source.take()
        except OSError as exc:
            raise_if_out_of_files(exc)  # a host limit (503)
            raise

    def _sweep_workdirs(self) -> list[str]:
        """Rootless, a dead server's work folders hold its environments' files (their uids'):
        they are swept from a user namespace that maps the whole subordinate range."""
        if not self.rootless:
            return super()._sweep_workdirs()
        source = self._uid_source
        assert isinstance(source, subids.SubUidAllocator)
        try:
            ns = subids.make_range_userns(source.ids)
        except BackendUnavailable as exc:
            return [f"the work folders of dead servers were not swept ({exc})"]
        try:
            parent = str(self.support.parent)
            return list(subids.in_userns(ns, sweep_workdirs, parent, here=True))
        finally:
            os.close(ns)

    def _new_slot(self, e: EnvCgroups, name: str) -> Slot:
        slot = super()._new_slot(e, name)
        if self.rootless:  # the spawner reopens them as the environment's uid
            rl.open_to_uid(slot.procs)
        return slot

    async def _shutdown(self) -> None:
        holders = [sb.holder for sb in self._sandboxes if sb.holder is not None]
        for sb in self._sandboxes:
            sb.holder, sb.open = None, False
        self._sandboxes.clear()
        await asyncio.to_thread(lambda: [h.release() for h in holders])  # off the loop
        try:
            await super()._shutdown()
        finally:
            if self._drop_python is not None:
                await asyncio.to_thread(self._drop_python)
                self._drop_python = None


class BwrapSandbox(CgroupSandbox):
    """An environment of the bwrap backend: its cgroups (the cgroup backend's part), the
    holder that keeps its namespaces open (and its spawner, `holder.spawner`), the uid its
    commands run as, and whether its work folder is a filesystem of its own
    (`own_workdir`)."""

    backend: BwrapBackend

    def __init__(self, backend: BwrapBackend, env: Environment, cgroups: EnvCgroups) -> None:
        super().__init__(backend, env, cgroups)
        self.holder: _Holder | None = None
        self.own_workdir = False
        self.rootless = backend.rootless  # a user namespace of its own (`rootless`)
        self._fresh_ns: int | None = None  # (rootless) one made at open, for its first holder
        self._ns_keys: set[tuple[int, int]] = set()  # (rootless) the namespaces it was reached in

    def enter_userns(self) -> None:
        """(Rootless) make the environment's user namespace and its work folder, handed to its
        uid from inside it; raises `BackendUnavailable` naming what was refused."""
        env = self.env
        try:
            ns = self._fresh_ns = self._new_userns()
            os.makedirs(env.workdir, mode=0o700, exist_ok=True)
            subids.in_userns(ns, rl.make_workdir, env.workdir, self.uid)
        except OSError as exc:
            raise_if_out_of_files(exc)  # a host limit (503)
            raise BackendUnavailable(
                f"cannot hand the work directory {env.workdir} of environment {env.id} to "
                f"uid {self.uid} in its user namespace ({exc})"
            ) from exc

    def _new_userns(self) -> int:
        source = self.backend._uid_source
        assert self.uid is not None and isinstance(source, subids.SubUidAllocator)
        return subids.make_userns(self.uid, source.gid_of(self.uid))

    def _user_ns(self) -> int:
        """(Rootless) a descriptor of the environment's user namespace, the caller's to close:
        its holder's, or a new one mapped alike where the holder is gone (the same uid: the
        same authority over its files). The server keeps none between calls (but one while
        the environment closes: `_close`)."""
        if self._fresh_ns is not None:
            return os.dup(self._fresh_ns)
        holder = self.holder
        dirfd = None if holder is None else hold.open_holder(holder.pid, holder.started)
        if dirfd is not None:
            try:
                return os.open("ns/user", os.O_RDONLY | os.O_CLOEXEC, dir_fd=dirfd)
            except OSError:
                pass
            finally:
                os.close(dirfd)
        return self._new_userns()

    @property
    def launch_cwd(self) -> str:
        return "/" if self.rootless else self.env.workdir  # (nsenter sets its own)

    def owner_call(self, fn: Callable[..., Any], *args: Any, here: bool = False) -> Any:
        """(`here`: `args` hold this process's descriptors: `subids.in_userns`.)"""
        if not self.rootless:
            return fn(*args)
        ns = self._user_ns()
        try:
            st = os.fstat(ns)
            self._ns_keys.add((st.st_dev, st.st_ino))  # (its helper's worker: ended at close)
            return subids.in_userns(ns, fn, *args, here=here)
        finally:
            os.close(ns)

    # -- the holder ----------------------------------------------------------------------------
    async def start_holder(self, slot: Slot) -> None:
        """Start the environment's sandbox in its cgroup slot and hold its namespaces open;
        raises `BackendUnavailable` saying why when it does not come up. Spawned from one
        thread kept for it (`SPAWNING`), not the loop's (a spawn waits for the child's exec):
        `--die-with-parent` follows the spawning thread, which lives as long as the server."""
        env = self.env
        spawned = asyncio.get_running_loop().run_in_executor(SPAWNING, self._spawn_holder, slot)
        try:
            proc, info_r, ours = await asyncio.shield(spawned)
        except asyncio.CancelledError:
            spawned.add_done_callback(discard_spawned)  # the sandbox comes up for no one
            raise
        try:
            holder = await asyncio.to_thread(hold_ready, env, slot, proc, info_r)
        except BaseException:
            if ours is not None:
                ours.close()
            raise
        holder.spawner = fast.Spawner(ours, self.backend.rootless) if ours is not None else None
        holder.own = frozenset(fs.pids(slot.folders["cpu"]))
        self.holder = holder

    def _spawn_holder(self, slot: Slot) -> tuple[subprocess.Popen, int, socket.socket | None]:
        b, env = self.backend, self.env
        fds: list[int] = []
        info_r = -1
        ours = theirs = None
        try:
            info_r, info_w = os.pipe()
            fds += [info_w]
            filter_fd = hold.data_fd(b._filter.read_bytes())
            fds.append(filter_fd)
            if b._spawner and image_root(env) is None and _descriptors_to_spare():
                # (it needs the server's Python inside, and holds one descriptor here)
                ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                assert self.uid is not None
                payload, caps = spawner_payload(self.uid, theirs.fileno())
            else:
                payload, caps = tuple(_idle(env)), IDLE_CAPS
            unshare = b._unshare  # v1: rooted at the environment's cgroup
            ns = None
            if self.rootless:  # (the one made at open, then a new one per restart)
                ns, self._fresh_ns = self._fresh_ns or self._new_userns(), None
            if ns is not None:  # rootless: bwrap as its user namespace's root
                fds.append(ns)
            sandbox = sandbox_args(
                env, caps, info_w, filter_fd, b._system, b._extra, b.support, bool(unshare)
            )
            args = hold.args_fd(sandbox)  # /proc/1/cmdline inside: no host path, no PID
            fds.append(args)
            passed = (*fds, *(() if theirs is None else (theirs.fileno(),)))
            bwrap = (b._bwrap, "--args", str(args), "--", *payload)
            if env.lower is not None:  # (rootless) the image's overlay, mounted inside
                bwrap = (*rl.overlay_prefix(env.lower, env.workdir), *bwrap)
            if ns is not None:
                bwrap = (*rl.holder_prefix(ns), *bwrap)
            argv = (
                joined(slot.join, bwrap)
                if unshare is None
                else rooted_at_env(self.cgroups, slot, unshare, bwrap)
            )
            proc = popen_holder(argv, passed)
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

    async def _heal_holder(self) -> None:
        """Restart the environment's holder (or spawner) where it died."""
        holder = self.holder
        if holder is not None and not holder.healthy() and self.open:
            holder.release()
            self.holder = None
            try:
                await self.start_holder(holder.slot)
            except BackendUnavailable as exc:
                raise EnvironmentBroken(f"environment {self.env.id} is broken: {exc}") from exc

    @property
    def spawned(self) -> bool:
        return self.holder is not None and self.holder.spawner is not None

    # -- commands ------------------------------------------------------------------------------
    async def _run(self, spec: ExecSpec) -> Result:
        b = self.backend
        if spec.gpus:
            _, missing = gpu_device_nodes(b.device_dir, spec.gpus)
            if missing:
                return Result(
                    Status.FAILED,
                    detail=f"gpus: GPUs {','.join(map(str, spec.gpus))} were granted but "
                    f"{', '.join(missing)} is not in {b.device_dir} (no such GPU on this "
                    "machine: is the GPU pool simulated?)",
                )
        await self._heal_holder()
        return await super()._run(spec)

    async def _start(self, slot: Slot, spec: ExecSpec, fds: tuple[int, ...]) -> Result:
        holder = self.holder
        if spec.gpus or holder is None or holder.spawner is None:  # GPUs: the device sandbox
            return await super()._start(slot, spec, fds)
        leaf = slot.folders["cpu"]
        # no loader: the command inherits the spawner's filter (bwrap's --seccomp), and the
        # spawner drains what passes the cap inside the sandbox
        return await holder.spawner.run(
            spec,
            env=self.environ(spec),
            cgroups=slot.procs,
            home=holder.slot.procs,
            kill_rest=lambda: kill_rest(self.cgroups, leaf, holder),
        )

    def _entry(self, spec: ExecSpec) -> tuple[int, ...]:
        """The holder's /proc directory for this exec (closed in `_entry_done`) and, for
        GPUs, its PID namespace and the device sandbox's arguments: what `_launch` enters
        through. Nothing where the spawner starts the command."""
        holder = self.holder
        if holder is not None and holder.spawner is not None and not spec.gpus:
            return ()
        dirfd = None if holder is None else hold.open_holder(holder.pid, holder.started)
        if dirfd is None:
            return ()
        if not spec.gpus:
            return (dirfd,)
        b, pidns = self.backend, None
        try:
            pidns = os.open("ns/pid", os.O_RDONLY | os.O_CLOEXEC, dir_fd=dirfd)
            devices, _ = gpu_device_nodes(b.device_dir, spec.gpus)
            args = device_sandbox_args(
                self.env, b._system, b._extra, b.support, b.device_dir, devices, pidns
            )
            return (dirfd, pidns, hold.args_fd(args))
        except BaseException:
            for fd in (dirfd, pidns):
                hold.close_quietly(fd)
            raise

    def _entry_done(self, fds: tuple[int, ...]) -> None:
        for fd in fds:
            hold.close_quietly(fd)

    def _launch(self, join: str, spec: ExecSpec, fds: tuple[int, ...]) -> list[str]:
        if not fds or (spec.gpus and len(fds) < 3):
            raise EnvironmentBroken(f"environment {self.env.id} is broken: its sandbox is gone")
        devices = fds[2] if spec.gpus else None
        return self._entered(join, spec.argv, fds[0], spec.output_cap, spec.gpus, devices)

    def _entered(
        self,
        join: str,
        argv: list[str],
        dirfd: int,
        cap: int,
        gpus: tuple[int, ...] = (),
        devices: int | None = None,
        detached: bool = False,
    ) -> list[str]:
        """The argv that joins the slot (`join`), enters the holder's namespaces (through
        `dirfd`, its /proc folder; with `gpus`, a device sandbox from the arguments at
        `devices`), drops to the environment's uid and runs `argv` under the seccomp loader,
        which passes `cap` + 1 bytes of each output (`detached`: see `joined`)."""
        b, env = self.backend, self.env
        assert self.uid is not None
        drop = _drop_to(self.uid)
        loader = b._loader
        if image_root(env) is not None:  # the image has none of the host's programs: the copies
            drop = [*toolkit.run(INSIDE_SUPPORT, "setpriv"), *drop[1:]]
            loader = image_loader(env, b._loader)
        loader = (*loader, f"{INSIDE_SUPPORT}/{seccomp.FILTER_NAME}", str(cap))
        if gpus:  # the device sandbox, in the holder's namespaces but its mounts
            enter = (
                "nsenter",
                *hold.nsenter_args(dirfd, DEVICE_NAMESPACES),
                "--",  # (the loader closes every descriptor above 2 before the command)
                b._bwrap,
                "--args",
                str(devices),
                "--",
            )
        else:
            enter = (
                "nsenter",
                *hold.nsenter_args(dirfd, rl.NAMESPACES if b.rootless else NAMESPACES),
                f"--wdns={INSIDE_WORK}",
                "--",
            )
        # (the shell's PWD, the host folder it started in, is not the command's to see)
        return joined(f"{join}\nunset PWD", (*enter, *drop, *loader, *argv), detached)

    # -- the server's own work -----------------------------------------------------------------
    async def _serve_launch(
        self, argv: list[str], cap: int
    ) -> tuple[list[str], tuple[int, ...], Callable[[], None]]:
        await self._heal_holder()
        return await super()._serve_launch(argv, cap)

    def _serve_enter(
        self, join: str, argv: list[str], cap: int
    ) -> tuple[list[str], tuple[int, ...], Callable[[], None]]:
        """Through the reference path (nsenter, setpriv, the loader), never the spawner (whose
        relay keeps output for a result instead of streaming it)."""
        holder = self.holder
        dirfd = None if holder is None else hold.open_holder(holder.pid, holder.started)
        if dirfd is None:
            raise EnvironmentBroken(f"environment {self.env.id} is broken: its sandbox is gone")
        if image_root(self.env) is not None:  # the image has no programs of the host's: the copies
            argv = [*toolkit.run(INSIDE_SUPPORT, argv[0]), *argv[1:]]
        try:
            entered = self._entered(join, argv, dirfd, cap)
        except BaseException:
            hold.close_quietly(dirfd)
            raise
        return entered, (dirfd,), lambda: hold.close_quietly(dirfd)

    # -- shell sessions --------------------------------------------------------------------
    async def start_session_host(
        self, name: str, cores: tuple[int, ...], share: float
    ) -> ShellSession:
        b, env = self.backend, self.env
        python = self._session_python()
        if python is None:
            raise ValidationError(
                "session",
                name,
                f"environment {env.id}'s image has no python3 (/usr/bin/python3), which "
                "the session's host runs on",
            )
        if not b._session_host_installed:
            install_host(b.support)
            b._session_host_installed = True
        await self._heal_holder()
        session = ShellSession(name, host_key(name), None, self._root_fd)
        if self.rootless:  # (its argument is a descriptor of this process's)
            session.owner_call = functools.partial(self.owner_call, here=True)
        # on the loop, as an exec's: two threads would name the same new slot
        session.slot = slot = b._slot(self.cgroups)
        try:
            b._confine(slot, cores, share)
            await self._launch_host(slot, python, session.key, cores)
            await session.wait_ready()
        except BaseException:
            await self.end_session(session)
            raise
        return session

    def kernel_driver(self) -> str | None:
        return None if image_root(self.env) is not None else f"{INSIDE_SUPPORT}/{KERNEL_NAME}"

    def _session_python(self) -> str | None:
        root = image_root(self.env)
        if root is None:
            return self.backend._python
        found = os.path.join(root, "usr/bin/python3")
        return "/usr/bin/python3" if os.path.lexists(found) else None

    async def _launch_host(self, slot: Slot, python: str, key: str, cores: tuple[int, ...]) -> None:
        """Start the host detached in `slot`, entered as a command is (namespaces, uid,
        seccomp loader): the shell that starts it exits at once, so it is no child of the
        server's and the server holds nothing of it."""
        holder = self.holder
        dirfd = None if holder is None else hold.open_holder(holder.pid, holder.started)
        if dirfd is None:
            raise EnvironmentBroken(f"environment {self.env.id} is broken: its sandbox is gone")
        try:
            argv = [python, "-I", "-S", f"{INSIDE_SUPPORT}/{HOST_NAME}", key]
            entered = self._entered(slot.join, argv, dirfd, 1 << 16, detached=True)
            spec = ExecSpec(("bash",), cores, 1.0, 0)
            proc = await asyncio.create_subprocess_exec(
                *entered,
                pass_fds=(dirfd,),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd=self.launch_cwd,
                env=self.environ(spec),
                start_new_session=True,
            )
            await proc.wait()
        finally:
            hold.close_quietly(dirfd)

    def _root_fd(self) -> int | None:
        """A descriptor of the sandbox's root (its init's), None when it is not running."""
        holder = self.holder
        dirfd = None if holder is None else hold.open_holder(holder.pid, holder.started)
        if dirfd is None:
            return None
        try:
            return os.open("root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dirfd)
        except OSError:
            return None
        finally:
            os.close(dirfd)

    def session_cores(
        self, session: ShellSession, cores: tuple[int, ...], share: float | None = None
    ) -> None:
        self.backend._confine(session.slot, cores, share)

    async def end_session(self, session: ShellSession) -> None:
        slot = session.slot
        if slot is None:
            return
        session.slot = None
        await asyncio.to_thread(fs.kill_all, slot.folders["cpu"])
        self.cgroups.free.append(slot)

    # -- life ----------------------------------------------------------------------------------
    async def reset(self) -> str | None:
        if self.holder is None:
            return "its sandbox is not running"
        if not self.rootless:
            return await bwrap_reset.reset_env(self.env, self.holder, self.cgroups)
        ns = self._user_ns()
        try:
            st = os.fstat(ns)
            self._ns_keys.add((st.st_dev, st.st_ino))
            return await bwrap_reset.reset_env(self.env, self.holder, self.cgroups, ns)
        finally:
            os.close(ns)

    async def suspend(self) -> None:
        if self.holder is not None:
            await asyncio.to_thread(self.holder.release)
        await super().suspend()

    async def resume(self) -> None:
        holder, self.holder = self.holder, None
        if holder is not None:
            await self.start_holder(holder.slot)

    async def _remove_workdir(self) -> list[str]:
        if self.own_workdir:
            self.own_workdir = False
            views.drop_workdir(self.env.workdir)  # (then its files, below the mount point, go)
        if self.rootless and self.uid is not None:  # its uid's files: from its namespace
            try:
                await asyncio.to_thread(self.owner_call, rl.remove_workdir, self.env.workdir)
                if self.env.lower is not None:  # its overlay's layers (its uid's files)
                    top = rl.image_dirs(self.env.workdir)["top"]
                    await asyncio.to_thread(self.owner_call, rl.remove_workdir, top)
            except (OSError, BackendUnavailable) as exc:
                return [f"{self.env.workdir}: {exc}"]
        return await super()._remove_workdir()

    async def _close(self) -> None:
        if self.rootless and self._fresh_ns is None and self.uid is not None:
            with contextlib.suppress(OSError, BackendUnavailable):  # (its files' removal)
                self._fresh_ns = self._user_ns()
        holder, self.holder = self.holder, None
        self.backend._sandboxes.discard(self)
        try:
            await super()._close()  # kills everything in its cgroups, the holder too
        finally:
            if holder is not None:
                await asyncio.to_thread(holder.release)
            self._release_userns()

    def _release_userns(self) -> None:
        """(Rootless) give back the user namespace and the uid (its files are gone)."""
        source = self.backend._uid_source
        hold.close_quietly(self._fresh_ns)
        self._fresh_ns = None
        for key in self._ns_keys:
            subids.HELPER.drop(key)
        self._ns_keys.clear()
        if isinstance(source, subids.SubUidAllocator) and self.uid is not None:
            source.release(self.uid)

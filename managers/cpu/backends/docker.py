"""The `docker` backend: one container per environment (docker SDK), as in the paper.

Before each exec the container is updated (`cpuset_cpus`, `cpu_quota`) to the cores its running
execs hold (exactly the grant when one exec runs, the union when a trajectory runs several at
once; skipped when unchanged), then the command runs through `exec_create`/`exec_start`. The
engine is local: at the deadline, and after an exec when no other exec of the environment runs,
the processes left in the container's cgroup (all but its init) are killed from the host.
A container that died makes every later exec fail with `EnvironmentBroken`.

Hardened like the `bwrap` sandbox: every capability dropped, `no-new-privileges`, a pids limit
(`pids_max`), a non-root user (`user`; by default a uid of its own per environment, from the
host-wide ranges of `managers.cpu.uids`, never reused), no network unless the environment was
opened with `network=True`, a read-only root filesystem with a private `/tmp` (tmpfs) and the
environment's work directory (a host folder, mode 0700, owned by that user) bound writable at
`/work`; memory without swap. Commands see only `grant.command_env`. Containers carry the
server's PID and host name as labels, so a later server removes those of a dead one (`sweep`).
A command granted GPUs (a vector exec) is refused, naming `gpus`: a container's devices are
fixed when it is created, for the environment's whole life, while a grant is per exec.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from managers.cpu import seccomp
from managers.cpu.backends.base import (
    DEFAULT_PIDS_MAX,
    Backend,
    EnvironmentBroken,
    LimitCounts,
    Sandbox,
    check_pids_max,
    not_found,
    outcome_of,
)
from managers.cpu.backends.cgroup import fs
from managers.cpu.environments import Environment
from managers.cpu.leftovers import gone, owned_name
from managers.cpu.request import ExecSpec
from managers.cpu.uids import DEFAULT_UID_BASE, UidAllocator
from tangram.errors import BackendUnavailable, ValidationError
from tangram.results import Result

log = logging.getLogger(__name__)
DEFAULT_IMAGE = "tangram-test:latest"  # what .ci/dockerd.sh builds offline
KILL_GRACE_S = 5.0
LABEL = "tangram.backend"
OWNER = "tangram.server"  # label: <host name>/<server pid>, for the sweep after a crash
INSIDE_WORK = "/work"
INSIDE_SUPPORT = "/opt/tangram"


class DockerBackend(Backend):
    name = "docker"
    engine_images = True  # `open_env(image=...)` names an image of the engine
    isolates = True
    inside_work = INSIDE_WORK
    inside_support = INSIDE_SUPPORT
    gpus_refused = (
        "the docker backend gives a command no GPUs: a container's devices are fixed when "
        "its environment opens, a grant is per exec (use the bwrap backend, which binds the "
        "granted devices per exec)"
    )

    def __init__(
        self,
        image: str | None = None,
        base_url: str | None = None,
        max_concurrent: int = 64,
        direct: bool = True,
        pids_max: int = DEFAULT_PIDS_MAX,
        user: int | None = None,
    ) -> None:
        """`direct`: when the engine is local and we are root, write the container's cgroup
        files (cpuset, quota) instead of calling `container.update` (same effect, ~1000x
        cheaper); otherwise every change goes through the API. `pids_max`: processes per
        environment; `user`: the uid (and gid) commands of every environment run as, never 0
        (default: one of its own per environment, shared with nothing). The engine must be
        local: the work directory is a host folder bound into the container. Checks its
        options only: the engine is reached at `start`."""
        super().__init__()
        self.pids_max = check_pids_max(pids_max)
        if user is not None and (isinstance(user, bool) or not isinstance(user, int) or user < 1):
            raise ValidationError("cpu.user", user, "must be a positive uid (never root)")
        self.user = user
        self._uid_source = UidAllocator(DEFAULT_UID_BASE)
        self.image = image or os.environ.get("TANGRAM_DOCKER_IMAGE", DEFAULT_IMAGE)
        self.base_url = base_url
        self.max_concurrent = max_concurrent
        self.direct = direct
        self.owner_label = f"{socket.gethostname()}/{os.getpid()}"
        self._sandboxes: set[DockerSandbox] = set()  # open ones (removed at `shutdown`)

    @classmethod
    def probe(cls) -> str | None:
        try:
            _connect(None, os.environ.get("TANGRAM_DOCKER_IMAGE", DEFAULT_IMAGE), 1).close()
        except BackendUnavailable as exc:
            return str(exc)
        return None

    def _start(self) -> None:
        self.client = _connect(self.base_url, self.image, self.max_concurrent)  # the probe
        self.api = self.client.api
        self._pool = ThreadPoolExecutor(self.max_concurrent, thread_name_prefix="tangram-docker")
        self._install_support()

    def inside_python(self, env: Environment) -> str | None:
        return None  # the server's Python is not in the container

    def describe(self) -> str:
        return f"docker (image {self.image})"

    async def _call(self, fn, *args, **kw):
        return await asyncio.get_running_loop().run_in_executor(self._pool, lambda: fn(*args, **kw))

    def _sweep(self) -> list[str]:
        """Remove the containers of dead servers of this host (their PID is gone). One listing
        call: a container another server removes meanwhile is no error."""
        host = socket.gethostname()
        swept = []
        for c in self.api.containers(all=True, filters={"label": OWNER}):
            where, _, pid = (c.get("Labels") or {}).get(OWNER, "").rpartition("/")
            if where == host and pid.isdigit() and gone(int(pid)):
                name = (c.get("Names") or [c["Id"]])[0].lstrip("/")
                with contextlib.suppress(Exception):
                    self.api.remove_container(c["Id"], force=True)
                    swept.append(f"container {name} (server pid {pid})")
        return swept

    async def _open(self, env: Environment, cores: tuple[int, ...]) -> DockerSandbox:
        from docker.errors import DockerException

        cpus = fs.cpulist(cores)
        uid = self.user if self.user is not None else self._uid_source.take()
        self._make_workdir(env, uid)
        try:
            c = await self._call(
                self.client.containers.run,
                env.image or self.image,
                ["sleep", "1000000000"],
                detach=True,
                name=owned_name(env.id),
                labels={LABEL: self.tag, "tangram.env": env.id, OWNER: self.owner_label},
                network_mode=None if env.network else "none",
                user=f"{uid}:{uid}",
                cap_drop=["ALL"],
                pids_limit=self.pids_max,
                security_opt=["no-new-privileges", f"seccomp={seccomp.docker_profile()}"],
                read_only=True,
                tmpfs={"/tmp": "rw,nosuid,nodev,mode=1777"},
                volumes={
                    env.workdir: {"bind": INSIDE_WORK, "mode": "rw"},
                    str(self.support): {"bind": INSIDE_SUPPORT, "mode": "ro"},
                },
                mem_limit=f"{env.memory_mb}m",
                memswap_limit=f"{env.memory_mb}m",
                working_dir=INSIDE_WORK,
                cpuset_cpus=cpus,
                cpu_period=fs.PERIOD_US,
                cpu_quota=len(cores) * fs.PERIOD_US,
            )
            await self._call(c.reload)
        except (DockerException, OSError) as exc:
            await self._remove_workdir(env)
            raise BackendUnavailable(
                f"cannot start the container of environment {env.id} "
                f"from {env.image or self.image!r}: {exc}"
            ) from exc
        pid = int(c.attrs["State"]["Pid"])
        found = fs.folders_of(pid) if self.direct else None
        version, folders = found if found is not None else (0, {})
        if folders and not os.access(folders["cpuset"] / "cpuset.cpus", os.W_OK):
            folders = {}
        sandbox = DockerSandbox(self, env, c.id, c.name, pid, folders, version, cpus, uid)
        self._sandboxes.add(sandbox)
        return sandbox

    def _exec_sync(
        self, cid: str, argv: list[str], variables: dict[str, str], cap: int, holder: dict[str, Any]
    ) -> tuple[int | None, bytes, bytes, bool]:
        exec_id = self.api.exec_create(cid, argv, workdir=INSIDE_WORK, environment=variables)["Id"]
        holder["exec_id"] = exec_id
        out, err, truncated = bytearray(), bytearray(), False
        for o, e in self.api.exec_start(exec_id, stream=True, demux=True):
            for chunk, kept in ((o, out), (e, err)):
                if chunk:
                    room = cap - len(kept)
                    if room > 0:
                        kept += chunk[:room]
                    truncated |= len(chunk) > room
        code = self.api.exec_inspect(exec_id)["ExitCode"]
        return code, bytes(out), bytes(err), truncated

    def _kill_exec(self, holder: dict[str, Any]) -> None:
        """Kill the exec's process and all its descendants (host pids)."""
        exec_id = holder.get("exec_id")
        if exec_id is None:
            return
        with contextlib.suppress(Exception):
            pid = int(self.api.exec_inspect(exec_id).get("Pid") or 0)
            if pid > 0:
                for p in [pid, *_descendants(pid)]:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(p, signal.SIGKILL)

    def containers(self) -> list[str]:
        """Names of the containers this backend has created and not removed (leak checks)."""
        found = self.client.containers.list(all=True, filters={"label": f"{LABEL}={self.tag}"})
        return [c.name for c in found]

    async def _shutdown(self) -> None:
        from docker.errors import NotFound

        for sandbox in list(self._sandboxes):
            self._sandboxes.discard(sandbox)
            sandbox.open = False
            with contextlib.suppress(NotFound):
                await self._call(self.api.remove_container, sandbox.id, force=True)
        self._pool.shutdown(wait=False)
        self.client.close()


class DockerSandbox(Sandbox):
    """A container: its id and name, its init's host PID, its cgroup on the host (`folders`,
    {} when the engine is not local; `version`: of that cgroup), the cores it is allowed now
    (`cpus`: the union of its running commands'), its commands' uid."""

    backend: DockerBackend

    def __init__(
        self,
        backend: DockerBackend,
        env: Environment,
        cid: str,
        name: str,
        init_pid: int,
        folders: dict[str, Path],
        version: int,
        cpus: str,
        uid: int,
    ) -> None:
        super().__init__(backend, env)
        self.id, self.name, self.init_pid = cid, name, init_pid
        self.folders, self.version, self.cpus, self.uid = folders, version, cpus, uid
        self.running: dict[int, tuple[int, ...]] = {}  # exec token -> its cores
        self.lock = asyncio.Lock()
        self._tokens = itertools.count()

    async def _broken(self, exc: Exception) -> EnvironmentBroken:
        from docker.errors import NotFound

        b = self.backend
        try:
            state = (await b._call(b.api.inspect_container, self.id))["State"]
            what = (
                f"is {state.get('Status')} (exit code {state.get('ExitCode')}"
                f"{', killed for memory' if state.get('OOMKilled') else ''})"
            )
        except NotFound:
            what = "no longer exists"
        return EnvironmentBroken(
            f"environment {self.env.id} is broken: its container {self.name} {what}; "
            f"close it and open a new one ({exc})"
        )

    async def _run(self, spec: ExecSpec) -> Result:
        from docker.errors import APIError

        b = self.backend
        token = next(self._tokens)
        self.running[token] = spec.cores
        holder: dict[str, Any] = {}
        variables = self.environ(spec)
        try:
            await self._set_cores()
            run = asyncio.ensure_future(
                b._call(b._exec_sync, self.id, spec.argv, variables, spec.output_cap, holder)
            )
            timed_out = False
            try:
                code, out, err, truncated = await asyncio.wait_for(
                    asyncio.shield(run), spec.timeout
                )
            except TimeoutError:
                timed_out = True
                b._kill_exec(holder)
                code, out, err, truncated = await asyncio.wait_for(run, KILL_GRACE_S)
            except asyncio.CancelledError:
                b._kill_exec(holder)
                raise
        except APIError as exc:
            raise await self._broken(exc) from exc
        finally:
            del self.running[token]
            if not self.running:
                await b._call(self._kill_leftovers)
        # no exit code: the container went away (closed meanwhile: `exec` says cancelled)
        if code is None and self.open:
            raise await self._broken(RuntimeError("exec ended without an exit code"))
        if code == 126 and b"executable file not found" in out + err:
            return not_found(
                spec.argv[0], FileNotFoundError(2, "executable file not found in the container")
            )
        return outcome_of(code, out, err, truncated, timed_out, spec.timeout, spec.output_cap)

    def _limit_counts(self) -> LimitCounts:
        if not self.folders:
            return LimitCounts()
        return LimitCounts(
            fs.oom_kills(self.version, self.folders["memory"]),
            fs.pids_refused(self.folders.get("pids")),
        )

    async def _set_cores(self) -> None:
        b = self.backend
        async with self.lock:
            union = tuple(sorted(set().union(*self.running.values())))
            cpus = fs.cpulist(union)
            if cpus == self.cpus:
                return
            if self.folders:
                try:
                    fs.set_cores(self.version, self.folders, union)
                except OSError as exc:
                    raise await self._broken(exc) from exc
            else:
                await b._call(
                    b.api.update_container,
                    self.id,
                    cpuset_cpus=cpus,
                    cpu_quota=len(union) * fs.PERIOD_US,
                )
            self.cpus = cpus

    def _kill_leftovers(self) -> None:
        if self.folders:
            fs.kill_all(self.folders["cpu"], keep=self.init_pid)

    async def _close(self) -> None:
        from docker.errors import NotFound

        b = self.backend
        if self in b._sandboxes:
            b._sandboxes.discard(self)
            with contextlib.suppress(NotFound):
                await b._call(b.api.remove_container, self.id, force=True)
        left = await b._remove_workdir(self.env)
        if left:
            log.warning("environment %s: could not remove %s", self.env.id, "; ".join(left))


def _connect(base_url: str | None, image: str, max_pool: int) -> Any:
    """A client of the engine at `base_url` (default: the environment's DOCKER_HOST) that
    answers a ping and holds `image`; raises `BackendUnavailable` naming the fix."""
    try:
        import docker  # type: ignore[import-untyped]
        from docker.errors import DockerException, ImageNotFound  # type: ignore[import-untyped]
    except ImportError as exc:
        raise BackendUnavailable(
            f"the docker SDK is not importable ({exc}): pip install docker"
        ) from exc
    where = base_url or os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        kw: dict[str, Any] = {"timeout": 24 * 3600, "max_pool_size": max_pool}
        client = docker.DockerClient(base_url=base_url, **kw) if base_url else docker.from_env(**kw)
        client.ping()
    except DockerException as exc:
        raise BackendUnavailable(
            f"cannot reach the Docker engine at {where} ({exc}): start dockerd (on Debian "
            f"`apt-get install docker.io` then `dockerd &`, or `bash .ci/dockerd.sh`), set "
            f"DOCKER_HOST, or choose backend='cgroup'"
        ) from exc
    try:
        client.images.get(image)
    except ImageNotFound as exc:
        client.close()
        raise BackendUnavailable(
            f"image {image!r} is not in the Docker engine at {where}: pull or build it, pass "
            f"image=... (or TANGRAM_DOCKER_IMAGE), or run `bash .ci/dockerd.sh`, which builds "
            f"{DEFAULT_IMAGE} offline"
        ) from exc
    return client


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found

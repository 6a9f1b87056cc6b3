"""The CPU manager, allocate-on-execution (paper 5.2).

The scheduler grants an action cores (`Assignment.placement['cpu'].cores`, taken from this
manager's `CorePool`) and calls `run`; the manager confines the action's command to exactly
those cores in the trajectory's environment and returns when no process of it is left, so the
scheduler can release the cores. Environments are opened before a trajectory's first action
(`open_env`) and closed with it (`close_env`); `binding(trajectory)` names the node a
trajectory's actions must stay on.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import tempfile
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence

from managers.base import EnvironmentManager
from managers.cpu import files
from managers.cpu.backends import Backend, EnvironmentBroken, select
from managers.cpu.layers import DEFAULT_DISK_MB, LayerStore
from managers.cpu.leftovers import owned_name, sweep_workdirs
from managers.cpu.pool import Environment, EnvironmentTable
from managers.cpu.request import ExecRequest, exec_target
from managers.cpu.roots import Prepared, Roots
from tangram.actions import Action
from tangram.allocation import Assignment
from tangram.errors import Infeasible, TangramError, ValidationError
from tangram.pools import CorePool
from tangram.resources import Demand
from tangram.results import Result, Status
from topology import CpuNode
from topology.discovery import discover_numa

LOCAL = "local"
MAX_FORK = 256  # children of one fork
log = logging.getLogger(__name__)


def default_state_dir() -> str:
    """Where a node keeps its images, layers and snapshots: $TANGRAM_STATE_DIR, else
    /var/lib/tangram as root, else ~/.local/state/tangram."""
    if os.environ.get("TANGRAM_STATE_DIR"):
        return os.environ["TANGRAM_STATE_DIR"]
    if os.geteuid() == 0:
        return "/var/lib/tangram"
    return os.path.expanduser("~/.local/state/tangram")


def local_disk_mb(folder: str) -> int:
    """MiB free on the filesystem of `folder` (the node's disk capacity for environments)."""
    st = os.statvfs(folder)
    return st.f_bavail * st.f_frsize >> 20


def local_memory_mb() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    return 4096


class CpuManager(EnvironmentManager):
    """Owns the `cpu` pool (cores by NUMA domain per node) and the trajectories' environments.

    `backend`: a name ("bwrap", "cgroup", "docker", "affinity", "sim"; "auto" picks the best
    available and logs it) or a `Backend`. Local backends run on this machine: one node, `LOCAL`,
    with its discovered NUMA cores and memory. `nodes`/`memory_mb` describe other clusters (sim).

    Before it serves, a manager sweeps what dead servers left (their cgroups, work folders,
    containers, mounts, layers and snapshots; see `leftovers`) and logs it: environments and
    snapshots do not survive a restart.

    `state_dir`: the node's image store, layers and snapshots (`default_state_dir`);
    `disk_mb`: the disk bound of an environment opened with an image or snapshot and no
    `disk_mb` of its own (default `layers.DEFAULT_DISK_MB`); `disk_capacity_mb`: the node's
    disk for environments (default: what is free under `state_dir` at start).
    """

    name = "cpu"

    def __init__(self, backend: str | Backend = "auto", *, resource: str = "cpu",
                 nodes: Mapping[str, CpuNode] | None = None,
                 memory_mb: Mapping[str, int] | None = None,
                 workdir_root: str | None = None, state_dir: str | None = None,
                 disk_mb: int = DEFAULT_DISK_MB, disk_capacity_mb: int | None = None) -> None:
        self.backend = backend if isinstance(backend, Backend) else select(backend)
        if nodes is None:
            nodes = {LOCAL: CpuNode(LOCAL, discover_numa())}
        if self.backend.local and len(nodes) != 1:
            raise ValidationError("cpu.nodes", sorted(nodes), f"the {self.backend.name} backend "
                                  "runs on this machine only: give one node")
        if memory_mb is None:
            memory_mb = {n: local_memory_mb() for n in nodes}
        self.resource = resource
        self.pool = CorePool(resource, nodes)
        self.roots: Roots | None = None
        if self.backend.local and (state_dir or os.geteuid() == 0):  # layers need root
            try:
                self.roots = Roots(state_dir or default_state_dir(), disk_mb)
            except OSError as exc:
                log.warning("images, disk bounds and forks are off: cannot use the state "
                            "folder %s (%s)", state_dir or default_state_dir(), exc)
            if self.roots is not None and disk_capacity_mb is None:
                disk_capacity_mb = local_disk_mb(str(self.roots.state))
        self.envs = EnvironmentTable(memory_mb, None if disk_capacity_mb is None else
                                     dict.fromkeys(nodes, disk_capacity_mb))
        self.broken: dict[str, str] = {}  # env id -> why
        self.workdir_root = workdir_root or tempfile.gettempdir()
        self._closed = False
        self._busy: dict[str, int] = {}  # env id -> commands running in it
        self._freezing: dict[str, asyncio.Event] = {}  # env id -> set when its fork is done
        self.swept = self.backend.sweep() + sweep_workdirs(self.workdir_root) + (
            self.roots.sweep() if self.roots is not None else [])
        for line in self.swept:
            log.warning("swept what a dead server left: %s", line)

    def binding(self, trajectory: str) -> str | None:
        """The node a trajectory's environment lives on (None before `open_env`)."""
        return self.envs.binding(trajectory)

    def bindings(self) -> dict[tuple[str, str], str]:
        return {(e.trajectory, self.resource): e.node for e in self.envs.all()}

    async def open_env(self, trajectory: str, memory_mb: int = 1024, min_cores: int = 1,
                       network: bool = False, *, image: str | None = None,
                       disk_mb: int | None = None, snapshot: str | None = None) -> str:
        """Open the trajectory's environment on a node with `memory_mb` (and its disk) free
        for its whole life and, preferably, `min_cores` free now (memory load balanced);
        returns its id. `network`: whether its commands may reach the network (off by default).

        `image` (a name or digest of the node's image store): its root filesystem is that
        image under a private writable layer of `disk_mb` MiB (default: the manager's);
        `snapshot`: it starts from a snapshot's files instead; `disk_mb` alone: no image (the
        host's system files) but its work folder is such a layer, bounded and forkable.
        None of the three: a plain work folder, no disk bound (no fork)."""
        if not isinstance(trajectory, str) or not trajectory:
            raise ValidationError("env.trajectory", trajectory, "must be a non-empty string")
        if not isinstance(network, bool):
            raise ValidationError("env.network", network, "must be true or false")
        layered = image is not None or disk_mb is not None or snapshot is not None
        engine = image is not None and self.backend.engine_images
        if not layered or (engine and disk_mb is None and snapshot is None):
            node = self.envs.choose_node(self.pool, memory_mb, min_cores)
            return await self._open(Environment(
                "", trajectory, node, memory_mb, "", network, image=image))
        roots = self._roots("env.image" if image is not None else "env.disk_mb",
                            image or disk_mb or snapshot)
        why = await asyncio.to_thread(lambda: roots.layers.why_not)  # probed once, off the loop
        if why is not None:
            raise ValidationError("env.image" if image is not None else "env.disk_mb",
                                  image or disk_mb or snapshot, why)
        disk = roots.disk_of(disk_mb)
        stack, uid = roots.stack_for(image, snapshot)
        if stack.image is not None and not self.backend.roots:
            raise ValidationError("env.image", image or snapshot, f"the {self.backend.name} "
                                  f"backend cannot give an environment a root of its own: use "
                                  f"the bwrap backend")
        if snapshot is not None:
            node = roots.snapshot(snapshot).node
            self._check_room(node, 1, memory_mb, disk)
        else:
            node = self.envs.choose_node(self.pool, memory_mb, min_cores, disk)
        return await self._open(Environment("", trajectory, node, memory_mb, "", network,
                                            disk_mb=disk, uid=uid), stack)

    async def _open(self, proto: Environment, stack=None) -> str:
        if self._closed:
            raise TangramError("the CPU manager is closed")
        env_id = f"env-{uuid.uuid4().hex[:12]}"
        taken = self.envs.of_trajectory(proto.trajectory)
        if taken is not None:
            raise ValidationError("env.trajectory", proto.trajectory,
                                  f"already has environment {taken.id}")
        prepared: Prepared | None = None
        workdir, root = os.path.join(self.workdir_root, owned_name(env_id)), None
        if stack is not None:
            assert self.roots is not None
            prepared = await asyncio.to_thread(self.roots.prepare, env_id, stack,
                                               proto.disk_mb, proto.uid)
            workdir, root = prepared.workdir, prepared.root
        env = dataclasses.replace(proto, id=env_id, workdir=workdir, root=root)
        try:
            if self._closed:  # closed while its tree was being made
                raise TangramError("the CPU manager is closed")
            self.envs.add(env)  # validates: one environment per trajectory
        except BaseException:
            if prepared is not None:
                await asyncio.to_thread(self._discard, env_id, env.node, prepared)
            raise
        if prepared is not None:
            self.roots.adopt(env_id, prepared)  # type: ignore[union-attr]
        try:
            await self.backend.open(env, tuple(sorted(self.pool.cpu_node(env.node).domain_of)))
        except BaseException:
            self.envs.remove(env_id)
            if prepared is not None:
                await asyncio.to_thread(self._discard, env_id, env.node)
            raise
        if prepared is not None and prepared.rooted.uid is None:
            prepared.rooted.uid = self.backend.owner(env)
        return env_id

    def _roots(self, field: str, value) -> Roots:
        if self.roots is None:
            raise ValidationError(field, value, f"the {self.backend.name} backend has no "
                                  f"images, disk bounds or forks")
        return self.roots

    def _discard(self, env_id: str, node: str, prepared: Prepared | None = None) -> None:
        assert self.roots is not None
        for layer in self.roots.discard(env_id, prepared):
            self.envs.reserve_disk(node, -layer.counted_mb)

    def _check_room(self, node: str, n: int, memory_mb: int, disk_mb: int) -> None:
        if self.envs.memory_free(node) < n * memory_mb:
            raise Infeasible(f"env.memory_mb: {n} x {memory_mb} MiB over the "
                             f"{self.envs.memory_free(node)} MiB free on {node}")
        if self.envs.disk_free(node) < n * disk_mb:
            raise Infeasible(f"env.disk_mb: {n} x {disk_mb} MiB over the "
                             f"{self.envs.disk_free(node)} MiB of disk free on {node}")

    # -- fork, snapshot, files -----------------------------------------------------------------
    def _layered(self, env_id: str, what: str) -> tuple[Environment, Roots]:
        env = self.envs.get(env_id) if isinstance(env_id, str) else None
        if env is None:
            raise ValidationError("env_id", env_id, "no open environment with this id")
        if self.roots is None:
            raise ValidationError("env_id", env_id, f"the {self.backend.name} backend has no "
                                  f"layers to {what}")
        self.roots.rooted(env_id, what)
        if self._busy.get(env_id):
            raise ValidationError("env_id", env_id, f"a command is running in it: {what} when "
                                  f"it is idle (files are frozen, processes are not forked)")
        return env, self.roots

    async def _freeze(self, env: Environment, roots: Roots, keep: bool = False) -> str | None:
        """Stop the sandbox, freeze its layer, remount on a fresh one, restart it; `keep`:
        also keep the frozen stack as a snapshot (returns its id). A command granted meanwhile
        waits until the sandbox is back, and so does `close`."""
        if env.id in self._freezing:
            raise ValidationError("env_id", env.id, "a fork or snapshot of it is under way")
        self._freezing[env.id] = asyncio.Event()
        try:
            await self.backend.suspend(env)
            try:
                frozen = await asyncio.to_thread(roots.freeze, env.id, env.disk_mb)
                frozen.counted_mb = roots.layers.allocated_mb(frozen)
                self.envs.reserve_disk(env.node, frozen.counted_mb)
            finally:
                await self.backend.resume(env)
            if keep:
                return roots.keep(env.id, env.node, roots.envs[env.id].uid).id
            return None
        finally:
            self._freezing.pop(env.id).set()

    async def fork_env(self, env_id: str, trajectories: Sequence[str]) -> list[str]:
        """New environments, one per trajectory, on the parent's node, whose files start as the
        parent's are now (its processes are not forked: the parent's own are stopped, as a
        fork restarts its sandbox). O(1) in the data the parent wrote: the parent's layer is
        frozen as a shared lower of the parent and every child, each of which gets a fresh
        writable layer of the parent's `disk_mb` and memory of the parent's `memory_mb`.
        Children run as the parent's uid (their files are the parent's)."""
        if isinstance(trajectories, str) or not isinstance(trajectories, Sequence) \
                or not 1 <= len(trajectories) <= MAX_FORK:
            raise ValidationError("trajectories", trajectories,
                                  f"must be a list of 1 to {MAX_FORK} trajectory names")
        for t in trajectories:
            if not isinstance(t, str) or not t or self.envs.of_trajectory(t) is not None:
                raise ValidationError("trajectories", t, "must be a new trajectory name (one "
                                      "without an environment)")
        if len(set(trajectories)) != len(trajectories):
            raise ValidationError("trajectories", list(trajectories), "names repeat")
        parent, roots = self._layered(env_id, "fork")
        self._check_room(parent.node, len(trajectories), parent.memory_mb, parent.disk_mb)
        await self._freeze(parent, roots)
        stack = roots.envs[env_id].stack
        uid = roots.envs[env_id].uid
        proto = [Environment("", t, parent.node, parent.memory_mb, "", parent.network,
                             disk_mb=parent.disk_mb, uid=uid) for t in trajectories]
        opened = await asyncio.gather(*(self._open(p, stack) for p in proto),
                                      return_exceptions=True)
        failed = [r for r in opened if isinstance(r, BaseException)]
        if failed:
            for r in opened:
                if isinstance(r, str):
                    await self.close_env(r)
            raise failed[0]
        return [str(r) for r in opened]

    async def snapshot(self, env_id: str) -> str:
        """Keep the environment's files as they are now under a snapshot id (the environment
        goes on, from a fresh layer over them); O(1) in data like `fork_env`."""
        env, roots = self._layered(env_id, "snapshot")
        sid = await self._freeze(env, roots, keep=True)
        assert sid is not None
        return sid

    def snapshots(self) -> list[dict]:
        roots = self.roots
        if roots is None:
            return []
        return [s.to_dict(roots.snapshot_mb(s)) for s in roots.snapshots.values()]

    async def delete_snapshot(self, snapshot_id: str) -> None:
        if self.roots is None:
            raise ValidationError("snapshot", snapshot_id, "no such snapshot")
        node = self.roots.snapshot(snapshot_id).node
        for layer in await asyncio.to_thread(self.roots.delete, snapshot_id):
            self.envs.reserve_disk(node, -layer.counted_mb)

    def _tree(self, env_id: str) -> Environment:
        env = self.envs.get(env_id) if isinstance(env_id, str) else None
        if env is None:
            raise ValidationError("env_id", env_id, "no open environment with this id")
        if not self.backend.local:
            raise ValidationError("env_id", env_id, f"the {self.backend.name} backend has no "
                                  f"files API")
        return env

    async def write_files(self, env_id: str, contents: Mapping[str, bytes]) -> None:
        """Write files into the environment (see `roots` for what a path means); missing
        folders are made; files and folders made belong to the environment's user."""
        env = self._tree(env_id)
        if not isinstance(contents, Mapping):
            raise ValidationError("files", type(contents).__name__, "must map paths to bytes")
        by_root: dict[str, dict[str, bytes]] = {}
        for path, data in contents.items():
            root, rel = Roots.inside(env.root, env.workdir, path)
            by_root.setdefault(root, {})[rel] = data
        for root, group in by_root.items():
            await asyncio.to_thread(files.write, root, group, self.backend.owner(env))

    async def tar_files(self, env_id: str, path: str) -> AsyncIterator[bytes]:
        """A tar stream of the folder `path` of the environment (links kept as links, never
        followed); for trees too large for `read_files`."""
        env = self._tree(env_id)
        root, rel = Roots.inside(env.root, env.workdir, path)
        fd = await asyncio.to_thread(files.open_tree, root, rel)
        try:
            proc = await asyncio.create_subprocess_exec(
                "tar", "-C", f"/proc/self/fd/{fd}", "-cf", "-", "--numeric-owner", ".",
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
                pass_fds=(fd,))
        finally:
            os.close(fd)
        assert proc.stdout is not None
        try:
            while chunk := await proc.stdout.read(1 << 16):
                yield chunk
        finally:
            if proc.returncode is None:
                proc.kill()
            await proc.wait()

    async def read_files(self, env_id: str, paths: Sequence[str]) -> dict[str, bytes | None]:
        """Each path's content, None where it is missing or not a regular file."""
        env = self._tree(env_id)
        files.check_paths(paths, "paths")
        out: dict[str, bytes | None] = {}
        for path in paths:
            root, rel = Roots.inside(env.root, env.workdir, path)
            got = await asyncio.to_thread(files.read, root, [rel]) if rel else {rel: None}
            out[path] = got[rel]
        return out

    async def close_env(self, env_id: str) -> None:
        """Kill everything left in the environment and remove it. Unknown ids are ignored, and
        so is a second close while the first is still at work (the idle reaper and shutdown
        may both close one environment)."""
        if env_id in self._freezing:  # a fork or snapshot of it ends first
            await self._freezing[env_id].wait()
        env = self.envs.get(env_id)
        if env is None:
            return
        layered = self.roots is not None and env_id in self.roots.envs
        try:
            if layered:  # the tree first (lazily: the sandbox lets go when it is killed)
                await asyncio.to_thread(self.roots.layers.unmount,  # type: ignore[union-attr]
                                        self.roots.envs[env_id].target)  # type: ignore[union-attr]
            await self.backend.close(env)
        finally:
            if self.envs.get(env_id) is env:
                self.envs.remove(env_id)
            self.broken.pop(env_id, None)
            if layered:
                await asyncio.to_thread(self._discard, env_id, env.node)

    async def run(self, assignment: Assignment) -> Result:
        target = exec_target(assignment, self.envs)
        if isinstance(target, Result):
            return target
        req, env = target
        placement = assignment.placement.get(self.resource)
        if placement is None or not placement.cores or placement.node != env.node:
            return Result(Status.FAILED, detail=f"action {assignment.action_id}: placement "
                           f"{placement} is not cores on the environment's node {env.node}")
        if req.env_id in self.broken:
            return Result(Status.FAILED, detail=self.broken[req.env_id])
        if env.id in self._freezing:  # its files are being re-stacked (fork, snapshot)
            await self._freezing[env.id].wait()
        self._busy[env.id] = self._busy.get(env.id, 0) + 1
        try:
            outcome = await self.backend.exec(env, placement.cores, req.command, req.timeout,
                                              req.output_cap, elastic=req.elastic)
        except EnvironmentBroken as exc:
            self.broken[req.env_id] = str(exc)
            return Result(Status.FAILED, detail=str(exc))
        finally:
            self._busy[env.id] -= 1
            if not self._busy[env.id]:
                del self._busy[env.id]
        return self._named_disk(env, outcome)

    def _named_disk(self, env: Environment, outcome: Result) -> Result:
        """A command that leaves the environment's disk full says which limit it hit (whether
        or not it failed for it: a shell may have gone on after the ENOSPC)."""
        rooted = self.roots.envs.get(env.id) if self.roots is not None else None
        if rooted is None or not LayerStore.full(rooted.upper):
            return outcome
        return dataclasses.replace(outcome, detail=f"{outcome.detail}; disk limit "
                                                   f"{env.disk_mb} MiB reached")

    async def execute(self, request: ExecRequest, cores: int = 1) -> Result:
        """Run one request outside a scheduler: take `cores` on the environment's node now,
        run, give them back. Raises `Infeasible` when they are not free."""
        env = self.envs.get(request.env_id)
        node = env.node if env is not None else None
        placement = self.pool.place(cores, node=node)
        action = Action(f"exec-{uuid.uuid4().hex[:8]}", {self.resource: Demand.fixed(cores)},
                        trajectory=env.trajectory if env else None, kind="exec",
                        payload=request)
        try:
            return await self.run(Assignment(action, {self.resource: cores},
                                             {self.resource: placement}))
        finally:
            self.pool.release(placement, cores)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for done in list(self._freezing.values()):  # a fork or snapshot under way ends first
            await done.wait()
        for env in self.envs.all():
            await self.close_env(env.id)
        if self.roots is not None:
            for sid in list(self.roots.snapshots):
                await self.delete_snapshot(sid)
        await self.backend.shutdown()


"""The CPU manager, allocate-on-execution (paper 5.2).

The scheduler grants an action cores (`Assignment.placement['cpu'].cores`, taken from this
manager's `CorePool`) and calls `run`; the manager confines the action's command to exactly
those cores in the trajectory's environment and returns when no process of it is left, so the
scheduler can release the cores. Environments are opened before a trajectory's first action
(`open_env`) and closed with it (`close_env`); `binding(trajectory)` names the node a
trajectory's actions must stay on. Constructing a manager touches nothing: `start()` starts
its backend (choosing one for "auto"), opens the state folder and sweeps what dead servers
left; whoever builds a manager awaits it (`Tangram.start` does for its managers). Its exec
path (`run`, `execute`) is `execs`, its files API `envfiles`, its forks `forks` (mixins).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import tempfile
import uuid
from collections.abc import Mapping
from typing import Any

from managers.base import EnvironmentManager
from managers.cpu.backends import AUTO, Backend, NotStarted, create, started
from managers.cpu.backends.base import Sandbox
from managers.cpu.envfiles import TAR_MAX_MB, EnvFiles, check_tar_max_mb
from managers.cpu.environments import Environment, EnvironmentTable, EnvState
from managers.cpu.execs import EnvExecs
from managers.cpu.forks import EnvForks
from managers.cpu.layers import DEFAULT_DISK_MB, Rooted
from managers.cpu.leftovers import owned_name, sweep_workdirs
from managers.cpu.node import default_state_dir, local_disk_mb, local_memory_mb
from managers.cpu.roots import Prepared, Roots
from managers.cpu.shells import (
    DEFAULT_BACKGROUND,
    BackgroundCores,
    EnvShells,
    check_background,
)
from tangram.errors import Infeasible, TangramError, ValidationError
from tangram.pools import CorePool
from topology import CpuNode
from topology.discovery import discover_numa

LOCAL = "local"
log = logging.getLogger(__name__)


class CpuManager(EnvExecs, EnvForks, EnvFiles, EnvShells, EnvironmentManager):
    """Owns the `cpu` pool (cores by NUMA domain per node) and the trajectories' environments.

    `backend`: a name ("bwrap", "cgroup", "docker", "affinity", "sim"; "auto" picks the best
    that starts, at `start`, and logs it) with its `backend_options`, or a `Backend`. Local
    backends run on this machine: one node, `LOCAL`, with its discovered NUMA cores and
    memory. `nodes`/`memory_mb` describe other clusters (sim).

    At `start`, before it serves, a manager sweeps what dead servers left (their cgroups, work
    folders, containers, mounts, layers and snapshots; see `leftovers`) and logs it (`swept`):
    environments and snapshots do not survive a restart.

    `state_dir`: the node's image store, layers and snapshots (`default_state_dir`);
    `disk_mb`: the disk bound of an environment opened with an image or snapshot and no
    `disk_mb` of its own (default `layers.DEFAULT_DISK_MB`); `disk_capacity_mb`: the node's
    disk for environments (default: what is free under `state_dir` at start); `tar_max_mb`:
    the bound of one `tar_files` stream (default `envfiles.TAR_MAX_MB`); `background`: the
    share of one core an environment's shell sessions get between their commands (`shells`).
    """

    name = "cpu"

    def __init__(
        self,
        backend: str | Backend = AUTO,
        *,
        resource: str = "cpu",
        backend_options: Mapping[str, Any] | None = None,
        nodes: Mapping[str, CpuNode] | None = None,
        memory_mb: Mapping[str, int] | None = None,
        workdir_root: str | None = None,
        state_dir: str | None = None,
        disk_mb: int = DEFAULT_DISK_MB,
        disk_capacity_mb: int | None = None,
        tar_max_mb: int = TAR_MAX_MB,
        background: float = DEFAULT_BACKGROUND,
    ) -> None:
        options = dict(backend_options or {})
        if isinstance(backend, Backend) and options:
            raise ValidationError(
                "cpu.options",
                options,
                "give options to a backend by name only (this one is already built)",
            )
        self._choice = (backend, options)
        self._backend: Backend | None = (
            backend
            if isinstance(backend, Backend)
            else None
            if backend == AUTO
            else create(backend, **options)
        )
        if nodes is None:
            nodes = {LOCAL: CpuNode(LOCAL, discover_numa())}
        if self._backend is not None:
            self._check_nodes(self._backend, nodes)
        if memory_mb is None:
            memory_mb = {n: local_memory_mb() for n in nodes}
        self.resource = resource
        self.pool = CorePool(resource, nodes)
        self.roots: Roots | None = None
        Roots.check_disk_mb(disk_mb)  # a bad value fails here, not at start
        self.tar_max = check_tar_max_mb(tar_max_mb) << 20
        self.background = check_background(background)  # a session's share of a core, idle
        self._background: dict[str, BackgroundCores] = {}  # node -> (see `shells`)
        self._layers = (state_dir, disk_mb, disk_capacity_mb)
        self.envs = EnvironmentTable(
            memory_mb, None if disk_capacity_mb is None else dict.fromkeys(nodes, disk_capacity_mb)
        )
        self.workdir_root = workdir_root or tempfile.gettempdir()
        self._started = False
        self._closed = False
        self.swept: list[str] = []  # what `start` swept, a line each

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            raise NotStarted(
                "the CPU manager chooses its backend (auto) at start: await its start() first"
            )
        return self._backend

    @property
    def backend_name(self) -> str | None:
        return AUTO if self._backend is None else self._backend.name

    @property
    def isolates(self) -> bool | None:
        """None until the backend is chosen (`auto` chooses at the first use)."""
        return None if self._backend is None else self._backend.isolates

    @staticmethod
    def _check_nodes(backend: Backend, nodes: Mapping[str, CpuNode]) -> None:
        if backend.local and len(nodes) != 1:
            raise ValidationError(
                "cpu.nodes",
                sorted(nodes),
                f"the {backend.name} backend runs on this machine only: give one node",
            )

    async def start(self) -> None:
        """Start the backend (choose it, for "auto"), open the state folder, then sweep what
        dead servers left and log it. Idempotent; raises `BackendUnavailable` naming the
        fix."""
        if self._started:
            return
        if self._closed:
            raise TangramError("the CPU manager is closed")
        choice, options = self._choice
        if self._backend is None:
            self._backend = await started(str(choice), **options)
        else:
            await self._backend.start()
        self._check_nodes(self._backend, self.pool.nodes())
        await asyncio.to_thread(self._open_state)
        self.swept = await asyncio.to_thread(self._sweep)
        for line in self.swept:
            log.warning("swept what a dead server left: %s", line)
        self._started = True

    def _open_state(self) -> None:
        """The node's state folder (layers need root): images, disk bounds and forks."""
        state_dir, disk_mb, capacity = self._layers
        if not self.backend.local or not (state_dir or os.geteuid() == 0):
            return
        try:
            self.roots = Roots(state_dir or default_state_dir(), disk_mb)
        except OSError as exc:
            log.warning(
                "images, disk bounds and forks are off: cannot use the state folder %s (%s)",
                state_dir or default_state_dir(),
                exc,
            )
            return
        if capacity is None:
            self.envs.disk_capacity = dict.fromkeys(
                self.envs.disk_capacity, local_disk_mb(str(self.roots.state))
            )

    def _sweep(self) -> list[str]:
        return (
            self.backend.sweep()
            + sweep_workdirs(self.workdir_root)
            + (self.roots.sweep() if self.roots is not None else [])
        )

    def binding(self, trajectory: str) -> str | None:
        """The node a trajectory's environment lives on (None before `open_env`)."""
        return self.envs.binding(trajectory)

    def bindings(self) -> dict[tuple[str, str], str]:
        return {(e.trajectory, self.resource): e.node for e in self.envs.all()}

    async def open_env(
        self,
        trajectory: str,
        memory_mb: int = 1024,
        min_cores: int = 1,
        network: bool = False,
        *,
        image: str | None = None,
        disk_mb: int | None = None,
        snapshot: str | None = None,
    ) -> str:
        """Open the trajectory's environment on a node with `memory_mb` (and its disk) free
        for its whole life and, preferably, `min_cores` free now (memory load balanced);
        returns its id. `network`: whether its commands may reach the network (off by default).

        `image` (a name or digest of the node's image store): its root filesystem is that
        image under a private writable layer of `disk_mb` MiB (default: the manager's);
        `snapshot`: it starts from a snapshot's files instead; `disk_mb` alone: no image (the
        host's system files) but its work folder is such a layer, bounded and forkable.
        None of the three: a plain work folder, no disk bound (no fork)."""
        self._require_started()
        if not isinstance(trajectory, str) or not trajectory:
            raise ValidationError("env.trajectory", trajectory, "must be a non-empty string")
        if not isinstance(network, bool):
            raise ValidationError("env.network", network, "must be true or false")
        layered = image is not None or disk_mb is not None or snapshot is not None
        engine = image is not None and self.backend.engine_images
        if not layered or (engine and disk_mb is None and snapshot is None):
            node = self.envs.choose_node(self.pool, memory_mb, min_cores)
            return await self._open(
                Environment("", trajectory, node, memory_mb, "", network, image=image)
            )
        roots = self._roots(
            "env.image" if image is not None else "env.disk_mb", image or disk_mb or snapshot
        )
        why = await asyncio.to_thread(lambda: roots.layers.why_not)  # probed once, off the loop
        if why is not None:
            raise ValidationError(
                "env.image" if image is not None else "env.disk_mb",
                image or disk_mb or snapshot,
                why,
            )
        disk = roots.disk_of(disk_mb)
        stack, uid = roots.stack_for(image, snapshot)
        if stack.image is not None and not self.backend.roots:
            raise ValidationError(
                "env.image",
                image or snapshot,
                f"the {self.backend.name} "
                f"backend cannot give an environment a root of its own: use "
                f"the bwrap backend",
            )
        if snapshot is not None:
            node = roots.snapshot(snapshot).node
            self._check_room(node, 1, memory_mb, disk)
        else:
            node = self.envs.choose_node(self.pool, memory_mb, min_cores, disk)
        return await self._open(
            Environment("", trajectory, node, memory_mb, "", network, disk_mb=disk, uid=uid), stack
        )

    def _require_started(self) -> None:
        if not self._started:
            raise NotStarted(
                "the CPU manager cannot serve before it is started: await its "
                "start() (Tangram.start does) first"
            )

    async def _open(self, proto: Environment, stack=None) -> str:
        if self._closed:
            raise TangramError("the CPU manager is closed")
        self._require_started()
        env_id = f"env-{uuid.uuid4().hex[:12]}"
        taken = self.envs.of_trajectory(proto.trajectory)
        if taken is not None:
            raise ValidationError(
                "env.trajectory", proto.trajectory, f"already has environment {taken.id}"
            )
        prepared: Prepared | None = None
        workdir, root = os.path.join(self.workdir_root, owned_name(env_id)), None
        if stack is not None:
            assert self.roots is not None
            if proto.uid is None and self.roots.layers.idmapped:  # its layers are mapped to it
                proto = dataclasses.replace(proto, uid=self.backend.new_owner())
            prepared = await asyncio.to_thread(
                self.roots.prepare, env_id, stack, proto.disk_mb, proto.uid
            )
            workdir, root = prepared.workdir, prepared.root
        env = dataclasses.replace(proto, id=env_id, workdir=workdir, root=root)
        try:
            if self._closed:  # closed while its tree was being made
                raise TangramError("the CPU manager is closed")
            record = self.envs.add(env, EnvState.OPENING)  # validates: one per trajectory
        except BaseException:
            if prepared is not None:
                await asyncio.to_thread(self._discard, env.node, prepared.rooted, prepared.pin)
            raise
        if prepared is not None:
            record.rooted, record.pin = prepared.rooted, prepared.pin
        cores = tuple(sorted(self.pool.cpu_node(env.node).domain_of))
        try:
            record.sandbox = await self.backend.open(env, cores)
        except BaseException:
            if self.envs.record(env_id) is record:
                self.envs.remove(env_id)
            if prepared is not None:
                await asyncio.to_thread(self._discard, env.node, prepared.rooted, prepared.pin)
            raise
        if prepared is not None and prepared.rooted.uid is None:
            prepared.rooted.uid = record.sandbox.uid
        record.to(EnvState.IDLE)  # (a close waited for it: OPENING settles)
        return env_id

    def sandbox(self, env_id: str) -> Sandbox | None:
        """The backend's sandbox of an open environment (None: not open, or still opening)."""
        record = self.envs.record(env_id)
        return None if record is None else record.sandbox

    def _roots(self, field: str, value) -> Roots:
        if self.roots is None:
            why = (
                "they need root (overlayfs on loop devices; this server runs as uid "
                f"{os.geteuid()}: docs/rootless.md)"
                if self.backend.local and os.geteuid() != 0
                else "it keeps no state folder"
            )
            raise ValidationError(
                field,
                value,
                f"the {self.backend.name} backend has no images, disk bounds or forks here: {why}",
            )
        return self.roots

    def _discard(self, node: str, rooted: Rooted, pin: int | None) -> None:
        assert self.roots is not None
        for layer in self.roots.discard(rooted, pin):
            self.envs.reserve_disk(node, -layer.counted_mb)

    def _check_room(self, node: str, n: int, memory_mb: int, disk_mb: int) -> None:
        if self.envs.memory_free(node) < n * memory_mb:
            raise Infeasible(
                f"env.memory_mb: {n} x {memory_mb} MiB over the "
                f"{self.envs.memory_free(node)} MiB free on {node}"
            )
        if self.envs.disk_free(node) < n * disk_mb:
            raise Infeasible(
                f"env.disk_mb: {n} x {disk_mb} MiB over the "
                f"{self.envs.disk_free(node)} MiB of disk free on {node}"
            )

    async def close_env(self, env_id: str) -> None:
        """Kill everything left in the environment and remove it. Unknown ids are ignored, and
        so is a second close while the first is still at work (the idle reaper and shutdown
        may both close one environment); a fork, snapshot or reset of it ends first."""
        record = self.envs.record(env_id)
        if record is None:
            return
        await record.settled()
        if record.state in (EnvState.CLOSING, EnvState.CLOSED):
            return
        record.to(EnvState.CLOSING)
        env, rooted = record.env, record.rooted
        try:
            await self.end_sessions(record)
            if rooted is not None:  # the tree first (lazily: the sandbox lets go when killed)
                assert self.roots is not None
                await asyncio.to_thread(self.roots.layers.unmount, rooted.target)
            if record.sandbox is not None:
                await record.sandbox.close()
        finally:
            if self.envs.record(env_id) is record:
                self.envs.remove(env_id)
            if rooted is not None:
                await asyncio.to_thread(self._discard, env.node, rooted, record.pin)

    async def reset_env(self, env_id: str) -> str | None:
        """Reset a used environment for an unrelated next user (`Sandbox.reset`): None when
        done, else why not (the caller closes it then)."""
        record = self.envs.record(env_id)
        if record is None:
            return "it is not open"
        if record.state is not EnvState.IDLE:
            return f"it is {record.state.value}"
        if record.rooted is not None:
            return "it has layers"
        record.to(EnvState.RESETTING)
        try:
            return await record.sandbox.reset()
        finally:
            record.to(EnvState.IDLE)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for record in self.envs.records():  # a fork or snapshot under way ends first
            await record.settled()
        for env in self.envs.all():
            await self.close_env(env.id)
        if self.roots is not None:
            for sid in list(self.roots.snapshots):
                await self.delete_snapshot(sid)
        if self._backend is not None:
            await self._backend.shutdown()

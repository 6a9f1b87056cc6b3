"""The CPU manager, allocate-on-execution (paper 5.2).

The scheduler grants an action cores (`Assignment.placement['cpu'].cores`, taken from this
manager's `CorePool`) and calls `run`; the manager confines the action's command to exactly
those cores in the trajectory's environment and returns when no process of it is left, so the
scheduler can release the cores. Environments are opened before a trajectory's first action
(`open_env`) and closed with it (`close_env`); `binding(trajectory)` names the node a
trajectory's actions must stay on.
"""

from __future__ import annotations

import logging
import os
import tempfile
import uuid
from collections.abc import Mapping

from managers.base import EnvironmentManager
from managers.cpu.backends import Backend, EnvironmentBroken, select
from managers.cpu.leftovers import owned_name, sweep_workdirs
from managers.cpu.pool import Environment, EnvironmentTable
from managers.cpu.request import ExecRequest, exec_target
from tangram.actions import Action
from tangram.allocation import Assignment
from tangram.errors import ValidationError
from tangram.pools import CorePool
from tangram.resources import Demand
from tangram.results import Result
from topology import CpuNode
from topology.discovery import discover_numa

LOCAL = "local"
log = logging.getLogger(__name__)


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
    containers; see `leftovers`) and logs it: environments do not survive a restart.
    """

    name = "cpu"

    def __init__(self, backend: str | Backend = "auto", *, resource: str = "cpu",
                 nodes: Mapping[str, CpuNode] | None = None,
                 memory_mb: Mapping[str, int] | None = None,
                 workdir_root: str | None = None) -> None:
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
        self.envs = EnvironmentTable(memory_mb)
        self.broken: dict[str, str] = {}  # env id -> why
        self.workdir_root = workdir_root or tempfile.gettempdir()
        self._closed = False
        self.swept = self.backend.sweep() + sweep_workdirs(self.workdir_root)
        for line in self.swept:
            log.warning("swept what a dead server left: %s", line)

    def binding(self, trajectory: str) -> str | None:
        """The node a trajectory's environment lives on (None before `open_env`)."""
        return self.envs.binding(trajectory)

    def bindings(self) -> dict[tuple[str, str], str]:
        return {(e.trajectory, self.resource): e.node for e in self.envs.all()}

    async def open_env(self, trajectory: str, memory_mb: int = 1024, min_cores: int = 1,
                       network: bool = False) -> str:
        """Open the trajectory's environment on a node with `memory_mb` free for its whole
        life and, preferably, `min_cores` free now (memory load balanced); returns its id.
        `network`: whether its commands may reach the network (off by default)."""
        if not isinstance(trajectory, str) or not trajectory:
            raise ValidationError("env.trajectory", trajectory, "must be a non-empty string")
        if not isinstance(network, bool):
            raise ValidationError("env.network", network, "must be true or false")
        node = self.envs.choose_node(self.pool, memory_mb, min_cores)
        env_id = f"env-{uuid.uuid4().hex[:12]}"
        env = Environment(env_id, trajectory, node, memory_mb,
                          os.path.join(self.workdir_root, owned_name(env_id)), network)
        self.envs.add(env)  # validates: one environment per trajectory
        try:
            await self.backend.open(env, tuple(sorted(self.pool.cpu_node(node).domain_of)))
        except BaseException:
            self.envs.remove(env_id)
            raise
        return env_id

    async def close_env(self, env_id: str) -> None:
        """Kill everything left in the environment and remove it. Unknown ids are ignored, and
        so is a second close while the first is still at work (the idle reaper and shutdown
        may both close one environment)."""
        env = self.envs.get(env_id)
        if env is None:
            return
        try:
            await self.backend.close(env)
        finally:
            if self.envs.get(env_id) is env:
                self.envs.remove(env_id)
            self.broken.pop(env_id, None)

    async def run(self, assignment: Assignment) -> Result:
        target = exec_target(assignment, self.envs)
        if isinstance(target, Result):
            return target
        req, env = target
        placement = assignment.placement.get(self.resource)
        if placement is None or not placement.cores or placement.node != env.node:
            return Result("failed", detail=f"action {assignment.action_id}: placement "
                           f"{placement} is not cores on the environment's node {env.node}")
        if req.env_id in self.broken:
            return Result("failed", detail=self.broken[req.env_id])
        try:
            return await self.backend.exec(env, placement.cores, req.command, req.timeout,
                                           req.output_cap, elastic=req.elastic)
        except EnvironmentBroken as exc:
            self.broken[req.env_id] = str(exc)
            return Result("failed", detail=str(exc))

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
        for env in self.envs.all():
            await self.close_env(env.id)
        await self.backend.shutdown()


"""`RayCpuManager`: the `cpu` pool over every Ray node, each node's cores enforced by its agent.

It is a `Manager` like `managers.cpu.CpuManager` and keeps its environments the same way, in a
`managers.cpu.environments.EnvironmentTable` (the one place that holds trajectory -> environment ->
node and the memory reserved per node, and whose `choose_node` is the one node-choice rule),
so `Tangram(cpu=...)` runs the same scheduler, policy and invariant checks over it. Its
`CorePool` has one node per agent (`n-<first 8 hex of the Ray node id>`); `run` sends each
assignment to the agent of the placement's node. Membership and faults: `nodes`.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from managers.base import EnvironmentManager
from managers.cpu.environments import Environment, EnvironmentTable
from managers.cpu.request import exec_target
from managers.gpu import NodeLost
from tangram.allocation import Assignment
from tangram.errors import BackendUnavailable, Infeasible, NotFound, ValidationError
from tangram.pools import CorePool
from tangram.results import Result, Status
from tangram.runtime.ray.agent import NodeInfo
from tangram.runtime.ray.nodes import RayNode, RayNodes, alive_nodes
from tangram.runtime.ray.remote import RemoteAgent, import_ray, spawn_agent, start_now

log = logging.getLogger("tangram.ray")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _Backend:
    name: str


class RayCpuManager(EnvironmentManager):
    """Build it with `connect` (it starts the agents and reads their topology); the constructor
    itself takes already described agents and does nothing else."""

    name = "cpu"

    def __init__(
        self,
        agents: Mapping[str, tuple[RemoteAgent, NodeInfo]],
        *,
        resource: str = "cpu",
        backend: str = "auto",
        backend_options: Mapping[str, Any] | None = None,
        poll_s: float = 1.0,
        owns_ray: bool = False,
        gpu_backend: str | None = None,
        gpu_options: Mapping[str, Any] | None = None,
        gpus_per_node: int | None = None,
    ) -> None:
        self.resource = resource
        self.backend = _Backend(f"ray:{backend}")
        self._agent_spec = (
            backend,
            dict(backend_options or {}),
            (gpu_backend, dict(gpu_options or {}), gpus_per_node),
        )
        self._owns_ray = owns_ray
        self.pool = CorePool(resource, {})
        self.envs = EnvironmentTable({})
        self.members = RayNodes(self.pool, self.envs, self._spawn, poll_s)
        for agent, info in agents.values():
            self.members.join(agent, info)
        self._snapshots: dict[str, str] = {}  # snapshot id -> the node that holds it
        self._closed = False

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def connect(
        cls, address: str | None = None, *, timeout_s: float = 60.0, **options: Any
    ) -> RayCpuManager:
        """Join the Ray cluster at `address` (None: start a local one-node Ray; an existing
        connection is reused), start an agent on every alive node and wait for their reports.
        `options`: the constructor's. With `gpu_backend`, every agent also runs that GPU
        backend on its machine's GPUs (`gpus_per_node` of them for a `sim` backend)."""
        ray = import_ray()
        owns = False
        if not ray.is_initialized():
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            ray.init(
                address=address,
                namespace="tangram",
                logging_level=logging.WARNING,
                include_dashboard=False if address is None else None,
            )
            owns = True
        self = cls({}, owns_ray=owns, **options)
        spawned = [self._spawn(rid, n["Resources"]) for rid, n in alive_nodes().items()]
        agents = [a for a in spawned if a is not None]
        for agent, info in zip(agents, start_now(agents, timeout_s), strict=True):
            self.members.join(agent, info)
        if not self.nodes:
            raise BackendUnavailable(f"no Ray node can host a CPU agent: {ray.nodes()}")
        return self

    def _spawn(self, ray_node_id: str, resources: Mapping[str, float]) -> RemoteAgent | None:
        backend, options, gpu = self._agent_spec
        return spawn_agent(ray_node_id, resources, backend, options, gpu)

    # -- membership (nodes) --------------------------------------------------------------------
    @property
    def nodes(self) -> dict[str, RayNode]:
        return self.members.nodes

    @property
    def on_lost(self):
        return self.members.on_lost

    def describe_nodes(self) -> dict[str, dict[str, Any]]:
        return self.members.describe()

    async def refresh(self, alive: Mapping[str, Mapping[str, Any]]) -> None:
        await self.members.refresh(alive)

    # -- the Manager interface -----------------------------------------------------------------
    async def start(self) -> None:
        self.members.ensure_watcher()  # membership is watched from the start

    def binding(self, trajectory: str) -> str | None:
        return self.envs.binding(trajectory)

    def bindings(self) -> dict[tuple[str, str], str]:
        return {(e.trajectory, self.resource): e.node for e in self.envs.all()}

    def _check_free(self, trajectories: Sequence[Any], field: str) -> None:
        for t in trajectories:
            if not isinstance(t, str) or not t:
                raise ValidationError(field, t, "must be a non-empty string")
            env = self.envs.of_trajectory(t)
            if env is not None:
                raise ValidationError(field, t, f"already has an environment ({env.id})")

    def _hold(self, trajectory: str, node: str, memory_mb: int) -> str:
        """Reserve the memory and the trajectory before the agent's answer, so a concurrent
        open sees both; the hold is replaced by the environment, or dropped on failure."""
        hold = f"opening-{uuid.uuid4().hex}"
        self.envs.add(Environment(hold, trajectory, node, memory_mb, workdir=""))
        return hold

    async def _on(self, node: str, call: Awaitable[T], what: str) -> T:
        """An agent call whose agent dying loses the node and fails `what` clearly."""
        try:
            return await call
        except NodeLost as exc:
            self.members.lose(node, str(exc).removeprefix(f"node {node}: "))
            raise BackendUnavailable(
                f"{what}: node {node} was lost ({exc}); open a new environment"
            ) from None

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
        self.members.ensure_watcher()
        layers = {
            k: v
            for k, v in (("image", image), ("disk_mb", disk_mb), ("snapshot", snapshot))
            if v is not None
        }
        self._check_free([trajectory], "env.trajectory")
        name = (
            self._snapshot_node(snapshot)
            if snapshot is not None
            else self.envs.choose_node(
                self.pool, memory_mb, min_cores, exclude=self.members.lost_nodes()
            )
        )
        hold = self._hold(trajectory, name, memory_mb)
        try:
            env_id = await self._on(
                name,
                self.nodes[name].agent.open_env(trajectory, memory_mb, network, layers),
                f"env for {trajectory}",
            )
        finally:
            self.envs.remove(hold)
        self.envs.add(Environment(env_id, trajectory, name, memory_mb, workdir=""))
        return env_id

    # -- environments' trees: on the node that holds them (a fork stays on its parent's) ---
    def _snapshot_node(self, snapshot_id: str) -> str:
        name = self._snapshots.get(snapshot_id) if isinstance(snapshot_id, str) else None
        if name is None:
            raise NotFound("snapshot", snapshot_id, "no such snapshot")
        if self.nodes[name].lost:
            raise BackendUnavailable(f"snapshot {snapshot_id}: its node {name} is lost")
        return name

    def _remote(self, env_id: str) -> tuple[Environment, RayNode]:
        env = self.envs.get(env_id) if isinstance(env_id, str) else None
        if env is None:
            raise ValidationError("env_id", env_id, "no open environment with this id")
        lost = self.lost_reason(env_id)
        if lost:
            raise BackendUnavailable(lost)
        return env, self.nodes[env.node]

    async def fork_env(self, env_id: str, trajectories: Sequence[str]) -> list[str]:
        env, node = self._remote(env_id)
        self._check_free(trajectories, "trajectories")
        free = self.envs.memory_free(env.node)
        if free < len(trajectories) * env.memory_mb:
            raise Infeasible(
                f"env.memory_mb: {len(trajectories)} x {env.memory_mb} MiB over "
                f"the {free} MiB free on {env.node}"
            )
        holds = [self._hold(t, env.node, env.memory_mb) for t in trajectories]
        try:
            children = await self._on(
                env.node, node.agent.fork_env(env_id, trajectories), f"fork of {env_id}"
            )
        finally:
            for hold in holds:
                self.envs.remove(hold)
        for child, trajectory in zip(children, trajectories, strict=True):
            self.envs.add(Environment(child, trajectory, env.node, env.memory_mb, workdir=""))
        return children

    async def snapshot(self, env_id: str) -> str:
        env, node = self._remote(env_id)
        sid = await self._on(env.node, node.agent.snapshot(env_id), f"snapshot of {env_id}")
        self._snapshots[sid] = env.node
        return sid

    def snapshots(self) -> list[dict[str, Any]]:
        return [{"snapshot_id": s, "node": n} for s, n in self._snapshots.items()]

    async def delete_snapshot(self, snapshot_id: str) -> None:
        name = self._snapshot_node(snapshot_id)
        await self._on(
            name, self.nodes[name].agent.delete_snapshot(snapshot_id), f"snapshot {snapshot_id}"
        )
        del self._snapshots[snapshot_id]

    async def write_files(self, env_id: str, contents: Mapping[str, bytes]) -> None:
        env, node = self._remote(env_id)
        await self._on(env.node, node.agent.write_files(env_id, contents), f"files of {env_id}")

    async def read_files(self, env_id: str, paths: Sequence[str]) -> dict[str, bytes | None]:
        env, node = self._remote(env_id)
        return await self._on(env.node, node.agent.read_files(env_id, paths), f"files of {env_id}")

    # -- shell sessions: on the environment's node (its agent's CPU manager hosts them) ------
    async def open_session(self, env_id: str, name: str) -> None:
        env, node = self._remote(env_id)
        what = f"session {name} of {env_id}"
        await self._on(env.node, node.agent.open_session(env_id, name), what)
        record = self.envs.record(env_id)
        if record is not None:
            record.sessions[name] = True  # (the node holds it: here, its name)

    async def close_session(self, env_id: str, name: str) -> None:
        env, node = self._remote(env_id)
        what = f"session {name} of {env_id}"
        await self._on(env.node, node.agent.close_session(env_id, name), what)
        record = self.envs.record(env_id)
        if record is not None:
            record.sessions.pop(name, None)

    def sessions_of(self, env_id: str) -> list[str]:
        record = self.envs.record(env_id) if isinstance(env_id, str) else None
        return [] if record is None else sorted(record.sessions)

    async def kernel_command(self, env_id: str) -> str:
        env, node = self._remote(env_id)
        return await self._on(env.node, node.agent.kernel_command(env_id), f"kernel in {env_id}")

    async def close_env(self, env_id: str) -> None:
        env = self.envs.get(env_id) if isinstance(env_id, str) else None
        if env is None:
            return
        self.envs.remove(env_id)
        node = self.nodes.get(env.node)
        if node is not None and not node.lost:
            try:
                await node.agent.close_env(env_id)
            except NodeLost as exc:
                self.members.lose(env.node, str(exc).removeprefix(f"node {env.node}: "))
        self.members.retire_drained()

    def lost_reason(self, env_id: str) -> str | None:
        env = self.envs.get(env_id)
        node = self.nodes.get(env.node) if env is not None else None
        if node is None or not node.lost:
            return None
        return (
            f"environment {env_id} of trajectory {env.trajectory} is lost: node {env.node} "
            f"(Ray node {node.info.ray_node_id[:12]}) {node.lost}; close it and open a "
            "new one"
        )

    async def run(self, assignment: Assignment) -> Result:
        self.members.ensure_watcher()
        target = exec_target(assignment, self.envs)
        if isinstance(target, Result):
            return target
        req, env = target
        lost = self.lost_reason(req.env_id)
        if lost:
            return Result(Status.FAILED, detail=lost)
        node = self.nodes[env.node]
        try:
            return await node.agent.run(assignment)
        except NodeLost as exc:
            self.members.lose(env.node, str(exc).removeprefix(f"node {env.node}: "))
            return Result(
                Status.FAILED,
                detail=f"action {assignment.action_id} failed: node "
                f"{env.node} (Ray node {node.info.ray_node_id[:12]}) was lost while "
                f"it ran; its environment {env.id} is lost",
            )
        except Exception as exc:
            return Result(Status.FAILED, detail=f"node {env.node}: {type(exc).__name__}: {exc}")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self.members.close()
        if self._owns_ray:
            import_ray().shutdown()

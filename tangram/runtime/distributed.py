"""Tangram over a Ray cluster: one node agent per machine, the scheduler and its pools central.

```python
tg = Tangram.ray(address="auto", cpu_backend="cgroup")   # or "ray://head:10001", "local:3"
async with tg:
    env = await tg.open_env("traj-1")                      # placed on some node, bound there
    r = await tg.exec(env, "pytest -q", cpu=(1, 8), elastic=True)
    r.placement["cpu"].node                                 # e.g. "n-77f33c71"
```

`RayCpuManager` is a `Manager` like `managers.cpu.CpuManager`, so `Tangram(cpu=...)` runs the
same scheduler, policy and invariant checks over it: its `CorePool` has one node per agent
(named `n-<first 8 hex of the Ray node id>`), and `run` sends each assignment to the agent that
owns the placement's node. Ray does placement and RPC only.

Membership and faults. A watcher polls `ray.nodes()` every `poll_s`: a node joining gets an
agent and its cores join the pool; a node (or its agent) dying fails the actions running there
(`Result(Status.FAILED)`, naming the node), marks its environments lost (every later exec in them
fails at once with the reason), and keeps every other queued action. A lost node stays in the
pool, taking no new environments, until its environments are closed and its cores come back;
then it leaves.

`local:N` as an address starts an N-node cluster on this machine (`ray.cluster_utils.Cluster`,
the `sim` backend per node, for demos and tests): see `ray_session`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from managers.base import EnvironmentManager
from managers.cpu.pool import pick_node
from managers.cpu.request import exec_target
from managers.gpu import GB, GpuBackend, GpuManager, NodeLost, Residency, Service
from tangram.allocation import Assignment
from tangram.errors import BackendUnavailable, Infeasible, NotFound, ValidationError
from tangram.pools import ChunkPool, CorePool
from tangram.results import Result, Status
from tangram.runtime.config import (
    DEFAULT_POLICY,
    Components,
    build_apis,
    build_gpu,
    build_services,
    check_policy,
)
from tangram.runtime.ray_agent import NodeAgent, NodeInfo, sleep_seconds
from tangram.validation import pos_num
from topology import ChunkTree, CpuNode

log = logging.getLogger("tangram.ray")
MiB = 1 << 20
INSTALL_HINT = "Ray is not installed: pip install 'arl-tangram[ray]'"


def import_ray():
    try:
        import ray
    except ImportError:
        raise BackendUnavailable(INSTALL_HINT) from None
    return ray


def node_name(ray_node_id: str) -> str:
    return f"n-{ray_node_id[:8]}"


@dataclass(frozen=True, slots=True)
class RemoteEnv:
    id: str
    trajectory: str
    node: str
    memory_mb: int


@dataclass(slots=True)
class _Node:
    info: NodeInfo
    agent: Any  # the Ray actor handle
    lost: str = ""  # why, once the node or its agent died
    reserved_mb: int = 0
    envs: set[str] = field(default_factory=set)


@dataclass(frozen=True, slots=True)
class _Backend:
    name: str


class RayCpuManager(EnvironmentManager):
    """The `cpu` pool over every Ray node, each node's cores enforced by its agent.

    Build it with `connect` (it starts the agents and reads their topology); the constructor
    itself takes already described agents and does nothing else.
    """

    name = "cpu"

    def __init__(self, agents: Mapping[str, tuple[Any, NodeInfo]], *, resource: str = "cpu",
                 backend: str = "auto", backend_options: Mapping[str, Any] | None = None,
                 poll_s: float = 1.0, owns_ray: bool = False, gpu_backend: str | None = None,
                 gpu_options: Mapping[str, Any] | None = None,
                 gpus_per_node: int | None = None) -> None:
        self.resource = resource
        self._gpu = (gpu_backend, dict(gpu_options or {}), gpus_per_node)
        self.backend = _Backend(f"ray:{backend}")
        self._backend_name = backend
        self._backend_options = dict(backend_options or {})
        self.poll_s = poll_s
        self._owns_ray = owns_ray
        self.nodes: dict[str, _Node] = {n: _Node(info, a) for n, (a, info) in agents.items()}
        self.pool = CorePool(resource, {n: CpuNode(n, info.numa) for n, (_, info) in
                                        agents.items()})
        self.envs: dict[str, RemoteEnv] = {}
        self._by_trajectory: dict[str, str] = {}
        self._joining: set[str] = set()
        self._opening: set[str] = set()  # trajectories whose open_env is in flight
        self._snapshots: dict[str, str] = {}  # snapshot id -> the node that holds it
        self.on_lost: list[Callable[[str, str], None]] = []  # (node, why) when a node dies
        self._watcher: asyncio.Task | None = None
        self._closed = False

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def connect(cls, address: str | None = None, *, backend: str = "auto",
                backend_options: Mapping[str, Any] | None = None, poll_s: float = 1.0,
                resource: str = "cpu", timeout_s: float = 60.0, gpu_backend: str | None = None,
                gpu_options: Mapping[str, Any] | None = None,
                gpus_per_node: int | None = None) -> RayCpuManager:
        """Join the Ray cluster at `address` (None: start a local one-node Ray; an existing
        connection is reused), start an agent on every alive node and wait for their reports.
        With `gpu_backend`, every agent also runs that GPU backend on its machine's GPUs
        (`gpus_per_node` of them for a `sim` backend)."""
        ray = import_ray()
        owns = False
        if not ray.is_initialized():
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            ray.init(address=address, namespace="tangram", logging_level=logging.WARNING,
                     include_dashboard=False if address is None else None)
            owns = True
        self = cls({}, resource=resource, backend=backend, backend_options=backend_options,
                   poll_s=poll_s, owns_ray=owns, gpu_backend=gpu_backend,
                   gpu_options=gpu_options, gpus_per_node=gpus_per_node)
        pending = {nid: self._spawn(nid, n["Resources"]) for nid, n in self._alive().items()}
        pending = {nid: a for nid, a in pending.items() if a is not None}
        infos = ray.get([a.start.remote() for a in pending.values()], timeout=timeout_s)
        for agent, info in zip(pending.values(), infos, strict=True):
            self._join(agent, info)
        if not self.nodes:
            raise BackendUnavailable(f"no Ray node can host a CPU agent: {ray.nodes()}")
        return self

    def _alive(self) -> dict[str, dict]:
        ray = import_ray()
        return {n["NodeID"]: n for n in ray.nodes() if n.get("Alive")}

    def _spawn(self, ray_node_id: str, resources: Mapping[str, float]):
        """An agent pinned to the node, or None when the sim backend has no cores to model."""
        ray = import_ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        # the node's capacity is the CPU resource Ray offers there (`ray start --num-cpus 8`
        # on a 64-core machine: 8 cores), not the machine's physical core count
        cores = int(resources.get("CPU", 0))
        if cores == 0:
            return None
        memory = None
        if self._backend_name == "sim":  # model the node Ray describes
            memory = int(resources.get("memory", 0) // MiB) or 4096
        actor = ray.remote(num_cpus=0, max_restarts=0)(NodeAgent)
        return actor.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(ray_node_id, soft=False),
            name=f"tangram-agent-{ray_node_id[:8]}-{uuid.uuid4().hex[:6]}",
        ).remote(node_name(ray_node_id), ray_node_id, self._backend_name,
                 self._backend_options, cores, memory, gpu_backend=self._gpu[0],
                 gpu_options=self._gpu[1], gpus=self._gpu[2])

    def _join(self, agent: Any, info: NodeInfo) -> None:
        self.nodes[info.name] = _Node(info, agent)
        self.pool.add_node(CpuNode(info.name, info.numa))
        log.info("ray: node %s joined (%d cores, %d MiB, %d GPUs, backend %s)", info.name,
                 info.cores, info.memory_mb, info.gpus, info.backend)

    # -- the Manager interface -----------------------------------------------------------------
    async def start(self) -> None:
        self._ensure_watcher()  # membership is watched from the start, not the first action

    def binding(self, trajectory: str) -> str | None:
        env_id = self._by_trajectory.get(trajectory)
        return self.envs[env_id].node if env_id is not None else None

    def bindings(self) -> dict[tuple[str, str], str]:
        return {(e.trajectory, self.resource): e.node for e in self.envs.values()}

    def _choose_node(self, memory_mb: int, min_cores: int) -> str:
        """The rule of `managers.cpu.pool.pick_node` over the live nodes."""
        live = [n for n, s in self.nodes.items() if not s.lost]
        node = pick_node(live, lambda n: self.nodes[n].info.memory_mb - self.nodes[n].reserved_mb,
                         lambda n: self.nodes[n].reserved_mb / self.nodes[n].info.memory_mb,
                         self.pool.free, memory_mb, min_cores)
        if node is None:
            raise Infeasible(f"env.memory_mb: {memory_mb} MiB fits on no live node ("
                             f"{len(live)} live)")
        return node

    async def open_env(self, trajectory: str, memory_mb: int = 1024, min_cores: int = 1,
                       network: bool = False, *, image: str | None = None,
                       disk_mb: int | None = None, snapshot: str | None = None) -> str:
        self._ensure_watcher()
        layers = {k: v for k, v in (("image", image), ("disk_mb", disk_mb),
                                    ("snapshot", snapshot)) if v is not None}
        if not isinstance(trajectory, str) or not trajectory:
            raise ValidationError("env.trajectory", trajectory, "must be a non-empty string")
        if trajectory in self._by_trajectory or trajectory in self._opening:
            raise ValidationError("env.trajectory", trajectory,
                                  "already has an environment" + (
                                      f" ({self._by_trajectory[trajectory]})"
                                      if trajectory in self._by_trajectory else
                                      " (being opened)"))
        name = self._snapshot_node(snapshot) if snapshot is not None else \
            self._choose_node(memory_mb, min_cores)
        node = self.nodes[name]
        # both before the await, so a concurrent open sees them: the memory and the trajectory
        node.reserved_mb += memory_mb
        self._opening.add(trajectory)
        try:
            env_id = await node.agent.open_env.remote(trajectory, memory_mb, network, layers)
        except BaseException as exc:
            node.reserved_mb -= memory_mb
            if _is_actor_death(exc):
                self._lose(name, f"its agent died ({type(exc).__name__})")
                raise BackendUnavailable(f"env for {trajectory}: node {name} was lost while "
                                         "opening it; open it again") from None
            raise
        finally:
            self._opening.discard(trajectory)
        self.envs[env_id] = RemoteEnv(env_id, trajectory, name, memory_mb)
        self._by_trajectory[trajectory] = env_id
        node.envs.add(env_id)
        return env_id

    # -- environments' trees: on the node that holds them (a fork stays on its parent's) ---
    def _snapshot_node(self, snapshot_id: str) -> str:
        name = self._snapshots.get(snapshot_id) if isinstance(snapshot_id, str) else None
        if name is None:
            raise NotFound("snapshot", snapshot_id, "no such snapshot")
        if self.nodes[name].lost:
            raise BackendUnavailable(f"snapshot {snapshot_id}: its node {name} is lost")
        return name

    def _remote(self, env_id: str) -> tuple[RemoteEnv, _Node]:
        env = self.envs.get(env_id) if isinstance(env_id, str) else None
        if env is None:
            raise ValidationError("env_id", env_id, "no open environment with this id")
        lost = self.lost_reason(env_id)
        if lost:
            raise BackendUnavailable(lost)
        return env, self.nodes[env.node]

    async def fork_env(self, env_id: str, trajectories: Sequence[str]) -> list[str]:
        env, node = self._remote(env_id)
        taken = [t for t in trajectories if t in self._by_trajectory or t in self._opening]
        if taken:
            raise ValidationError("trajectories", taken[0], "already has an environment")
        free = node.info.memory_mb - node.reserved_mb
        if free < len(trajectories) * env.memory_mb:
            raise Infeasible(f"env.memory_mb: {len(trajectories)} x {env.memory_mb} MiB over "
                             f"the {free} MiB free on {env.node}")
        node.reserved_mb += len(trajectories) * env.memory_mb
        self._opening.update(trajectories)
        try:
            children = await node.agent.fork_env.remote(env_id, list(trajectories))
        except BaseException:
            node.reserved_mb -= len(trajectories) * env.memory_mb
            raise
        finally:
            self._opening.difference_update(trajectories)
        for child, trajectory in zip(children, trajectories):
            self.envs[child] = RemoteEnv(child, trajectory, env.node, env.memory_mb)
            self._by_trajectory[trajectory] = child
            node.envs.add(child)
        return list(children)

    async def snapshot(self, env_id: str) -> str:
        env, node = self._remote(env_id)
        sid = await node.agent.snapshot.remote(env_id)
        self._snapshots[sid] = env.node
        return sid

    def snapshots(self) -> list[dict[str, Any]]:
        return [{"snapshot_id": s, "node": n} for s, n in self._snapshots.items()]

    async def delete_snapshot(self, snapshot_id: str) -> None:
        name = self._snapshot_node(snapshot_id)
        await self.nodes[name].agent.delete_snapshot.remote(snapshot_id)
        del self._snapshots[snapshot_id]

    async def write_files(self, env_id: str, contents: Mapping[str, bytes]) -> None:
        _, node = self._remote(env_id)
        await node.agent.write_files.remote(env_id, dict(contents))

    async def read_files(self, env_id: str, paths: Sequence[str]) -> dict[str, bytes | None]:
        _, node = self._remote(env_id)
        return await node.agent.read_files.remote(env_id, list(paths))

    async def close_env(self, env_id: str) -> None:
        env = self.envs.pop(env_id, None)
        if env is None:
            return
        self._by_trajectory.pop(env.trajectory, None)
        node = self.nodes.get(env.node)
        if node is None:
            return
        node.envs.discard(env_id)
        node.reserved_mb -= env.memory_mb
        if not node.lost:
            try:
                await node.agent.close_env.remote(env_id)
            except Exception as exc:
                if not _is_actor_death(exc):
                    raise
                self._lose(env.node, f"its agent died ({type(exc).__name__})")
        self._retire_drained()

    def lost_reason(self, env_id: str) -> str | None:
        env = self.envs.get(env_id)
        if env is None or not self.nodes[env.node].lost:
            return None
        return (f"environment {env_id} of trajectory {env.trajectory} is lost: node {env.node} "
                f"(Ray node {self.nodes[env.node].info.ray_node_id[:12]}) "
                f"{self.nodes[env.node].lost}; close it and open a new one")

    async def run(self, assignment: Assignment) -> Result:
        self._ensure_watcher()
        target = exec_target(assignment, self.envs)
        if isinstance(target, Result):
            return target
        req, env = target
        lost = self.lost_reason(req.env_id)
        if lost:
            return Result(Status.FAILED, detail=lost)
        node = self.nodes[env.node]
        try:
            return await node.agent.run.remote(assignment)
        except Exception as exc:
            if not _is_actor_death(exc):
                return Result(Status.FAILED, detail=f"node {env.node}: {type(exc).__name__}: {exc}")
            self._lose(env.node, f"died ({type(exc).__name__})")
            return Result(Status.FAILED, detail=f"action {assignment.action_id} failed: node "
                           f"{env.node} (Ray node {node.info.ray_node_id[:12]}) was lost while "
                           f"it ran; its environment {env.id} is lost")

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
        ray = import_ray()
        live = [n for n in self.nodes.values() if not n.lost]
        with contextlib.suppress(Exception):
            await asyncio.wait_for(asyncio.gather(*(n.agent.close.remote() for n in live),
                                                  return_exceptions=True), 10.0)
        for n in self.nodes.values():
            with contextlib.suppress(Exception):
                ray.kill(n.agent)
        if self._owns_ray:
            ray.shutdown()

    # -- membership and faults -----------------------------------------------------------------
    def describe_nodes(self) -> dict[str, dict[str, Any]]:
        return {n: {"ray_node_id": s.info.ray_node_id, "cores": s.info.cores,
                    "memory_mb": s.info.memory_mb, "gpus": s.info.gpus, "lost": s.lost or None,
                    "envs": len(s.envs), "backend": s.info.backend}
                for n, s in self.nodes.items()}

    def _lose(self, name: str, why: str) -> None:
        node = self.nodes.get(name)
        if node is None or node.lost:
            return
        node.lost = why
        log.warning("ray: node %s (Ray node %s) %s: %d environments lost", name,
                    node.info.ray_node_id[:12], why, len(node.envs))
        for hook in self.on_lost:
            hook(name, why)
        self._retire_drained()

    def _retire_drained(self) -> None:
        """A lost node leaves the pool once nothing of it is granted or bound."""
        for name, node in list(self.nodes.items()):
            if node.lost and not node.envs and \
                    self.pool.free(name) == self.pool.capacity(name):
                self.pool.remove_node(name)
                del self.nodes[name]
                log.info("ray: node %s left the pool", name)

    def _ensure_watcher(self) -> None:
        if self._watcher is None and not self._closed and self.poll_s > 0:
            self._watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                await self.refresh(await loop.run_in_executor(None, self._alive))
            except asyncio.CancelledError:
                raise
            except Exception:  # a flaky GCS answer must not stop membership
                log.exception("ray: membership poll failed")
            await asyncio.sleep(self.poll_s)

    async def refresh(self, alive: Mapping[str, Mapping[str, Any]]) -> None:
        """Reconcile with the live Ray nodes: lose the dead, start agents on the new."""
        known = {s.info.ray_node_id: n for n, s in self.nodes.items()}
        for rid, name in known.items():
            if rid not in alive:
                self._lose(name, "died (Ray reports the node dead)")
        self._retire_drained()
        for rid, n in alive.items():
            if rid in known or rid in self._joining:
                continue
            agent = self._spawn(rid, n["Resources"])
            if agent is None:
                continue
            self._joining.add(rid)
            try:
                info = await agent.start.remote()
            except Exception as exc:
                log.warning("ray: agent on new node %s did not start: %s", rid[:12], exc)
                continue
            finally:
                self._joining.discard(rid)
            if not self._closed:
                self._join(agent, info)


def _is_actor_death(exc: BaseException) -> bool:
    try:
        from ray import exceptions
    except ImportError:
        return False
    kinds = tuple(getattr(exceptions, k) for k in ("RayActorError", "ActorUnavailableError")
                  if hasattr(exceptions, k))  # the second is Ray >= 2.30 only
    return isinstance(exc, kinds)


class RayGpuBackend(GpuBackend):
    """The GPU manager's backend over Ray: each call goes to the agent of the chunk's node,
    which restores, evicts and invokes with the GPU backend of its own machine. Chunk choice,
    residency and LRU stay with the central `GpuManager`."""

    name = "ray"

    def __init__(self, agents: Mapping[str, Any],
                 lost: Callable[[str], str | None] = lambda node: None) -> None:
        self.agents = dict(agents)
        self.lost = lost  # why a node is lost (the CPU manager's membership), None if alive

    def _agent(self, node: str) -> Any:
        why = self.lost(node)
        if why:
            raise NodeLost(f"node {node} {why}")
        agent = self.agents.get(node)
        if agent is None:
            raise NodeLost(f"no GPU agent on node {node}")
        return agent

    async def _call(self, node: str, method: str, *args: Any) -> Any:
        try:
            return await getattr(self._agent(node), method).remote(*args)
        except Exception as exc:
            if _is_actor_death(exc):
                raise NodeLost(f"node {node}: its agent died ({type(exc).__name__})") from None
            raise

    async def deploy(self, service: Service) -> None:
        await asyncio.gather(*(a.gpu_deploy.remote(service) for a in self.agents.values()))

    async def restore(self, service: Service, node: str, chunk: tuple[int, int]) -> float:
        return float(await self._call(node, "gpu_restore", service, chunk))

    async def evict(self, service: Service, node: str, chunk: tuple[int, int]) -> None:
        await self._call(node, "gpu_evict", service, chunk)

    async def invoke(self, service: Service, node: str, chunk: tuple[int, int],
                     payload: Any) -> Any:
        return await self._call(node, "gpu_invoke", service, chunk, payload)


def build_ray_gpu(cpu: RayCpuManager, spec: Mapping[str, Any]) -> GpuManager | None:
    """A chunk pool over the agents that report GPUs (the largest power of two of each node's
    GPUs), residency with `spec`'s memory per GPU and services, and `RayGpuBackend`. Nodes are
    those present now; GPU nodes joining later are not added in this version."""
    sizes = {}
    for name, node in cpu.nodes.items():
        if node.info.gpus > 0:
            sizes[name] = 1 << (node.info.gpus.bit_length() - 1)
    if not sizes:
        return None
    mem = int(pos_num("gpu.memory_gb", spec.get("memory_gb", 80)) * GB)
    registry = build_services("gpu.services", spec.get("services"))
    pool = ChunkPool("gpu", {n: ChunkTree(g, n) for n, g in sizes.items()})
    residency = Residency({n: [mem] * g for n, g in sizes.items()}, registry)
    def lost(node: str) -> str | None:
        state = cpu.nodes.get(node)
        return "left the cluster" if state is None else (state.lost or None)

    manager = GpuManager(pool, residency,
                         RayGpuBackend({n: cpu.nodes[n].agent for n in sizes}, lost))
    cpu.on_lost.append(manager.lose_node)  # a dead node's chunks and residency go at once
    return manager


def build_ray(address: str | None = None, *, cpu_backend: str = "auto",
              backend_options: Mapping[str, Any] | None = None, poll_s: float = 1.0,
              services: Mapping[str, Any] | None = None, apis: Mapping[str, Any] | None = None,
              gpu: Mapping[str, Any] | None = None, policy: str = DEFAULT_POLICY,
              policy_options: Mapping[str, Any] | None = None,
              idle_env_s: float | None = None, gpu_backend: str | None = None,
              gpu_options: Mapping[str, Any] | None = None,
              gpus_per_node: int | None = None) -> Components:
    """`Tangram.ray(...)`: the CPU pool over the cluster's agents. With `gpu_backend`, the GPU
    pool too: each agent runs that backend on its machine's GPUs (`gpus_per_node` for `sim`)
    and the central GPU manager places chunks and keeps residency. Without it, the GPU pool is
    central and simulated, as in `Tangram.local()`. APIs are called from the driver."""
    check_policy(policy, dict(policy_options or {}))
    idle = None if idle_env_s is None else pos_num("idle_env_s", idle_env_s)
    if cpu_backend == "sim" and backend_options is None:
        backend_options = {"duration": sleep_seconds, "time_scale": 1.0}
    cpu = RayCpuManager.connect(address, backend=cpu_backend, backend_options=backend_options,
                                poll_s=poll_s, gpu_backend=gpu_backend,
                                gpu_options=gpu_options, gpus_per_node=gpus_per_node)
    try:
        gpu_spec = {**dict(gpu or {}), "services": dict(services or {})}
        gpu_manager = build_ray_gpu(cpu, gpu_spec) if gpu_backend else None
        if gpu_backend and gpu_manager is None:
            raise BackendUnavailable(f"gpu_backend={gpu_backend!r}: no Ray node reports a GPU "
                                     "(set gpus_per_node for the sim backend)")
        return Components(cpu=cpu, gpu=gpu_manager or build_gpu("gpu", gpu_spec),
                          apis=build_apis("apis", apis), policy=policy,
                          policy_options=dict(policy_options or {}), idle_env_s=idle)
    except BaseException:
        asyncio.run(cpu.close()) if not _loop_running() else None
        raise


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


@contextlib.contextmanager
def local_cluster(nodes: int = 3, cpus_per_node: int | Sequence[int] = 2,
                  object_store_mb: int = 100, health_check_ms: int = 500) -> Iterator[Any]:
    """An N-node Ray cluster on this machine (a CPU-less head plus N worker nodes of
    `cpus_per_node` logical CPUs each, or one count per node), connected; shut down on exit.
    Small by default: 100 MB object store per node, no dashboard."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import_ray()
    import ray
    from ray.cluster_utils import Cluster

    store = object_store_mb * MiB
    cluster = Cluster(initialize_head=True, connect=True, head_node_args={
        "num_cpus": 0, "object_store_memory": store, "include_dashboard": False,
        "_system_config": {"health_check_period_ms": health_check_ms,
                           "health_check_failure_threshold": 3}})
    try:
        cpus = [cpus_per_node] * nodes if isinstance(cpus_per_node, int) else cpus_per_node
        for c in cpus:
            cluster.add_node(num_cpus=c, object_store_memory=store)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@contextlib.contextmanager
def ray_session(address: str | None) -> Iterator[tuple[str | None, dict[str, Any]]]:
    """For `tangram demo --ray ADDRESS` and `tangram serve --ray ADDRESS`: `local:N[xC]` starts
    an N-node local cluster of C cores each (default 2) and yields its address with
    `{"cpu_backend": "sim"}`; any other address is yielded as it is, with no options."""
    if address and address.startswith("local:"):
        spec = address.removeprefix("local:")
        n, _, c = spec.partition("x")
        try:
            nodes, cores = int(n or 3), int(c or 2)
        except ValueError:
            raise ValidationError("ray", address, "local cluster is local:N or local:NxC") \
                from None
        with local_cluster(nodes, cores) as cluster:
            yield cluster.address, {"cpu_backend": "sim"}
    else:
        yield address, {}

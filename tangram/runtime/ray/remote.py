"""The central managers' side of a node agent: `RemoteAgent`, the typed client through which
the Ray CPU manager and the Ray GPU backend call an agent (one coroutine per `NodeAgent`
method, a Ray RPC underneath), and starting an agent pinned to its node.

A dead agent, or a dead node, surfaces as one error, `NodeLost`, whatever the Ray version
calls it (`RayActorError`, or `ActorUnavailableError` from Ray 2.30); a caller decides what a
lost node means for its work (the CPU manager fails the action and marks the node's
environments lost; the GPU manager takes the node's chunks out).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Mapping, Sequence
from typing import Any

from managers.gpu import NodeLost, Service
from tangram.allocation import Assignment
from tangram.errors import BackendUnavailable
from tangram.results import Result
from tangram.runtime.ray.agent import NodeAgent, NodeInfo

MiB = 1 << 20
INSTALL_HINT = "Ray is not installed: pip install 'arl-tangram[ray]'"


def import_ray():
    try:
        import ray
    except ImportError:
        raise BackendUnavailable(INSTALL_HINT) from None
    return ray


def node_name(ray_node_id: str) -> str:
    """A node's name in Tangram's pools and placements: `n-` and its Ray id's first 8 hex."""
    return f"n-{ray_node_id[:8]}"


def is_actor_death(exc: BaseException) -> bool:
    try:
        from ray import exceptions
    except ImportError:
        return False
    kinds = tuple(
        getattr(exceptions, k)
        for k in ("RayActorError", "ActorUnavailableError")
        if hasattr(exceptions, k)
    )  # the second is Ray >= 2.30 only
    return isinstance(exc, kinds)


class RemoteAgent:
    """One node's agent as the central managers see it: `NodeAgent`'s methods, awaited over
    Ray. `node`: the node's name. Every call raises `NodeLost` when the agent is dead."""

    def __init__(self, handle: Any, node: str) -> None:
        self.handle = handle  # the Ray actor handle
        self.node = node

    async def _rpc(self, ref: Awaitable[Any]) -> Any:
        try:
            return await ref
        except Exception as exc:
            if is_actor_death(exc):
                raise NodeLost(f"node {self.node}: its agent died ({type(exc).__name__})") from None
            raise

    # -- the node's environments (NodeAgent's CPU side) ----------------------------------------
    async def start(self) -> NodeInfo:
        """Start the node's CPU manager (sweep, probe) and report the node."""
        return await self._rpc(self.handle.start.remote())

    async def describe(self) -> NodeInfo:
        return await self._rpc(self.handle.describe.remote())

    async def open_env(
        self, trajectory: str, memory_mb: int, network: bool, layers: Mapping[str, Any]
    ) -> str:
        return await self._rpc(
            self.handle.open_env.remote(trajectory, memory_mb, network, dict(layers))
        )

    async def fork_env(self, env_id: str, trajectories: Sequence[str]) -> list[str]:
        return list(await self._rpc(self.handle.fork_env.remote(env_id, list(trajectories))))

    async def snapshot(self, env_id: str) -> str:
        return await self._rpc(self.handle.snapshot.remote(env_id))

    async def delete_snapshot(self, snapshot_id: str) -> None:
        await self._rpc(self.handle.delete_snapshot.remote(snapshot_id))

    async def write_files(self, env_id: str, files: Mapping[str, bytes]) -> None:
        await self._rpc(self.handle.write_files.remote(env_id, dict(files)))

    async def read_files(self, env_id: str, paths: Sequence[str]) -> dict[str, bytes | None]:
        return await self._rpc(self.handle.read_files.remote(env_id, list(paths)))

    async def close_env(self, env_id: str) -> None:
        await self._rpc(self.handle.close_env.remote(env_id))

    async def open_session(self, env_id: str, name: str) -> None:
        await self._rpc(self.handle.open_session.remote(env_id, name))

    async def close_session(self, env_id: str, name: str) -> None:
        await self._rpc(self.handle.close_session.remote(env_id, name))

    async def kernel_command(self, env_id: str) -> str:
        return await self._rpc(self.handle.kernel_command.remote(env_id))

    async def run(self, assignment: Assignment) -> Result:
        return await self._rpc(self.handle.run.remote(assignment))

    # -- the node's GPUs (the central GpuManager decides chunks and residency) -----------------
    async def gpu_deploy(self, service: Service) -> None:
        await self._rpc(self.handle.gpu_deploy.remote(service))

    async def gpu_restore(self, service: Service, chunk: tuple[int, int]) -> float:
        return float(await self._rpc(self.handle.gpu_restore.remote(service, chunk)))

    async def gpu_evict(self, service: Service, chunk: tuple[int, int]) -> None:
        await self._rpc(self.handle.gpu_evict.remote(service, chunk))

    async def gpu_invoke(self, service: Service, chunk: tuple[int, int], payload: Any) -> Any:
        return await self._rpc(self.handle.gpu_invoke.remote(service, chunk, payload))

    async def gpu_calls(self) -> list[tuple]:
        return await self._rpc(self.handle.gpu_calls.remote())

    async def close(self) -> None:
        await self._rpc(self.handle.close.remote())

    def kill(self) -> None:
        import_ray().kill(self.handle)


def start_now(agents: Sequence[RemoteAgent], timeout_s: float) -> list[NodeInfo]:
    """Every agent started and its report, waited for without an event loop (building a
    cluster)."""
    ray = import_ray()
    return ray.get([a.handle.start.remote() for a in agents], timeout=timeout_s)


def spawn_agent(
    ray_node_id: str,
    resources: Mapping[str, float],
    backend: str,
    backend_options: Mapping[str, Any],
    gpu: tuple[str | None, Mapping[str, Any], int | None],
) -> RemoteAgent | None:
    """An agent pinned to the node, or None when the node offers no CPU. `gpu`: the GPU
    backend the agent runs, its options and the GPU count a `sim` backend models."""
    ray = import_ray()
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    # the node's capacity is the CPU resource Ray offers there (`ray start --num-cpus 8`
    # on a 64-core machine: 8 cores), not the machine's physical core count
    cores = int(resources.get("CPU", 0))
    if cores == 0:
        return None
    memory = None
    if backend == "sim":  # model the node Ray describes
        memory = int(resources.get("memory", 0) // MiB) or 4096
    actor = ray.remote(num_cpus=0, max_restarts=0)(NodeAgent)
    name = node_name(ray_node_id)
    handle = actor.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(ray_node_id, soft=False),
        name=f"tangram-agent-{ray_node_id[:8]}-{uuid.uuid4().hex[:6]}",
    ).remote(
        name,
        ray_node_id,
        backend,
        dict(backend_options),
        cores,
        memory,
        gpu_backend=gpu[0],
        gpu_options=dict(gpu[1]),
        gpus=gpu[2],
    )
    return RemoteAgent(handle, name)

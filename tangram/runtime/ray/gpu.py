"""The GPU pool over Ray: `RayGpuBackend` sends each restore, evict and invoke to the agent of
the chunk's node (through its typed client, `remote.RemoteAgent`), which runs them with
the GPU backend of its own machine; chunk choice, residency and LRU stay with the central
`GpuManager`, built by the one GPU pool builder (`config.gpu_manager`)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from managers.gpu import GB, GpuBackend, GpuManager, NodeLost, Service
from tangram.runtime.config import build_services, gpu_manager, uniform_gpus
from tangram.runtime.config_schema import GpuSpec, parse
from tangram.runtime.ray.cpu import RayCpuManager
from tangram.runtime.ray.remote import RemoteAgent


class RayGpuBackend(GpuBackend):
    """The GPU manager's backend over Ray. `lost(node)`: why a node is lost (the CPU
    manager's membership), None while it is alive."""

    name = "ray"

    def __init__(
        self,
        agents: Mapping[str, RemoteAgent],
        lost: Callable[[str], str | None] = lambda node: None,
    ) -> None:
        self.agents = dict(agents)
        self.lost = lost

    def _agent(self, node: str) -> RemoteAgent:
        why = self.lost(node)
        if why:
            raise NodeLost(f"node {node} {why}")
        agent = self.agents.get(node)
        if agent is None:
            raise NodeLost(f"no GPU agent on node {node}")
        return agent

    async def deploy(self, service: Service) -> None:
        await asyncio.gather(*(a.gpu_deploy(service) for a in self.agents.values()))

    async def restore(self, service: Service, node: str, chunk: tuple[int, int]) -> float:
        return await self._agent(node).gpu_restore(service, chunk)

    async def evict(self, service: Service, node: str, chunk: tuple[int, int]) -> None:
        await self._agent(node).gpu_evict(service, chunk)

    async def invoke(
        self, service: Service, node: str, chunk: tuple[int, int], payload: Any
    ) -> Any:
        return await self._agent(node).gpu_invoke(service, chunk, payload)


def build_ray_gpu(cpu: RayCpuManager, spec: Mapping[str, Any] | None) -> GpuManager | None:
    """A chunk pool over the agents that report GPUs (the largest power of two of each node's
    GPUs), residency with `spec`'s memory per GPU and services, and `RayGpuBackend`. Nodes are
    those present now; GPU nodes joining later are not added in this version."""
    sizes = {
        name: 1 << (node.info.gpus.bit_length() - 1)
        for name, node in cpu.nodes.items()
        if node.info.gpus > 0
    }
    if not sizes:
        return None
    gpu = parse(GpuSpec, "gpu", spec)  # the config's schema: the same checks, the same paths
    registry = build_services("gpu.services", gpu.services)
    trees, memory = uniform_gpus(sizes, int(gpu.memory_gb * GB))

    def lost(node: str) -> str | None:
        state = cpu.nodes.get(node)
        return "left the cluster" if state is None else (state.lost or None)

    agents = {n: cpu.nodes[n].agent for n in sizes}
    manager = gpu_manager("gpu", trees, memory, registry, lambda: RayGpuBackend(agents, lost))
    cpu.on_lost.append(manager.lose_node)  # a dead node's chunks and residency go at once
    return manager

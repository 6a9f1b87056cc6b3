"""Simulated GPU services: the `sim` backend and the simulator's service model.

`SimServiceModel` is what the discrete-event simulator calls around each GPU action of an
instance file (docs/architecture.md §5): `begin` returns the restore time to add and whether a
restore happened, from the same pure `Residency` the real manager uses. `SimGpuBackend` is the
manager's `sim` executor: restores take bytes over bandwidth, invokes take the profiled
inference time, both as (scaled) `asyncio.sleep`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from managers.gpu.advisor import ResidencyAdvisor
from managers.gpu.backend import Chunk, GpuBackend
from managers.gpu.residency import Residency, RestoreDecision
from managers.gpu.services import GB, RestoreModel, Service, ServiceRegistry
from tangram.allocation import Assignment
from tangram.errors import ValidationError
from tangram.instance import ResourceSpec
from topology import chunk_sizes


def registry_from_spec(spec: ResourceSpec) -> ServiceRegistry:
    """The instance's services: memory per GPU and restore time (sharded weights over k GPUs
    when `weights_gb` is given, `ServiceSpec.per_gpu_gb`) at every DoP the node allows (a
    chunk of any power-of-two size up to `gpus_per_node` whose copy fits a GPU's `memory_gb`;
    the instance parser refuses an action asking a service at a size that does not)."""
    mem = spec.memory_gb
    services = {}
    for name, s in spec.services.items():
        dops = [k for k in chunk_sizes(spec.gpus_per_node) if mem is None or s.per_gpu_gb(k) <= mem]
        services[name] = Service(
            name, {k: round(s.per_gpu_gb(k) * GB) for k in dops}, {k: s.restore_at(k) for k in dops}
        )
    return ServiceRegistry(services)


class SimServiceModel:
    """Residency, LRU eviction and restore time of one instance chunk pool, on a virtual clock.

    Actions that name no service, or that hold no placement on this pool, cost nothing and are
    reported as not restored. `advisor` is the advice to set on the pool it models.
    """

    def __init__(self, resource_spec: ResourceSpec, restore: RestoreModel | None = None) -> None:
        if resource_spec.topology != "chunks":
            raise ValidationError(
                f"resources.{resource_spec.name}.topology",
                resource_spec.topology,
                "services need a chunks pool",
            )
        self.resource = resource_spec.name
        memory = round((resource_spec.memory_gb or 0) * GB) or None
        registry = registry_from_spec(resource_spec)
        if memory is None:  # no services declared: any memory will do
            memory = 1 << 62
        self.residency = Residency.uniform(
            {n: resource_spec.gpus_per_node for n in resource_spec.node_names()},
            memory,
            registry,
            resource=self.resource,
            restore=restore,
        )
        self.decisions: dict[str, RestoreDecision] = {}
        self.advisor = ResidencyAdvisor(self.residency)  # set on the pool it models

    def _where(self, assignment: Assignment) -> tuple[str, Chunk] | None:
        if assignment.action.service is None:
            return None
        placement = assignment.placement.get(self.resource)
        if placement is None or placement.chunk is None:
            return None
        return placement.node, placement.chunk

    def begin(self, assignment: Assignment, now: float) -> tuple[float, bool]:
        """(extra seconds before the action's own run time, whether its service was restored)."""
        where = self._where(assignment)
        if where is None:
            return 0.0, False
        d = self.residency.begin(assignment.action, where[0], where[1], now)
        self.decisions[assignment.action.id] = d
        return d.restore_s, d.restored

    def end(self, assignment: Assignment, now: float) -> None:
        where = self._where(assignment)
        if where is not None:
            self.residency.end(assignment.action, where[0], where[1], now)


class SimGpuBackend(GpuBackend):
    """Sleeps the modelled time: restores bytes/bandwidth, invokes the profiled inference time.

    `time_scale` shrinks every sleep (0 makes the backend instant, for tests). The response
    says it is simulated (`"simulated": true`, no model ran) and echoes the request with the
    service, chunk and modelled seconds.
    """

    name = "sim"

    def __init__(
        self,
        restore: RestoreModel | None = None,
        time_scale: float = 1.0,
        default_infer_s: float = 0.0,
    ) -> None:
        self.restore_model = restore or RestoreModel()
        self.time_scale = time_scale
        self.default_infer_s = default_infer_s
        self.resident: set[tuple[str, str, Chunk]] = set()
        self.deployed: set[str] = set()
        self.calls: list[tuple[str, str, str, Chunk]] = []

    async def deploy(self, service: Service) -> None:
        self.deployed.add(service.name)

    async def restore(self, service: Service, node: str, chunk: Chunk) -> float:
        seconds = service.restore_seconds(chunk[1] - chunk[0], self.restore_model)
        await asyncio.sleep(seconds * self.time_scale)
        self.resident.add((service.name, node, chunk))
        self.calls.append(("restore", service.name, node, chunk))
        return seconds

    async def evict(self, service: Service, node: str, chunk: Chunk) -> None:
        self.resident.discard((service.name, node, chunk))
        self.calls.append(("evict", service.name, node, chunk))

    async def invoke(self, service: Service, node: str, chunk: Chunk, payload: Any) -> Any:
        if (service.name, node, chunk) not in self.resident:
            raise RuntimeError(f"sim: {service.name} is not resident on {node}{chunk}")
        seconds = service.infer_seconds(chunk[1] - chunk[0], self.default_infer_s)
        await asyncio.sleep(seconds * self.time_scale)
        self.calls.append(("invoke", service.name, node, chunk))
        return {
            "simulated": True,
            "service": service.name,
            "node": node,
            "chunk": list(chunk),
            "infer_s": seconds,
            "request": payload,
            "note": "simulated GPU backend: no model ran; the time is the profile's",
        }

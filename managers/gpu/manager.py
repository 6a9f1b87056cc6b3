"""The GPU manager, evict-on-execution (paper 5.3): runs placed service actions.

The scheduler grants an action one aligned chunk (placed with the pool's `ResidencyAdvisor`, so
chunks where the service is resident win). `run` then asks the pure `Residency` what to do, has the
backend evict the victims and restore the service if it was not resident, invokes the service
with the action's payload (a JSON request) and returns the response as the `Result`, with the
restore time it took. Start-up (`start`) deploys every registered service once: its host copy
is kept for the life of the manager.

A vector exec (a sandbox command granted a chunk of this pool beside its cores) is run by the
CPU manager; the runtime calls `claim` before it starts and `release` after it ends: the chunk's
resident service copies are evicted first and none is restored onto it meanwhile
(`Residency.hold`). `machine_of` names the node of this pool that is a CPU node's machine.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping

from managers.base import Manager
from managers.gpu.advisor import ResidencyAdvisor
from managers.gpu.backend import GpuBackend
from managers.gpu.residency import Residency, RestoreDecision
from managers.gpu.services import Service
from tangram.actions import Action
from tangram.allocation import Assignment
from tangram.errors import NodeLost, ValidationError
from tangram.pools import ChunkPool, Pool
from tangram.results import Result, Status

log = logging.getLogger("tangram.gpu")


class ManagedAdvisor(ResidencyAdvisor):
    """The runtime pool's advice: a service's action as `ResidencyAdvisor` says; an action
    that names no service, which in the runtime is a vector exec's command that evicts what it
    lands on (`GpuManager.claim`), prefers the chunk holding nothing, else the least recently
    used (`Residency.vacancy`)."""

    def prefer(self, action: Action, node: str, chunk: tuple[int, int]) -> float:
        if action.service is None and node in self.residency.nodes():
            return self.residency.vacancy(node, chunk)
        return super().prefer(action, node, chunk)


class GpuManager(Manager):
    """One chunk pool (`resource`), its residency cache and one executor backend."""

    name = "gpu"

    def __init__(
        self,
        pool: ChunkPool,
        residency: Residency,
        backend: GpuBackend,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if pool.resource != residency.resource:
            raise ValidationError(
                "gpu.resource",
                residency.resource,
                f"the residency and the pool ({pool.resource!r}) differ",
            )
        self.resource = pool.resource
        self.pool = pool
        self.residency = residency
        self.backend = backend
        self.clock = clock
        self.origin = ""  # how the pool was sized and why this backend (`/v1/status`)
        self._started = False
        self.advisor = pool.advisor = ManagedAdvisor(residency)  # this pool's advice

    @property
    def backend_name(self) -> str | None:
        return self.backend.name

    @property
    def simulated(self) -> bool:
        """True when no real GPU runs the calls (the `sim` backend)."""
        return self.backend.name == "sim"

    def pools(self) -> Mapping[str, Pool]:
        return {self.resource: self.pool}

    def lose_node(self, node: str, why: str) -> None:
        """A node died: its chunks leave the pool (once their running actions end) and its
        resident copies are forgotten, so nothing is placed or preferred there again."""
        if node in self.pool.nodes():
            self.pool.retire(node)
            dropped = self.residency.forget_node(node)
            log.warning(
                "gpu: node %s %s: its chunks leave the pool, %d resident copies forgotten",
                node,
                why,
                dropped,
            )

    def machine_of(self, node: str, cpu_nodes: Collection[str]) -> str | None:
        """The node of this pool on the machine of CPU node `node`: the same name (Ray names
        both pools' nodes after the machine), else the one GPU node when both pools have one
        node (this machine: `Tangram.local()`); None when no GPU node can be matched."""
        nodes = self.pool.nodes()
        if node in nodes:
            return node
        if len(nodes) == 1 and len(cpu_nodes) == 1 and node in cpu_nodes:
            return nodes[0]
        return None

    async def claim(self, assignment: Assignment) -> Result | None:
        """Before a vector exec's command starts on its chunk: hold the chunk (no restore onto
        it until `release`) and evict every service copy resident on its GPUs
        (evict-on-execution). None when done; else the failed `Result`, the chunk released."""
        action = assignment.action
        placement = assignment.placement.get(self.resource)
        if placement is None or placement.chunk is None:
            return Result(
                Status.FAILED,
                detail=f"gpus: action {action.id} holds no chunk of {self.resource!r}",
            )
        node, chunk = placement.node, placement.chunk
        victims = self.residency.hold(action, node, chunk, self.clock())
        victim = None
        try:
            for victim in victims:
                await self.backend.evict(
                    self.residency.registry.get(victim.service), victim.node, victim.chunk
                )
        except Exception as exc:
            self.release(assignment)
            assert victim is not None
            if isinstance(exc, NodeLost):
                self.lose_node(node, str(exc))
            return Result(
                Status.FAILED,
                detail=f"gpus: evicting {victim.service} from {victim.node}{victim.chunk} "
                f"before the command failed: {exc}",
            )
        except BaseException:  # cancelled: the chunk is not held by a command that never ran
            self.release(assignment)
            raise
        if victims:
            log.info(
                "gpu: evicted %s from %s%s for command %s",
                ", ".join(f"{v.service}{v.chunk}" for v in victims),
                node,
                chunk,
                action.id,
            )
        return None

    def release(self, assignment: Assignment) -> None:
        """A claimed chunk's command ended: its GPUs take restores again."""
        placement = assignment.placement[self.resource]
        assert placement.chunk is not None
        self.residency.end(assignment.action, placement.node, placement.chunk, self.clock())

    async def start(self) -> None:
        """Deploy every registered service's host copy (once)."""
        if not self._started:
            for service in self.residency.registry:
                await self.backend.deploy(service)
            self._started = True

    async def run(self, assignment: Assignment) -> Result:
        action = assignment.action
        placement = assignment.placement.get(self.resource)
        if action.service is None or placement is None or placement.chunk is None:
            return Result(
                Status.FAILED,
                detail=f"action {action.id}: a GPU action needs a service "
                f"and a chunk of {self.resource!r}",
            )
        await self.start()
        node, chunk = placement.node, placement.chunk
        service = self.residency.registry.get(action.service)
        decision = self.residency.begin(action, node, chunk, self.clock())
        try:
            restore_s = await self._make_resident(service, decision, node, chunk)
            if isinstance(restore_s, Result):
                return restore_s
            try:
                output = await self.backend.invoke(service, node, chunk, action.payload)
            except NodeLost as exc:
                self.lose_node(node, str(exc))
                return Result(
                    Status.FAILED,
                    detail=f"{service.name} on {node}{chunk} could not run: {exc}",
                    restore_s=restore_s,
                )
            except Exception as exc:
                return Result(
                    Status.ERROR,
                    detail=f"{service.name} on {node}{chunk}: {exc}",
                    restore_s=restore_s,
                )
            return Result(
                Status.OK,
                output=output,
                restore_s=restore_s,
                detail="restored" if decision.restored else "resident",
            )
        finally:
            self.residency.end(action, node, chunk, self.clock())

    async def _make_resident(
        self, service: Service, decision: RestoreDecision, node: str, chunk: tuple[int, int]
    ) -> float | Result:
        """Evict the entries `decision` chose and restore `service` on the chunk when it is not
        resident: the restore's seconds (0 for a hit), or the failed Result to return."""
        for victim in decision.evicted:
            try:
                await self.backend.evict(
                    self.residency.registry.get(victim.service), victim.node, victim.chunk
                )
            except Exception as exc:
                self.residency.forget(service.name, node, chunk)
                return Result(
                    Status.FAILED,
                    detail=f"evicting {victim.service} from "
                    f"{victim.node}{victim.chunk} failed: {exc}",
                )
        if not decision.restored:
            return 0.0
        try:
            return await self.backend.restore(service, node, chunk)
        except NodeLost as exc:
            self.lose_node(node, str(exc))
            return Result(
                Status.FAILED,
                detail=f"restore of {service.name} on {node}{chunk} could not run: {exc}",
            )
        except Exception as exc:
            self.residency.forget(service.name, node, chunk)
            return Result(
                Status.FAILED,
                detail=f"restore of {service.name} on {node}{chunk} failed: {exc}",
            )

    async def close(self) -> None:
        await self.backend.close()

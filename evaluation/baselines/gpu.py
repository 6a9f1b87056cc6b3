"""GPU service baselines.

`static` (SGLang as deployed in the paper's baselines): every service is pinned to fixed GPU
chunks for the whole run, deployed before it starts (so never restored), one action per chunk at
a time; no sharing between services, no elastic DoP.

`serverless` (ServerlessLLM-like): a service is loaded on demand at a fixed DoP onto any free
chunk of its task's GPUs (no sharing across tasks), from the sllm-store checkpoint store, and
kept loaded (LRU) until evicted. `serverless_executors` gives its load time: bytes over
`load_gbps` (docs/calibration.md §3: sllm-store loads a 32B model, about 64 GB, in 3.2 s: ~20 GB/s).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from evaluation.baselines.common import NoLifecycle, at_most, fcfs_fixed
from managers.gpu.sim import SimServiceModel
from solvers.fcfs import ScratchPools
from solvers.registry import register
from tangram.actions import Action
from tangram.allocation import Assignment, ClusterView
from tangram.errors import TangramError, ValidationError
from tangram.instance import ResourceSpec, ServiceSpec
from tangram.pools import Placement
from topology import TopologyError

Pin = tuple[str, str, int, int]  # (service, node, first GPU, end GPU)


def pin_services(
    services: Sequence[str],
    nodes: Sequence[str],
    gpus_per_node: int,
    gpus_each: int,
    replicas: int = 1,
) -> tuple[Pin, ...]:
    """Pack `replicas` copies of each service, `gpus_each` GPUs apiece, onto the nodes in order."""
    slots = [
        (n, s, s + gpus_each)
        for n in nodes
        for s in range(0, gpus_per_node - gpus_each + 1, gpus_each)
    ]
    want = [s for s in services for _ in range(replicas)]
    if len(want) > len(slots):
        raise ValidationError(
            "static.pins",
            len(want),
            f"more service replicas than {gpus_each}-GPU chunks ({len(slots)})",
        )
    return tuple((s, n, a, b) for s, (n, a, b) in zip(want, slots))


@register("static")
@dataclass
class StaticServices(NoLifecycle):
    pins: tuple[Pin, ...] = ()
    resource: str = "gpu"

    def attach(self, pools, executors) -> None:
        """Deploy every pinned service before the run (a warm start: no restore counted)."""
        model = executors.get(self.resource)
        if model is None:
            return
        for i, (s, node, a, b) in enumerate(self.pins):
            warm = Action(f"deploy{i}", {self.resource: b - a}, duration=1.0, service=s)
            model.residency.begin(warm, node, (a, b), -1.0)
            model.residency.end(warm, node, (a, b), -1.0)

    def allocate(
        self, view: ClusterView, queue: Collection[Action], now: float
    ) -> list[Assignment]:
        pools = ScratchPools(view.pools)
        by_service: dict[str, list[Pin]] = {}
        for pin in self.pins:
            by_service.setdefault(pin[0], []).append(pin)
        waiting: set[str] = set()  # services whose earlier action found no free replica
        out = []
        for a in queue:
            s = a.service
            if s is None or set(a.demands) != {self.resource}:
                raise ValidationError(
                    f"action[{a.id}]", a.demands, "static serves GPU service calls only"
                )
            if s in waiting:
                continue
            if s not in by_service:
                raise TangramError(f"static: service {s!r} is not deployed")
            for _, node, lo, hi in by_service[s]:
                place = Placement(node, chunk=(lo, hi))
                try:
                    pools[self.resource].take(place, hi - lo)
                except TopologyError:  # this replica is busy
                    continue
                if not a.demands[self.resource].allows(hi - lo):
                    raise ValidationError(f"action[{a.id}]", hi - lo, "pinned size not allowed")
                out.append(Assignment(a, {self.resource: hi - lo}, {self.resource: place}))
                break
            else:
                waiting.add(s)
        return out


@register("serverless")
@dataclass
class Serverless(NoLifecycle):
    dop: int = 1
    partitions: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """(task, its GPU nodes); a task not listed may use every node."""
    resource: str = "gpu"
    _parts: dict[str, set[str]] = field(default_factory=dict, init=False)
    _nodes: set[str] = field(default_factory=set, init=False)

    def attach(self, pools, executors) -> None:
        self._nodes = set(pools[self.resource].nodes())
        self._parts = {t: set(ns) for t, ns in self.partitions}

    def _exclude(self, a: Action, r: str) -> Collection[str]:
        mine = self._parts.get(a.task or "")
        return () if mine is None or r != self.resource else self._nodes - mine

    def _amounts(self, a: Action) -> dict[str, int]:
        units = dict(a.mins)
        if self.resource in units:
            units[self.resource] = at_most(a, self.resource, self.dop)
        return units

    def allocate(
        self, view: ClusterView, queue: Collection[Action], now: float
    ) -> list[Assignment]:
        return fcfs_fixed(view, queue, self._amounts, self._exclude)


def serverless_executors(load_gbps: float = 20.0):
    """The GPU service model with ServerlessLLM's checkpoint-store load time per service."""

    def make(workload):
        spec = workload.gpu
        if spec is None:
            return {}
        services = {
            s: ServiceSpec(v.memory_gb, v.per_gpu_gb(1) / load_gbps, v.weights_gb)
            for s, v in spec.services.items()
        }
        slow = ResourceSpec(
            spec.name,
            spec.topology,
            spec.units,
            spec.nodes,
            spec.gpus_per_node,
            spec.memory_gb,
            services,
        )
        return {spec.name: SimServiceModel(slow)}

    return make

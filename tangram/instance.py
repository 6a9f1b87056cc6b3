"""The instance file (docs/architecture.md §5): the common currency of replay, solve, gap and tests.

```json
{"resources": {"cpu": {"topology": "flat", "units": 8},
               "gpu": {"topology": "chunks", "nodes": 2, "gpus_per_node": 8,
                       "memory_gb": 80, "services": {"judge": {"memory_gb": 60, "restore_s": 2}}}},
 "actions": [{"id": "a1", "arrival": 0.0, "key": "cpu", "demand": {"cpu": [1, 2, 4, 8]},
              "t_ori": 12.0, "efficiency": {"1": 1.0, "2": 0.95, "4": 0.85, "8": 0.7}},
             {"id": "a2", "arrival": 0.5, "demand": {"cpu": [1]}, "duration": 0.2}]}
```

Validated at load: every error names the JSON path of the bad value.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tangram.actions import Action, Elasticity
from tangram.errors import Infeasible, ValidationError
from tangram.pools import ChunkPool, FlatPool, Pool
from tangram.resources import Demand
from tangram.validation import integer, keys, number, power_of_two, read_document
from topology import ChunkTree, is_pow2


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    """A service's memory per GPU and restore time of its 1-GPU copy. With `weights_gb`, the
    weights are sharded: a k-GPU copy holds `weights_gb / k + memory_gb` per GPU (memory_gb is
    then the per-GPU KV cache) and restores in proportionally less time (parallel links)."""

    memory_gb: float
    restore_s: float
    weights_gb: float = 0.0

    def per_gpu_gb(self, k: int) -> float:
        return self.weights_gb / k + self.memory_gb

    def restore_at(self, k: int) -> float:
        return self.restore_s * self.per_gpu_gb(k) / self.per_gpu_gb(1)


@dataclass(frozen=True, slots=True)
class ResourceSpec:
    """One resource type of the instance: flat units on one or more named nodes, or GPU chunk
    nodes."""

    name: str
    topology: str  # "flat" | "chunks"
    units: int = 0
    nodes: int = 1
    gpus_per_node: int = 0
    memory_gb: float | None = None
    services: Mapping[str, ServiceSpec] = field(default_factory=dict)
    node_units: Mapping[str, int] = field(default_factory=dict)  # flat, several nodes

    def node_names(self) -> list[str]:
        if self.topology == "flat":
            return list(self.node_units) or ["node0"]
        return [f"{self.name}{i}" for i in range(self.nodes)]

    def build_pool(self) -> Pool:
        if self.topology == "flat":
            return FlatPool(self.name, dict(self.node_units) or {"node0": self.units})
        return ChunkPool(
            self.name, {n: ChunkTree(self.gpus_per_node, n) for n in self.node_names()}
        )

    @property
    def capacity(self) -> int:
        if self.topology == "flat":
            return sum(self.node_units.values()) or self.units
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True, slots=True)
class Instance:
    resources: Mapping[str, ResourceSpec]
    actions: tuple[Action, ...]
    bindings: Mapping[tuple[str, str], str] = field(default_factory=dict)
    """(trajectory, resource) -> node, from the actions' `node` fields."""

    def build_pools(self) -> dict[str, Pool]:
        return {r: spec.build_pool() for r, spec in self.resources.items()}

    def arrival(self, action: Action) -> float:
        return action.submit_time


def parse_resource(name: str, obj: Any) -> ResourceSpec:
    path = f"resources.{name}"
    if not isinstance(obj, dict) or obj.get("topology") not in ("flat", "chunks"):
        raise ValidationError(
            f"{path}.topology",
            obj.get("topology") if isinstance(obj, dict) else obj,
            'must be "flat" or "chunks"',
        )
    if obj["topology"] == "flat":
        keys(path, obj, {"topology"}, {"units", "nodes"})
        if ("units" in obj) == ("nodes" in obj):
            raise ValidationError(
                f"{path}.units",
                obj.get("units"),
                'give either "units" (one node) or "nodes" {name: units}',
            )
        if "units" in obj:
            return ResourceSpec(name, "flat", units=integer(f"{path}.units", obj["units"]))
        nodes = obj["nodes"]
        if not isinstance(nodes, dict) or not nodes:
            raise ValidationError(f"{path}.nodes", nodes, "must map node names to units")
        sizes = {str(n): integer(f"{path}.nodes.{n}", u) for n, u in nodes.items()}
        return ResourceSpec(name, "flat", units=sum(sizes.values()), node_units=sizes)
    keys(path, obj, {"topology", "nodes", "gpus_per_node"}, {"memory_gb", "services"})
    g = power_of_two(f"{path}.gpus_per_node", obj["gpus_per_node"])
    mem = obj.get("memory_gb")
    services: dict[str, ServiceSpec] = {}
    for sname, s in (obj.get("services") or {}).items():
        sp = f"{path}.services.{sname}"
        keys(sp, s, {"memory_gb", "restore_s"}, {"weights_gb"})
        services[sname] = ServiceSpec(
            number(f"{sp}.memory_gb", s["memory_gb"], positive=True),
            number(f"{sp}.restore_s", s["restore_s"]),
            number(f"{sp}.weights_gb", s.get("weights_gb", 0.0)),
        )
        if mem is not None and services[sname].per_gpu_gb(g) > mem:
            raise ValidationError(
                f"{sp}.memory_gb", s["memory_gb"], f"exceeds the pool's memory_gb per GPU ({mem})"
            )
    if services and mem is None:
        raise ValidationError(f"{path}.memory_gb", None, "is required when services are listed")
    return ResourceSpec(
        name,
        "chunks",
        nodes=integer(f"{path}.nodes", obj["nodes"]),
        gpus_per_node=g,
        memory_gb=None if mem is None else number(f"{path}.memory_gb", mem, True),
        services=services,
    )


ACTION_REQUIRED = {"id", "demand"}
ACTION_OPTIONAL = {
    "arrival",
    "key",
    "t_ori",
    "efficiency",
    "duration",
    "service",
    "trajectory",
    "kind",
    "node",
}


def parse_action(i: int, obj: Any, resources: Mapping[str, ResourceSpec]) -> Action:
    """One action of the file, each field checked by its own step below, every error naming
    the field's path (`actions[<id>].<field>`)."""
    keys(f"actions[{i}]", obj, ACTION_REQUIRED, ACTION_OPTIONAL)
    aid = obj["id"]
    if not isinstance(aid, str) or not aid:
        raise ValidationError(f"actions[{i}].id", aid, "must be a non-empty string")
    path = f"actions[{aid}]"
    demands = _demands(path, obj["demand"], resources)
    elastic = "key" in obj or "t_ori" in obj or "efficiency" in obj
    elasticity = _elasticity(path, obj, demands) if elastic else None
    duration = None if elastic else _fixed_duration(path, obj)
    service = _service(path, obj.get("service"), demands, resources)
    arrival = number(f"{path}.arrival", obj.get("arrival", 0.0))
    trajectory = obj.get("trajectory")
    node = obj.get("node")
    if node is not None:
        _check_node(path, node, demands, resources)
        trajectory = trajectory or aid  # an action bound alone is its own trajectory
    action = Action(
        aid,
        demands,
        elasticity=elasticity,
        duration=duration,
        trajectory=trajectory,
        kind=obj.get("kind", "default"),
        service=service,
        submit_time=arrival,
    )
    _check_fits(path, demands, resources)
    return action


def _demands(path: str, demand: Any, resources: Mapping[str, ResourceSpec]) -> dict[str, Demand]:
    if not isinstance(demand, dict) or not demand:
        raise ValidationError(f"{path}.demand", demand, "must map resources to amounts")
    demands = {}
    for r, d in demand.items():
        if r not in resources:
            raise ValidationError(
                f"{path}.demand.{r}", d, f"unknown resource (declared: {sorted(resources)})"
            )
        demands[r] = Demand.parse(d, f"{path}.demand.{r}")
    return demands


def _elasticity(path: str, obj: Mapping[str, Any], demands: Mapping[str, Demand]) -> Elasticity:
    for k in ("key", "t_ori", "efficiency"):
        if k not in obj:
            raise ValidationError(f"{path}.{k}", None, "is required for an elastic action")
    if "duration" in obj:
        raise ValidationError(
            f"{path}.duration",
            obj["duration"],
            "an elastic action has t_ori and efficiency, not a duration",
        )
    if obj["key"] not in demands:
        raise ValidationError(
            f"{path}.key", obj["key"], f"must be one of the demanded resources {sorted(demands)}"
        )
    table = _efficiency_table(path, obj["efficiency"])
    for m in demands[obj["key"]].amounts:
        if m not in table:
            raise ValidationError(
                f"{path}.efficiency.{m}",
                None,
                "missing: every allowed amount of the key needs E(m)",
            )
    try:
        return Elasticity(obj["key"], obj["t_ori"], table)
    except ValidationError as exc:
        raise ValidationError(
            f"{path}.{exc.field.removeprefix('elasticity.')}", exc.value, exc.problem
        ) from None


def _efficiency_table(path: str, eff: Any) -> dict[int, Any]:
    if not isinstance(eff, dict):
        raise ValidationError(f"{path}.efficiency", eff, "must map amounts to E(m)")
    table = {}
    for m, e in eff.items():
        try:
            mi = int(m)
        except (TypeError, ValueError):
            raise ValidationError(f"{path}.efficiency", m, "keys must be integers") from None
        table[mi] = e
    return table


def _fixed_duration(path: str, obj: Mapping[str, Any]) -> float:
    if "duration" not in obj:
        raise ValidationError(
            f"{path}.duration", None, "is required (or key, t_ori and efficiency for elastic)"
        )
    return number(f"{path}.duration", obj["duration"], positive=True)


def _service(
    path: str, service: Any, demands: Mapping[str, Demand], resources: Mapping[str, ResourceSpec]
) -> Any:
    if service is not None:
        gpu_res = [r for r in demands if resources[r].topology == "chunks"]
        if not gpu_res:
            raise ValidationError(f"{path}.service", service, "needs a GPU (chunks) demand")
        if len(gpu_res) > 1:
            raise ValidationError(
                f"{path}.service",
                service,
                f"a service runs on one GPU pool; the action demands {len(gpu_res)} "
                f"({', '.join(gpu_res)})",
            )
        spec = resources[gpu_res[0]]
        if service not in spec.services:
            raise ValidationError(
                f"{path}.service",
                service,
                f"unknown service (declared: {sorted(spec.services)})",
            )
        s, mem = spec.services[service], spec.memory_gb
        for k in demands[gpu_res[0]].amounts:
            if mem is not None and s.per_gpu_gb(k) > mem:
                raise ValidationError(
                    f"{path}.demand.{gpu_res[0]}",
                    k,
                    f"a {k}-GPU copy of {service} needs {s.per_gpu_gb(k):g} GB per GPU, over "
                    f"the pool's memory_gb ({mem:g})",
                )
    return service


def _check_node(
    path: str, node: Any, demands: Mapping[str, Demand], resources: Mapping[str, ResourceSpec]
) -> None:
    """A bound action names a node of every flat resource it demands, big enough for it."""
    flat = [r for r in demands if resources[r].topology == "flat"]
    if not flat or any(node not in resources[r].node_names() for r in flat):
        names = {r: resources[r].node_names() for r in flat}
        raise ValidationError(
            f"{path}.node", node, f"must name a node of every flat resource it demands ({names})"
        )
    for r in flat:
        if demands[r].min > resources[r].node_units.get(node, resources[r].units):
            raise Infeasible(
                f"{path}.demand.{r}: needs at least {demands[r].min}, node "
                f"{node} has {resources[r].node_units.get(node)}"
            )


def _check_fits(
    path: str, demands: Mapping[str, Demand], resources: Mapping[str, ResourceSpec]
) -> None:
    """Every demand is one some placement of its pool could meet (GPU amounts whole chunks)."""
    for r, d in demands.items():
        spec = resources[r]
        if spec.topology == "chunks":
            for amount in d.amounts:
                if not is_pow2(amount):
                    raise ValidationError(
                        f"{path}.demand.{r}",
                        amount,
                        "GPU amounts must be "
                        "powers of two (a k-GPU action takes one aligned "
                        "k-chunk)",
                    )
            biggest = spec.gpus_per_node
        else:
            biggest = spec.build_pool().largest_request()
        if d.min > biggest:
            raise Infeasible(
                f"{path}.demand.{r}: needs at least {d.min}, can never fit "
                f"(the largest placement is {biggest})"
            )


def parse_instance(doc: Any) -> Instance:
    keys("instance", doc, {"resources", "actions"}, {"comment", "expected"})
    if not isinstance(doc["resources"], dict) or not doc["resources"]:
        raise ValidationError("resources", doc["resources"], "must declare at least one resource")
    resources = {n: parse_resource(n, o) for n, o in doc["resources"].items()}
    if not isinstance(doc["actions"], list):
        raise ValidationError("actions", doc["actions"], "must be a list")
    actions = [parse_action(i, a, resources) for i, a in enumerate(doc["actions"])]
    ids = set()
    for a in actions:
        if a.id in ids:
            raise ValidationError(f"actions[{a.id}].id", a.id, "duplicate action id")
        ids.add(a.id)
    bindings: dict[tuple[str, str], str] = {}
    for a, obj in zip(actions, doc["actions"]):
        node = obj.get("node")
        if node is None:
            continue
        for r in a.demands:
            if resources[r].topology != "flat":
                continue
            assert a.trajectory is not None
            if bindings.setdefault((a.trajectory, r), node) != node:
                raise ValidationError(
                    f"actions[{a.id}].node",
                    node,
                    f"trajectory {a.trajectory} "
                    f"is bound to node {bindings[(a.trajectory, r)]} already",
                )
    _check_bound_fit(actions, resources, bindings)
    actions.sort(key=lambda a: a.submit_time)  # stable: file order breaks ties
    return Instance(resources, tuple(actions), bindings)


def _check_bound_fit(
    actions: list[Action],
    resources: Mapping[str, ResourceSpec],
    bindings: Mapping[tuple[str, str], str],
) -> None:
    """An action of a trajectory another action binds to a node (its `node` field) runs on
    that node too: its demand must fit there."""
    for a in actions:
        for r, d in a.demands.items():
            node = bindings.get((a.trajectory, r)) if a.trajectory is not None else None
            if node is None:
                continue
            units = resources[r].node_units.get(node, resources[r].units)
            if d.min > units:
                raise Infeasible(
                    f"actions[{a.id}].demand.{r}: needs at least {d.min}, its trajectory "
                    f"{a.trajectory} is bound to node {node}, which has {units}"
                )


def load_instance(path: str | Path) -> Instance:
    return parse_instance(
        read_document(path, "instance file", json.loads, json.JSONDecodeError, "JSON")
    )

"""The index sets of the exact schedule, shared by the CP-SAT and the PuLP backends.

Both backends read one `ScheduleModel` and nothing else, so their formulations cannot drift:

- **Time** is integer ticks of `resolution` seconds from `origin`. A duration becomes
  `ceil(d / resolution)` ticks and an arrival `ceil(a / resolution)` ticks: the discretised model
  is a *restriction* (every real interval lies inside its tick interval), so every schedule the
  model allows is feasible in real time. Objectives are reported in real seconds, recomputed from
  the real durations of the chosen amounts.
- **Jobs** are the actions to schedule (queued, weight 1) and, for the receding-horizon policy,
  the running ones (weight 0, pinned at tick 0 with their remaining time and placement).
- **Modes** of a job: one per (allowed amount of the key resource) x (a concrete slot per
  demanded resource). Non-key resources take their minimum amount: the duration depends on the
  key amount only, so more of another resource never helps. A slot is a node for flat pools and
  a (node, aligned chunk) of the networkx chunk tree for GPU pools.
- **Capacity**: `flat_users[(resource, node)]` lists (job, mode, amount) against the node's
  capacity (a cumulative); `gpu_users[(resource, node, gpu)]` lists the (job, mode) pairs whose
  chunk holds that GPU, i.e. whose chunk lies on the GPU's root-to-leaf path (a no-overlap).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import networkx as nx

from tangram.actions import Action
from tangram.errors import Infeasible, TangramError
from tangram.pools import ChunkPool, FlatPool, Placement, Pool
from topology import ChunkTree

DEFAULT_RESOLUTION = 0.01
"""Seconds per tick of the discretised schedule (durations are rounded up to it)."""

Duration = Callable[[Action, int | None], float]


def to_ticks(seconds: float, resolution: float) -> int:
    """Round up to whole ticks, forgiving float noise (0.2 s at 0.01 s is 20 ticks, not 21)."""
    return max(0, math.ceil(seconds / resolution - 1e-9))


def action_duration(action: Action, units: int | None) -> float:
    """The instance's own duration model: elastic `T_ori / (E(m) m)` or the fixed duration."""
    d = action.duration_at(units)
    if d is None:
        raise TangramError(f"action {action.id}: no duration (give `duration` or elasticity)")
    return d


@dataclass(frozen=True, slots=True)
class Slot:
    """Where one resource's units of a mode go: a node, and for GPU pools an aligned chunk."""

    resource: str
    node: str
    chunk: tuple[int, int] | None = None

    def placement(self) -> Placement:
        return Placement(self.node, chunk=self.chunk)


@dataclass(frozen=True, slots=True)
class Mode:
    """One way to run a job: amounts per resource, a slot per resource, its duration."""

    units: Mapping[str, int]
    slots: tuple[Slot, ...]
    duration: float
    ticks: int


@dataclass(frozen=True, slots=True)
class Job:
    """An action in the model. Running jobs are pinned (`pinned`) and weigh 0 in the objective."""

    action: Action
    arrival: float
    release: int
    modes: tuple[Mode, ...]
    pinned: bool = False

    @property
    def weight(self) -> int:
        return 0 if self.pinned else 1


@dataclass(frozen=True, slots=True)
class ScheduleModel:
    """Data of one exact schedule problem; see the module docstring for the index sets."""

    jobs: tuple[Job, ...]
    resolution: float
    origin: float
    flat_capacity: Mapping[tuple[str, str], int]
    flat_users: Mapping[tuple[str, str], tuple[tuple[int, int, int], ...]]
    gpu_users: Mapping[tuple[str, str, int], tuple[tuple[int, int], ...]]
    template: Mapping[str, Pool] = field(repr=False)
    """Pools as the model sees them at tick 0, empty of the jobs (blocked units taken)."""

    @property
    def horizon(self) -> int:
        """An end no optimal schedule passes: the latest release plus every job run serially."""
        return max((j.release for j in self.jobs), default=0) + sum(
            max(m.ticks for m in j.modes) for j in self.jobs
        )

    def queued(self) -> list[int]:
        return [i for i, j in enumerate(self.jobs) if not j.pinned]


def _options(action: Action, duration: Duration, resolution: float) -> list[tuple[dict, float]]:
    """(amounts per resource, duration) per allowed amount of the key resource."""
    base = {r: d.min for r, d in action.demands.items()}
    key = action.key
    if key is None:
        choices: list[tuple[dict[str, int], int | None]] = [(base, None)]
    else:
        choices = [({**base, key: m}, m) for m in action.demands[key].amounts]
    out = []
    for units, m in choices:
        d = duration(action, m)
        if not (d > 0 and math.isfinite(d)):
            raise TangramError(f"action {action.id}: duration {d!r} at {units} is not positive")
        out.append((units, d))
    return out


def free_chunks(pool: ChunkPool, node: str, k: int, blocked: set[int]) -> list[tuple[int, int]]:
    """Aligned k-GPU chunks of `node`'s chunk tree that hold no blocked GPU."""
    g: nx.DiGraph = pool.tree(node).graph
    return sorted(
        c
        for c, data in g.nodes(data=True)
        if data["size"] == k and not any(x in blocked for x in range(*c))
    )


def _slots(
    pool: Pool,
    resource: str,
    k: int,
    blocked: Mapping[str, set[int]],
    node: str | None,
    capacity: Mapping[tuple[str, str], int],
) -> list[Slot]:
    nodes = [node] if node is not None else pool.nodes()
    if isinstance(pool, ChunkPool):
        return [
            Slot(resource, n, c)
            for n in nodes
            for c in free_chunks(pool, n, k, blocked.get(n, set()))
        ]
    return [Slot(resource, n) for n in nodes if capacity[(resource, n)] >= k]


def flat_capacities(pools: Mapping[str, Pool]) -> dict[tuple[str, str], int]:
    return {
        (r, n): p.capacity(n)
        for r, p in pools.items()
        if not isinstance(p, ChunkPool)
        for n in p.nodes()
    }


def build_modes(
    action: Action,
    pools: Mapping[str, Pool],
    duration: Duration,
    resolution: float,
    blocked: Mapping[str, Mapping[str, set[int]]],
    bound: Mapping[str, str],
    capacity: Mapping[tuple[str, str], int],
) -> tuple[Mode, ...]:
    """Every (amount, slot per resource) the action can run in; `bound` pins a node per resource,
    `blocked` takes GPUs out of chunk pools and `capacity` sizes flat nodes."""
    modes: list[Mode] = []
    for units, d in _options(action, duration, resolution):
        combos: list[tuple[Slot, ...]] = [()]
        for r, k in units.items():
            if r not in pools:
                raise TangramError(f"action {action.id}: no pool for resource {r!r}")
            slots = _slots(pools[r], r, k, blocked.get(r, {}), bound.get(r), capacity)
            combos = [c + (s,) for c in combos for s in slots]
        modes += [Mode(units, c, d, max(1, to_ticks(d, resolution))) for c in combos]
    if not modes:
        raise Infeasible(f"action {action.id}: no amount of {dict(action.demands)} has a slot")
    return tuple(modes)


def index_sets(jobs: Sequence[Job]) -> tuple[dict, dict]:
    """(flat_users, gpu_users) of the module docstring."""
    flat: dict[tuple[str, str], list] = defaultdict(list)
    gpu: dict[tuple[str, str, int], list] = defaultdict(list)
    for i, job in enumerate(jobs):
        for m, mode in enumerate(job.modes):
            for s in mode.slots:
                if s.chunk is None:
                    flat[(s.resource, s.node)].append((i, m, mode.units[s.resource]))
                else:
                    for g in range(*s.chunk):
                        gpu[(s.resource, s.node, g)].append((i, m))
    return ({k: tuple(v) for k, v in flat.items()}, {k: tuple(v) for k, v in gpu.items()})


def template_pools(
    pools: Mapping[str, Pool],
    flat_capacity: Mapping[tuple[str, str], int],
    blocked: Mapping[str, Mapping[str, set[int]]],
) -> dict[str, Pool]:
    """Verification pools: FlatPool per flat resource at the model capacity, chunk trees with
    the blocked GPUs taken (one GPU at a time)."""
    out: dict[str, Pool] = {}
    for r, p in pools.items():
        if isinstance(p, ChunkPool):
            fresh = ChunkPool(r, {n: ChunkTree(p.tree(n).num_gpus, n) for n in p.nodes()})
            for n, gpus in blocked.get(r, {}).items():
                for g in sorted(gpus):
                    fresh.take(Placement(n, chunk=(g, g + 1)), 1)
            out[r] = fresh
        else:
            out[r] = FlatPool(r, {n: flat_capacity[(r, n)] for n in p.nodes()})
    return out


def _bound(action: Action, bindings: Mapping[tuple[str, str], str]) -> dict[str, str]:
    return {r: n for (t, r), n in bindings.items() if t == action.trajectory}


def instance_model(
    resources_pools: Mapping[str, Pool],
    actions: Sequence[Action],
    resolution: float = DEFAULT_RESOLUTION,
    duration: Duration = action_duration,
    bindings: Mapping[tuple[str, str], str] | None = None,
) -> ScheduleModel:
    """The whole-instance schedule: every action released at its arrival, empty pools; an
    action whose trajectory is bound (`bindings`: (trajectory, resource) -> node) runs there."""
    if not resolution > 0:
        raise TangramError(f"resolution must be positive, got {resolution!r}")
    origin = 0.0
    cap = flat_capacities(resources_pools)
    jobs = tuple(
        Job(
            a,
            a.submit_time,
            to_ticks(a.submit_time - origin, resolution),
            build_modes(
                a, resources_pools, duration, resolution, {}, _bound(a, bindings or {}), cap
            ),
        )
        for a in actions
    )
    flat, gpu = index_sets(jobs)
    return ScheduleModel(
        jobs, resolution, origin, cap, flat, gpu, template_pools(resources_pools, cap, {})
    )

"""Hypothesis strategies drawn from the instance file's grammar (`tangram.instance`,
docs/architecture.md section 5), and an independent checker of a finished schedule.

The strategies follow the format, not the shapes a test had in mind: any number of pools of
each topology (flat with `units` or with named `nodes`, GPU chunk pools of any node count and
power-of-two size, with or without `memory_gb` and `services`), actions demanding any non-empty
subset of the pools in every demand form the parser takes (an int, a list, `{"min", "max"}`),
fixed or elastic with the key on any demanded pool, named services, shared trajectories,
`kind`, `node`-bound actions, batch and online arrivals (out of file order too). Every document
drawn is valid by construction (`parse_instance` accepts it): the scheduling properties are
about instances a user may write.

`check_run` judges a simulated schedule by itself, not by the scheduler's own bookkeeping:
every action ran once, after its arrival, with allowed units on a placement of each demanded
pool; at every instant no node holds more units than it has and no two running actions share a
GPU (or core, where the placement names cores); a chunk is aligned and holds its units;
whenever work waited, something ran (liveness).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hypothesis import strategies as st

from tangram.instance import Instance, parse_instance

FLAT_NAMES = ("cpu", "mem", "api:search", "disk")
CHUNK_NAMES = ("gpu", "npu", "gpu_b")
NODE_NAMES = ("n0", "n1", "n2")  # shared across flat pools, so one node can be in several
POW2 = (1, 2, 4, 8)
EPS = 1e-9


# -- resources ---------------------------------------------------------------------------------
@st.composite
def flat_pool(draw, min_nodes: int = 1) -> dict:
    """`units` (one node) or named `nodes`; `min_nodes` > 1: named nodes, at least that many."""
    if min_nodes <= 1 and draw(st.booleans()):
        return {"topology": "flat", "units": draw(st.integers(1, 8))}
    names = draw(st.lists(st.sampled_from(NODE_NAMES), min_size=min_nodes, max_size=3, unique=True))
    return {"topology": "flat", "nodes": {n: draw(st.integers(1, 6)) for n in names}}


@st.composite
def chunk_pool(draw) -> dict:
    g = draw(st.sampled_from(POW2))
    doc: dict[str, Any] = {
        "topology": "chunks",
        "nodes": draw(st.integers(1, 3)),
        "gpus_per_node": g,
    }
    if draw(st.booleans()):
        mem = draw(st.sampled_from([16.0, 40.0, 80.0]))
        doc["memory_gb"] = mem
        services = {}
        for i in range(draw(st.integers(0, 3))):
            weights = draw(st.sampled_from([w for w in (0.0, 0.0, 8.0, 24.0) if w / g < mem - 1]))
            # the file's own bound: a g-GPU copy fits a GPU (weights / g + memory_gb <= mem)
            per_gpu = draw(st.floats(1.0, max(1.0, mem - weights / g)))
            s = {"memory_gb": per_gpu, "restore_s": draw(st.sampled_from([0.0, 0.5, 2.0]))}
            if weights:
                s["weights_gb"] = weights
            services[f"s{i}"] = s
        if services or draw(st.booleans()):
            doc["services"] = services
    return doc


@st.composite
def resources(draw, max_pools: int = 3, min_nodes: int = 1) -> dict:
    """At least one pool; any mix of flat and chunk pools (flat ones with at least
    `min_nodes` nodes)."""
    n = draw(st.integers(1, max_pools))
    kinds = draw(st.lists(st.booleans(), min_size=n, max_size=n))  # True: flat
    flat = iter(draw(st.permutations(FLAT_NAMES)))
    chunks = iter(draw(st.permutations(CHUNK_NAMES)))
    res = {}
    for is_flat in kinds:
        name = next(flat) if is_flat else next(chunks)
        res[name] = draw(flat_pool(min_nodes) if is_flat else chunk_pool())
    return res


def largest(spec: Mapping[str, Any], node: str | None = None) -> int:
    """The largest amount one placement of the pool can hold (on `node` when given)."""
    if spec["topology"] == "chunks":
        return spec["gpus_per_node"]
    if "units" in spec:
        return spec["units"]
    return spec["nodes"][node] if node is not None else max(spec["nodes"].values())


def node_names(spec: Mapping[str, Any]) -> list[str]:
    if spec["topology"] == "chunks":
        return []
    return ["node0"] if "units" in spec else list(spec["nodes"])


# -- actions -----------------------------------------------------------------------------------
@st.composite
def demand(draw, spec: Mapping[str, Any], cap: int, floor: int = 1) -> tuple[Any, list[int]]:
    """A demand in any of the parser's forms, within `floor..cap`: (the JSON value, its
    amounts)."""
    if spec["topology"] == "chunks":
        allowed = [k for k in POW2 if floor <= k <= cap]
        amounts = sorted(
            draw(st.lists(st.sampled_from(allowed), min_size=1, max_size=3, unique=True))
        )
        if len(amounts) == 1 and draw(st.booleans()):
            return amounts[0], amounts
        if amounts == [1, 2] and draw(st.booleans()):
            return {"min": 1, "max": 2}, amounts
        return amounts, amounts
    form = draw(st.sampled_from(["int", "list", "range"]))
    if form == "int":
        k = draw(st.integers(1, cap))
        return k, [k]
    if form == "range":
        lo = draw(st.integers(1, cap))
        hi = draw(st.integers(lo, cap))
        return {"min": lo, "max": hi}, list(range(lo, hi + 1))
    amounts = sorted(draw(st.lists(st.integers(1, cap), min_size=1, max_size=4, unique=True)))
    return amounts, amounts


@st.composite
def arrivals(draw, n: int, grid: float | None = None) -> list[float]:
    """Batch (all at 0), online (non-decreasing steps) or any order the file may list; on
    `grid` every arrival is a whole multiple of it."""
    shape = draw(st.sampled_from(["batch", "online", "shuffled"]))
    if shape == "batch":
        return [0.0] * n
    steps = [0, 0, 1, 3, 5, 10] if grid else [0.0, 0.0, 0.1, 0.25, 0.5, 1.0, 2.5]
    t, out = 0, []
    for _ in range(n):
        t += draw(st.sampled_from(steps))
        out.append(round(t * grid, 9) if grid else t)
    return out if shape == "online" else draw(st.permutations(out))


def _timing(draw, a: dict, key: str | None, amounts: list[int], grid: float | None) -> None:
    """An elastic action's `key`, `t_ori` and E(m) for every amount, or a fixed `duration`;
    on `grid`, every duration a whole multiple of it (E(m) = t_ori / (m * d_m))."""
    if key is None:
        a["duration"] = draw(st.integers(1, 30)) * grid if grid else draw(st.floats(0.05, 4.0))
        return
    a["key"] = key
    if not grid:
        a["t_ori"] = draw(st.floats(0.05, 6.0))
        a["efficiency"] = {str(m): 1.0 if m == 1 else draw(st.floats(0.2, 1.0)) for m in amounts}
        return
    ticks = draw(st.integers(5, 40))
    a["t_ori"] = t_ori = ticks * grid
    eff = {}
    for m in amounts:
        d = (-(-ticks // m) + draw(st.integers(0, 5))) * grid  # at least ceil(t_ori / m)
        eff[str(m)] = min(1.0, t_ori / (m * d))
    a["efficiency"] = eff


@st.composite
def instance_docs(
    draw,
    max_pools: int = 3,
    max_actions: int = 8,
    grid: float | None = None,
    services: bool = True,
    min_nodes: int = 1,
) -> dict:
    """An instance document of the file format (module docstring), valid by construction.
    `grid`: arrivals and durations whole multiples of it (an exact model's time resolution);
    `services=False`: no pool declares services; `min_nodes`: flat pools with at least that
    many named nodes."""
    res = draw(resources(max_pools, min_nodes))
    if not services:
        for spec in res.values():
            spec.pop("services", None)
    usable = [r for r, s in res.items() if largest(s) >= 1]
    if not usable:  # every pool empty: make the first one hold a unit
        r = next(iter(res))
        res[r] = {"topology": "flat", "units": 1} if res[r]["topology"] == "flat" else res[r]
        usable = [r]
    n = draw(st.integers(1, max_actions))
    times = draw(arrivals(n, grid))
    trajectories = [f"t{i}" for i in range(draw(st.integers(1, 4)))]
    bound: dict[tuple[str, str], str] = {}  # (trajectory, flat resource) -> node, as parsed
    need: dict[tuple[str, str], int] = {}  # (trajectory, flat resource) -> its largest minimum
    acts = []
    for i in range(n):
        demanded = draw(
            st.lists(st.sampled_from(usable), min_size=1, max_size=len(usable), unique=True)
        )
        a: dict[str, Any] = {"id": f"a{i}", "arrival": times[i]}
        traj = draw(st.one_of(st.none(), st.sampled_from(trajectories)))
        if traj is not None:
            a["trajectory"] = traj
        owner = traj or a["id"]
        node = _node(draw, res, demanded, owner, bound, need)
        if node is not None:
            a["node"] = node
        gpu = [r for r in demanded if res[r]["topology"] == "chunks"]
        # a service runs on one GPU pool: only an action demanding one chunk pool names one
        services = res[gpu[0]].get("services", {}) if len(gpu) == 1 else {}
        service = None
        if services and draw(st.booleans()):
            service = a["service"] = draw(st.sampled_from(sorted(services)))
        amounts: dict[str, list[int]] = {}
        a["demand"] = {}
        for r in demanded:
            spec = res[r]
            floor = 1
            if spec["topology"] == "flat":
                at = bound.get((owner, r)) if "nodes" in spec else None
                cap = largest(spec, at)
            else:
                cap = largest(spec)
                if service is not None and r == gpu[0]:
                    floor = _smallest_copy(spec, service)
            a["demand"][r], amounts[r] = draw(demand(spec, cap, floor))
            if spec["topology"] == "flat":
                need[(owner, r)] = max(need.get((owner, r), 0), amounts[r][0])
        key = draw(st.one_of(st.none(), st.sampled_from(demanded)))
        _timing(draw, a, key, amounts[key] if key else [], grid)
        if draw(st.integers(0, 3)) == 0:
            a["kind"] = draw(st.sampled_from(["build", "test", "judge"]))
        acts.append(a)
    return {"resources": res, "actions": acts}


def _smallest_copy(spec: Mapping[str, Any], service: str) -> int:
    """The fewest GPUs a copy of `service` fits on (sharded weights spread over k GPUs)."""
    s, mem = spec["services"][service], spec.get("memory_gb")
    for k in POW2:
        if k <= spec["gpus_per_node"] and (
            mem is None or s.get("weights_gb", 0.0) / k + s["memory_gb"] <= mem
        ):
            return k
    return spec["gpus_per_node"]


def _node(draw, res, demanded, owner: str, bound, need) -> str | None:
    """A `node` for the action when it demands a flat pool: one every demanded flat pool has,
    with at least a unit there, agreeing with the trajectory's earlier bindings and holding
    the minimum of every action of the trajectory drawn so far."""
    flat = [r for r in demanded if res[r]["topology"] == "flat"]
    if not flat or not draw(st.booleans()):
        return None
    common = set(node_names(res[flat[0]]))
    for r in flat[1:]:
        common &= set(node_names(res[r]))
    fits = sorted(
        n
        for n in common
        if all(largest(res[r], n) >= max(1, need.get((owner, r), 0)) for r in flat)
    )
    agreed = [n for n in fits if all(bound.get((owner, r), n) == n for r in flat)]
    if not agreed:
        return None
    node = draw(st.sampled_from(agreed))
    for r in flat:
        bound[(owner, r)] = node
    return node


def instances(max_pools: int = 3, max_actions: int = 8, **kw) -> st.SearchStrategy[Instance]:
    return instance_docs(max_pools, max_actions, **kw).map(parse_instance)


def multi_pool_docs(max_actions: int = 8) -> st.SearchStrategy[dict]:
    """Documents with at least one action demanding two pools or more (the vector case)."""
    return instance_docs(3, max_actions).filter(
        lambda d: any(len(a["demand"]) > 1 for a in d["actions"])
    )


# -- the checker -------------------------------------------------------------------------------
def check_run(inst: Instance, records: Mapping[str, Any]) -> list[str]:
    """Findings of a finished schedule (`SimResult.records`), empty when it is sound."""
    out: list[str] = []
    acts = {a.id: a for a in inst.actions}
    if set(records) != set(acts):
        out.append(f"actions without a record: {sorted(set(acts) - set(records))}")
    caps = {r: _capacities(spec) for r, spec in inst.resources.items()}
    for aid, rec in records.items():
        a = acts[aid]
        if rec.start < a.submit_time - EPS or rec.end < rec.start - EPS:
            out.append(f"{aid}: arrival {a.submit_time}, start {rec.start}, end {rec.end}")
        if set(rec.units) != set(a.demands) or set(rec.placement or {}) != set(a.demands):
            out.append(f"{aid}: units {dict(rec.units)} for demands {sorted(a.demands)}")
            continue
        for r, u in rec.units.items():
            p = rec.placement[r]
            if not a.demands[r].allows(u):
                out.append(f"{aid}: {u} {r} not among {a.demands[r].amounts}")
            if p.node not in caps[r]:
                out.append(f"{aid}: {r} on unknown node {p.node}")
            if p.cores and len(set(p.cores)) != u:
                out.append(f"{aid}: {r} cores {p.cores} for {u} units")
            if inst.resources[r].topology == "chunks":
                s, e = p.chunk or (0, 0)
                if e - s != u or s % max(u, 1) or e > caps[r].get(p.node, 0):
                    out.append(f"{aid}: {r} chunk {p.chunk} for {u} GPUs")
            bound = inst.bindings.get((a.trajectory, r)) if a.trajectory else None
            if bound is not None and p.node != bound:
                out.append(f"{aid}: {r} on {p.node}, bound to {bound}")
    if not out:
        out += _over_capacity(inst, records, caps) + _idle_with_work(inst, records)
    return out


def _capacities(spec) -> dict[str, int]:
    if spec.topology == "chunks":
        return {n: spec.gpus_per_node for n in spec.node_names()}
    return dict(spec.node_units) or {"node0": spec.units}


def _instants(records: Mapping[str, Any], inst: Instance) -> list[float]:
    ts = {a.submit_time for a in inst.actions}
    for rec in records.values():
        ts.update((rec.start, rec.end))
    return sorted(ts)


def _over_capacity(inst, records, caps) -> list[str]:
    out = []
    for t in _instants(records, inst):
        held: dict[tuple[str, str], int] = {}
        gpus: dict[tuple[str, str, int], str] = {}
        cores: dict[tuple[str, str, int], str] = {}
        for aid, rec in records.items():
            if not (rec.start <= t < rec.end - EPS):
                continue
            for r, u in rec.units.items():
                p = rec.placement[r]
                held[(r, p.node)] = held.get((r, p.node), 0) + u
                if p.chunk is not None:
                    for g in range(*p.chunk):
                        other = gpus.setdefault((r, p.node, g), aid)
                        if other != aid:
                            out.append(f"t={t}: {r}@{p.node} GPU {g} held by {other} and {aid}")
                for c in p.cores:  # a core pool's placement names its cores
                    other = cores.setdefault((r, p.node, c), aid)
                    if other != aid:
                        out.append(f"t={t}: {r}@{p.node} core {c} held by {other} and {aid}")
        for (r, n), u in held.items():
            if u > caps[r][n]:
                out.append(f"t={t}: {r}@{n} holds {u} of {caps[r][n]}")
    return out


def _idle_with_work(inst, records) -> list[str]:
    """Liveness: at no instant does an arrived action wait while nothing at all runs."""
    out = []
    for t in _instants(records, inst):
        waiting = [
            a.id
            for a in inst.actions
            if a.submit_time <= t + EPS and a.id in records and records[a.id].start > t + EPS
        ]
        if waiting and not any(r.start <= t + EPS < r.end for r in records.values()):
            # an instant action (start == end) ran at t: nothing was idle then
            if not any(abs(r.start - t) <= EPS for r in records.values()):
                out.append(f"t={t}: {waiting} wait and nothing runs")
    return out

"""The model of exact DPArrange on a real topology (paper Appendix B, docs/architecture.md §4).

Pick one allowed amount per task and a concrete place for it in the pool's current state, all
running at once, minimising the sum of durations:

- GPU pools: a free aligned chunk of the node's networkx chunk tree; two tasks conflict when
  their chunks lie on one root-to-leaf path (they share a GPU); GPUs already used are off limits.
- Core pools: cores of one NUMA domain (`numa_strict`, the default), or of one node.
- Flat pools: units of one node.

Every constraint is a *capacity group*: `sum(weight * chosen) <= limit` over (task, candidate)
pairs; both backends read only `ArrangementModel`. Tasks are `{amount: duration}` mappings, as
for `dp_arrange`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import networkx as nx

from solvers.exact.backend import SolveStatus
from tangram.errors import Infeasible, TangramError
from tangram.pools import ChunkPool, CorePool, Placement, Pool


@dataclass(frozen=True, slots=True)
class Candidate:
    """Task gets `amount` units (taking `duration`) at `node`, in `chunk` or NUMA `domain`."""

    amount: int
    duration: float
    node: str
    chunk: tuple[int, int] | None = None
    domain: int | None = None


@dataclass(frozen=True, slots=True)
class CapacityGroup:
    limit: int
    members: tuple[tuple[int, int, int], ...]  # (task, candidate, weight)


@dataclass(frozen=True, slots=True)
class ArrangementModel:
    candidates: tuple[tuple[Candidate, ...], ...]
    groups: tuple[CapacityGroup, ...]


@dataclass(frozen=True, slots=True)
class ExactArrangement:
    """The arrangement: `total` (real seconds), an amount and a concrete placement per task."""

    status: SolveStatus
    total: float
    units: tuple[int, ...]
    placements: tuple[Placement, ...]
    solve_s: float


def _chunk_model(tasks: Sequence[Mapping[int, float]], pool: ChunkPool, nodes: list[str]):
    cands: list[list[Candidate]] = [[] for _ in tasks]
    groups = []
    for n in nodes:
        tree = pool.tree(n)
        g: nx.DiGraph = tree.graph
        used = {x for c in tree.used for x in range(*c)}
        for t, task in enumerate(tasks):
            for k, d in task.items():
                cands[t] += [
                    Candidate(k, d, n, chunk=c)
                    for c, data in g.nodes(data=True)
                    if data["size"] == k and not used.intersection(range(*c))
                ]
        for leaf in (c for c, data in g.nodes(data=True) if data["size"] == 1):
            if leaf[0] in used:
                continue
            path = nx.ancestors(g, leaf) | {leaf}  # the chunks on this GPU's root-to-leaf path
            members = tuple(
                (t, c, 1)
                for t in range(len(tasks))
                for c, cd in enumerate(cands[t])
                if cd.node == n and cd.chunk in path
            )
            groups.append(CapacityGroup(1, members))
    return cands, groups


def _flat_model(
    tasks: Sequence[Mapping[int, float]], pool: Pool, nodes: list[str], numa_strict: bool
):
    bins: list[tuple[str, int | None, int]] = []  # (node, domain, free units)
    for n in nodes:
        if isinstance(pool, CorePool) and numa_strict:
            bins += [(n, d, len(free)) for d, free in sorted(pool.cpu_node(n).free.items())]
        else:
            bins.append((n, None, pool.free(n)))
    cands = [
        [
            Candidate(k, d, n, domain=dom)
            for n, dom, free in bins
            for k, d in task.items()
            if k <= free
        ]
        for task in tasks
    ]
    groups = [
        CapacityGroup(
            free,
            tuple(
                (t, c, cd.amount)
                for t in range(len(tasks))
                for c, cd in enumerate(cands[t])
                if (cd.node, cd.domain) == (n, dom)
            ),
        )
        for n, dom, free in bins
    ]
    return cands, groups


def arrangement_model(
    tasks: Sequence[Mapping[int, float]],
    pool: Pool,
    node: str | None = None,
    numa_strict: bool = True,
) -> ArrangementModel:
    """Candidates and capacity groups for `tasks` on `pool`'s current free state."""
    for i, task in enumerate(tasks):
        if not task or any(k <= 0 or not math.isfinite(d) or d < 0 for k, d in task.items()):
            raise TangramError(f"tasks[{i}]: needs positive amounts and finite durations")
    nodes = [node] if node is not None else pool.nodes()
    if isinstance(pool, ChunkPool):
        cands, groups = _chunk_model(tasks, pool, nodes)
    else:
        cands, groups = _flat_model(tasks, pool, nodes, numa_strict)
    for i, c in enumerate(cands):
        if not c:
            raise Infeasible(f"tasks[{i}]: no allowed amount fits anywhere in {pool.resource}")
    return ArrangementModel(tuple(tuple(c) for c in cands), tuple(g for g in groups if g.members))


def concrete_placements(
    model: ArrangementModel, chosen: Sequence[int], pool: Pool
) -> tuple[Placement, ...]:
    """Placements of the chosen candidates; cores are picked inside the chosen NUMA domain.
    Verified by taking them into a copy of the pool (raises on any broken invariant)."""
    work = pool.copy()
    out = []
    for cands, c in zip(model.candidates, chosen):
        cd = cands[c]
        if isinstance(work, CorePool):
            free = work.cpu_node(cd.node).free
            doms = (
                [cd.domain] if cd.domain is not None else sorted(free, key=lambda d: -len(free[d]))
            )
            cores = sorted(x for d in doms for x in sorted(free[d]))[: cd.amount]
            p = Placement(cd.node, cores=tuple(cores))
        else:
            p = Placement(cd.node, chunk=cd.chunk)
        work.take(p, cd.amount)
        out.append(p)
    return tuple(out)

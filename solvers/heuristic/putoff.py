"""Put-off candidates keep their place (the heuristic's step 3, after greedy eviction).

An elastic candidate that greedy eviction sends back to wait for more units holds a
reservation: the earliest estimated time the units it waits for are free. Later candidates on
the same pool (node) start now only if they end by then or fit beside it (conservative
backfilling); when what it waits for is free now, or free on another node, it starts now.
"""

from __future__ import annotations

from solvers.fcfs import Candidate, ScratchPools, _prefer
from tangram.actions import Action
from tangram.allocation import ClusterView
from tangram.errors import Infeasible
from tangram.pools import Pool


def wait_target(a: Action, r: str, capacity: int) -> int:
    """The units a put-off action waits for: its largest amount the pool (node) can hold."""
    if not a.options:
        return min(a.mins[r], capacity)
    return max((m for m, _ in a.options if m <= capacity), default=a.options[0][0])


def hold_back(
    releases: list[tuple[float, int]],
    capacity: int,
    target: int,
    later: list[tuple[int, float, int]],
    now: float,
) -> tuple[float, list[int], list[int]]:
    """The "put-off action keeps its place" rule on one pool (node). `releases`: (estimated
    end, units) of everything holding the pool's units ahead of the put-off action (running
    actions, candidates ahead of it); `later`: (index, estimated end, units) of the later
    candidates on the pool, in queue order. Its reservation is the earliest estimated time at
    which `target` units are free; a later candidate may start now only if it ends by then or
    fits in what is left over at that time beside the `target`. Returns the reservation and the
    indices of the later candidates that start now and of those held back."""
    free = capacity - sum(u for _, u in releases)
    reservation = now
    for end, u in sorted(releases):
        if free >= target:
            break
        free += u
        reservation = end
    extra = free - target
    allowed, held = [], []
    for i, end, u in later:
        if end <= reservation:
            allowed.append(i)
        elif u <= extra:
            extra -= u
            allowed.append(i)
        else:
            held.append(i)
    return reservation, allowed, held


def elsewhere(view: ClusterView, pool: Pool, c: Candidate, r: str, node: str | None) -> bool:
    """A put-off candidate not bound to a node waits for more units on the node the scan
    placed it on; when another node of the pool has every amount it allows free, it starts
    there now at its fastest amount instead (what it waits for is never free units)."""
    a = c.action
    if node is None or view.node_for(a, r) is not None:
        return False
    amounts = [m for m, _ in a.options if m <= pool.largest_request()]
    if not amounts:
        return False
    there = next((n for n in pool.nodes() if n != node and pool.free(n) >= amounts[-1]), None)
    if there is None:
        return False
    m = min(amounts, key=lambda k: (view.estimate(a, k), k))
    c.units[r] = m
    c.placement[r] = pool.place(m, there, (), _prefer(view, a, r))
    return True


def start_now(
    view: ClusterView,
    pools: ScratchPools,
    cands: list[Candidate],
    first: int,
    held: list[int],
    r: str,
    node: str | None,
) -> list[int] | None:
    """Start the put-off candidate `first` now at its fastest amount that fits once the
    later candidates `held` give their units of the pool back; then re-place each of those,
    in order, where it still fits. Returns the ones that no longer fit (they wait), or None
    (and changes nothing) when no amount of `first` fits."""
    pool = pools[r]
    for i in held:
        c = cands[i]
        pool.release(c.placement[r], c.units[r])
    c = cands[first]
    a = c.action
    best = None
    for m, _ in a.options:
        d = view.estimate(a, m)
        if pool.fits(m, node) is not None and (best is None or d < best[0] - 1e-12):
            best = (d, m)
    if best is None:
        for i in held:
            pool.take(cands[i].placement[r], cands[i].units[r])
        return None
    m = best[1]
    c.units[r] = m
    c.placement[r] = pool.place(m, node, (), _prefer(view, a, r))
    late = []
    for i in held:
        h = cands[i]
        k = h.units[r]
        try:
            h.placement[r] = pool.place(
                k, view.node_for(h.action, r), (), _prefer(view, h.action, r)
            )
        except Infeasible:
            for r2, p in h.placement.items():
                if r2 != r:
                    pools[r2].release(p, h.units[r2])
            late.append(i)
    return late


def keep_place(
    view: ClusterView,
    cands: list[Candidate],
    evicted: set[int],
    first: int,
    r: str,
    node: str | None,
    now: float,
) -> tuple[float, list[int]]:
    """An elastic candidate put off to wait for more units keeps its place. Its reservation
    is the estimated time at which the units it waits for (its largest useful amount) are
    free, counting only what runs now and the candidates ahead of it. A later candidate
    that takes units of the same pool (and node) starts now only if it ends by the
    reservation or fits in the units left over at the reservation (conservative
    backfilling). Returns the reservation and the later candidates that must wait too."""
    capacity = view.pools[r].capacity(node)
    releases = [
        (max(ra.expected_end, now), ra.assignment.units[r]) for ra in view.running_on(r, node)
    ]
    later: list[tuple[int, float, int]] = []
    for i, c in enumerate(cands):
        if i in evicted or r not in c.units:
            continue
        if node is not None and c.placement[r].node != node:
            continue
        a = c.action
        end = now + view.estimate(a, c.units[a.key] if a.key else None)
        if i < first:
            releases.append((end, c.units[r]))
        else:
            later.append((i, end, c.units[r]))
    reservation, _, held = hold_back(
        releases, capacity, wait_target(cands[first].action, r, capacity), later, now
    )
    return reservation, held

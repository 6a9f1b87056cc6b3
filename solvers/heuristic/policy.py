"""`heuristic`: the paper's elastic scheduler (Algorithms 1 and 2).

1. FCFS candidates at minimum demands (`solvers.fcfs`), topology checked.
2. Group elastic candidates by (key resource, node) — CPU per node, GPU chunks pooled.
3. Per group, greedy eviction: one DPArrange pass over the group gives the optimum for every
   prefix; evict from the back while the ACT approximation keeps falling.
4. Everything else (non-scalable, unknown elasticity) keeps its minimum.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from solvers.fcfs import Candidate, ScratchPools, _prefer, scan_candidates
from solvers.heuristic.dparrange import dp_table
from solvers.heuristic.objective import Waiting, estimate_waiting
from solvers.registry import register
from tangram.actions import Action
from tangram.allocation import Assignment, ClusterView
from tangram.errors import Infeasible, ValidationError
from tangram.pools import Pool
from tangram.queue import ActionQueue


def _never(_: object) -> bool:
    return False


@register("heuristic")
@dataclass(frozen=True)
class HeuristicAllocator:
    """depth: options the first waiting action tries in the estimate (paper: 2).
    lookahead: how many waiting actions behind the candidates the estimate looks at.
    allow_wait: greedy eviction may evict *every* candidate of a group, so an elastic action
    waits for more units when the estimate says it then finishes sooner (a reward run that
    would get 1 free core now, 8 in a moment). False stops at one candidate, the literal
    reading of the paper's loop."""

    depth: int = 2
    lookahead: int = 32
    allow_wait: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.depth, bool) or not isinstance(self.depth, int) or self.depth < 1:
            raise ValidationError("allocator.depth", self.depth, "must be an integer >= 1")
        if (isinstance(self.lookahead, bool) or not isinstance(self.lookahead, int)
                or self.lookahead < 0):
            raise ValidationError("allocator.lookahead", self.lookahead, "must be an integer >= 0")

    def allocate(self, view: ClusterView, queue: Collection[Action],
                 now: float) -> list[Assignment]:
        cands, evicted, _ = self.arrange(view, queue, now)
        return [Assignment(c.action, c.units, c.placement)
                for i, c in enumerate(cands) if i not in evicted]

    def arrange(self, view: ClusterView, queue: Collection[Action],
                now: float) -> tuple[list[Candidate], set[int], ScratchPools]:
        """The decision in full: the FCFS candidates (with their final units and placements),
        the indices of those greedy eviction sent back to wait, and the scratch pools holding
        exactly the kept candidates (what `backfill` builds on)."""
        pools = ScratchPools(view.pools)
        cands = scan_candidates(view, queue, pools, now)
        if not cands:
            return cands, set(), pools
        groups: dict[tuple[str, str | None], list[int]] = {}
        for i, c in enumerate(cands):
            a = c.action
            if a.is_elastic:
                r = a.key
                assert r is not None
                node = c.placement[r].node if view.pools[r].per_node else None
                groups.setdefault((r, node), []).append(i)
        evicted: set[int] = set()
        for (r, node), idxs in groups.items():
            gone = self._arrange(view, pools[r], pools, cands, idxs, r, node, queue, now)
            if gone:
                evicted.update(gone)
                held = self._keep_place(view, cands, evicted, gone[0], r, node, now)
                for i in held:  # they wait: their units go back to the scratch pools
                    c = cands[i]
                    for r2, p in c.placement.items():
                        pools[r2].release(p, c.units[r2])
                evicted.update(held)
        return cands, evicted, pools

    def _keep_place(self, view: ClusterView, cands: list[Candidate], evicted: set[int],
                    first: int, r: str, node: str | None, now: float) -> list[int]:
        """An elastic candidate put off to wait for more units keeps its place. Its reservation
        is the estimated time at which the units it waits for (its largest useful amount) are
        free, counting only what runs now and the candidates ahead of it. A later candidate
        that takes units of the same pool (and node) starts now only if it ends by the
        reservation or fits in the units left over at the reservation (conservative
        backfilling). Returns the ones that must wait too."""
        pool = view.pools[r]
        capacity = pool.capacity(node)
        releases = [(max(ra.expected_end, now), ra.assignment.units[r])
                    for ra in view.running_on(r, node)]
        later: list[int] = []
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
                later.append(i)
        if not later:
            return []
        waiting = cands[first].action
        target = min(waiting.options[-1][0] if waiting.options else waiting.mins[r], capacity)
        free = capacity - sum(u for _, u in releases)
        reservation = now
        for end, u in sorted(releases):
            if free >= target:
                break
            free += u
            reservation = end
        # at the reservation `free` units are back; the put-off action needs `target` of them,
        # the rest may go to later candidates now, as may any that end before the reservation
        extra = free - target
        out = []
        for i in later:
            c = cands[i]
            a = c.action
            if now + view.estimate(a, c.units[a.key] if a.key else None) <= reservation:
                continue
            if c.units[r] <= extra:
                extra -= c.units[r]
                continue
            out.append(i)
        return out

    # -- one group -----------------------------------------------------------------------------
    def _arrange(self, view: ClusterView, pool: Pool, pools, cands: list[Candidate],
                 idxs: list[int], r: str, node: str | None, queue: Collection[Action],
                 now: float) -> list[int]:
        for i in idxs:
            pool.release(cands[i].placement[r], cands[i].units[r])
        cap = pool.free(node)
        if len(idxs) == 1 and pool.per_node:
            c = cands[idxs[0]]
            if (not self.allow_wait or cap == pool.capacity(node)
                    or c.action.options[-1][0] <= cap):
                # one candidate that cannot get more units by waiting: no split to search
                m, best = 0, None
                for units, d in c.action.options:
                    if units <= cap and (best is None or d < best):
                        m, best = units, d
                c.units[r] = m
                c.placement[r] = pool.place(m, node, (), _prefer(view, c.action, r))
                return []
        tasks = []
        for i in idxs:
            am, du = cands[i].action.option_arrays  # type: ignore[misc]
            if am[-1] > cap:
                keep = am <= cap
                am, du = am[keep], du[keep]
            tasks.append((am, du))
        table = dp_table(tasks, pool.operator(node))
        busy, rest_tail = self._contention(view, cands, idxs, r, node, queue, now)
        capacity = pool.capacity(node)
        waiting_evicted = [self._waiting(cands[i].action, r, view, capacity) for i in idxs]
        best_t, best_obj, best_units = None, None, None
        # waiting for more units is allowed only against units some running (or starting)
        # action in this group will give back: its completion re-runs the decision. With
        # nothing busy in the group, at least one candidate starts (no idle strand).
        last = 0 if self.allow_wait and busy else 1
        # the busy units are the same for every prefix: sort and sum them once
        busy_sorted = sorted(busy)
        busy_units = sum(u for _, u in busy)
        ends: dict[tuple[int, int], float] = {}  # (candidate, units) -> its end if it starts
        for t in range(len(idxs), last - 1, -1):
            try:
                arr = table.best(t)
            except Infeasible:
                continue
            starting = []
            for i, u in zip(idxs, arr.units):
                end = ends.get((i, u))
                if end is None:
                    end = ends[i, u] = now + view.estimate(cands[i].action, u)
                starting.append((end, u))
            starting.sort()
            releases = sorted(busy_sorted + starting)  # two sorted runs: a linear merge
            free = capacity - busy_units - sum(arr.units)
            obj = arr.total + estimate_waiting(releases, free, now,
                                               waiting_evicted[t:] + rest_tail, self.depth,
                                               capacity, presorted=True)
            if best_obj is not None and obj >= best_obj - 1e-12:
                break
            best_t, best_obj, best_units = t, obj, arr.units
        if best_t is None or best_units is None:  # cannot happen: the minimums fit
            raise Infeasible(f"{r}: no arrangement for the candidates")
        for j, i in enumerate(idxs[:best_t]):
            c = cands[i]
            c.units[r] = best_units[j]
            c.placement[r] = pool.place(best_units[j], node, (), _prefer(view, c.action, r))
        gone = idxs[best_t:]
        for i in gone:  # an evicted candidate gives back its other resources too
            c = cands[i]
            for r2, p in c.placement.items():
                if r2 != r:
                    pools[r2].release(p, c.units[r2])
        return gone

    def _waiting(self, a: Action, r: str, view: ClusterView, capacity: int) -> Waiting:
        if a.options and a.key == r:
            if a.options[-1][0] <= capacity:
                return Waiting(a.options)
            return Waiting(tuple(o for o in a.options if o[0] <= capacity) or a.options[:1])
        return Waiting(((a.mins[r], view.estimate(a, None)),))

    def _contention(self, view: ClusterView, cands: list[Candidate], idxs: list[int], r: str,
                    node: str | None, queue: Collection[Action], now: float):
        """Busy units of the group's pool (running + other candidates) and the queue behind."""
        busy = [(max(ra.expected_end, now), ra.assignment.units[r])
                for ra in view.running_on(r, node)]
        group = set(idxs)
        cand_ids = set()
        for i, c in enumerate(cands):
            cand_ids.add(c.action.id)
            if i in group or r not in c.units:
                continue
            if node is None or c.placement[r].node == node:
                a = c.action
                d = view.estimate(a, c.units[a.key] if a.key else None)
                busy.append((now + d, c.units[r]))
        capacity = view.pools[r].capacity(node)
        tail: list[Waiting] = []
        if self.lookahead:
            # only the queue's classes that wait on this pool (and node): an indexed queue
            # walks just those, a plain one is filtered
            walk = (queue.scan(_never, only=((r, node), (r, None)))
                    if isinstance(queue, ActionQueue) else queue)
            for a in walk:
                if a.id in cand_ids or r not in a.mins:
                    continue
                bound = view.node_for(a, r)
                if node is not None and bound is not None and bound != node:
                    continue
                tail.append(self._waiting(a, r, view, capacity))
                if len(tail) >= self.lookahead:
                    break
        return busy, tail

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
from tangram.actions import Action
from tangram.allocation import Assignment, ClusterView
from tangram.errors import Infeasible, ValidationError
from tangram.pools import Pool
from tangram.queue import ActionQueue

EPS = 1e-9


def _never(_: object) -> bool:
    return False


def _target(a: Action, r: str, capacity: int) -> int:
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
        if (
            isinstance(self.lookahead, bool)
            or not isinstance(self.lookahead, int)
            or self.lookahead < 0
        ):
            raise ValidationError("allocator.lookahead", self.lookahead, "must be an integer >= 0")

    def allocate(
        self, view: ClusterView, queue: Collection[Action], now: float
    ) -> list[Assignment]:
        cands, evicted, _ = self.arrange(view, queue, now)
        return [
            Assignment(c.action, c.units, c.placement)
            for i, c in enumerate(cands)
            if i not in evicted
        ]

    def arrange(
        self, view: ClusterView, queue: Collection[Action], now: float
    ) -> tuple[list[Candidate], set[int], ScratchPools]:
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
            while gone:
                first = gone[0]
                reservation, held = self._keep_place(
                    view, cands, evicted | set(gone), first, r, node, now
                )
                if reservation <= now + EPS:
                    # what it waits for is free now (once the later candidates it holds back
                    # give way): it starts now with them, the first of the rest waits next
                    late = self._start_now(view, pools, cands, first, held, r, node)
                    if late is not None:
                        evicted.update(late)
                        gone = gone[1:]
                        continue
                elif self._elsewhere(view, pools[r], cands[first], r, node):
                    gone = gone[1:]  # not bound to the node: it starts on one that holds it
                    continue
                for i in [*gone, *held]:  # they wait: their units go back to the scratch pools
                    c = cands[i]
                    for r2, p in c.placement.items():
                        if i in held or r2 != r:
                            pools[r2].release(p, c.units[r2])
                evicted.update(gone)
                evicted.update(held)
                break
        return cands, evicted, pools

    def _elsewhere(
        self, view: ClusterView, pool: Pool, c: Candidate, r: str, node: str | None
    ) -> bool:
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

    def _start_now(
        self,
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

    def _keep_place(
        self,
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
            releases, capacity, _target(cands[first].action, r, capacity), later, now
        )
        return reservation, held

    # -- one group -----------------------------------------------------------------------------
    def _arrange(
        self,
        view: ClusterView,
        pool: Pool,
        pools,
        cands: list[Candidate],
        idxs: list[int],
        r: str,
        node: str | None,
        queue: Collection[Action],
        now: float,
    ) -> list[int]:
        for i in idxs:
            pool.release(cands[i].placement[r], cands[i].units[r])
        cap = pool.free(node)
        if (
            len(idxs) == 1
            and pool.per_node
            and self._alone(view, pool, cands[idxs[0]], r, node, cap)
        ):
            return []
        table = dp_table(_tasks(cands, idxs, cap), pool.operator(node))
        running, others, rest_tail = self._contention(view, cands, idxs, r, node, queue, now)
        capacity = pool.capacity(node)
        waiting_evicted = [self._waiting(cands[i].action, r, view, capacity) for i in idxs]
        best_t, best_obj, best_units = None, None, None
        # waiting for more units is allowed only against units some running (or starting)
        # action in this group will give back: its completion re-runs the decision. With
        # nothing busy in the group, at least one candidate starts (no idle strand).
        last = 0 if self.allow_wait and (running or others) else 1
        # what holds the pool when every other candidate starts: sorted once for every prefix
        base_all = (
            sorted(running + [(e, u) for _, e, u in others]),
            sum(e - now for _, e, _ in others),
        )
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
            obj = arr.total + self._rest(
                running,
                others,
                base_all,
                starting,
                idxs[t:],
                waiting_evicted[t:],
                rest_tail,
                cands,
                r,
                view,
                capacity,
                now,
            )
            if best_obj is not None and obj >= best_obj - 1e-12:
                break
            best_t, best_obj, best_units = t, obj, arr.units
        if best_t is None or best_units is None:  # cannot happen: the minimums fit
            raise Infeasible(f"{r}: no arrangement for the candidates")
        for j, i in enumerate(idxs[:best_t]):
            c = cands[i]
            c.units[r] = best_units[j]
            c.placement[r] = pool.place(best_units[j], node, (), _prefer(view, c.action, r))
        return idxs[best_t:]

    def _alone(
        self, view: ClusterView, pool: Pool, c: Candidate, r: str, node: str | None, cap: int
    ) -> bool:
        """One candidate that cannot get more units by waiting: placed at its fastest amount
        that fits, no split to search (True); False where waiting could get it more."""
        if self.allow_wait and cap != pool.capacity(node) and c.action.options[-1][0] > cap:
            return False
        m, best = 0, None
        for units, d in c.action.options:
            if units <= cap and (best is None or d < best):
                m, best = units, d
        c.units[r] = m
        c.placement[r] = pool.place(m, node, (), _prefer(view, c.action, r))
        return True

    def _rest(
        self,
        running: list[tuple[float, int]],
        others: list[tuple[int, float, int]],
        base_all: tuple[list[tuple[float, int]], float],
        starting: list[tuple[float, int]],
        gone: list[int],
        gone_waiting: list[Waiting],
        tail: list[Waiting],
        cands: list[Candidate],
        r: str,
        view: ClusterView,
        capacity: int,
        now: float,
    ) -> float:
        """Estimated completion sum of everything but the group's starting candidates when the
        group's candidates `gone` are put off: the other candidates on the pool that start now
        (ahead of the first put-off one, or let through by `hold_back`: a later candidate that
        would take the units it waits for waits too, as `_keep_place` will decide), and the
        estimate of everything that waits, in queue order."""
        if gone:
            first = gone[0]
            ahead = [(e, u) for i, e, u in others if i < first]
            later = [o for o in others if o[0] > first]
            a = cands[first].action
            target = _target(a, r, capacity)
            _, _, held = hold_back(running + ahead + starting, capacity, target, later, now)
        else:
            held = []
        if held:
            out = set(held)
            busy = running + starting
            total = 0.0
            for i, e, u in others:
                if i not in out:
                    busy.append((e, u))
                    total += e - now
            busy.sort()
        else:  # the common case: every other candidate starts (sorted once per group)
            base, total = base_all
            busy = sorted(base + starting)  # two sorted runs: a linear merge
        free = capacity - sum(u for _, u in busy)
        if gone:
            # put off, it waits for more units than are free now: the estimate may give it any
            # of those amounts (depth), never a smaller one it could have had now
            more = tuple(o for o in gone_waiting[0].options if o[0] > free)
            if not more:
                more = ((target, view.estimate(a, target)),)
            gone_waiting = [Waiting(more), *gone_waiting[1:]]
        waiting = gone_waiting
        if held:  # merge the held candidates into the put-off ones, in queue order
            merged = [(i, w) for i, w in zip(gone, gone_waiting)]
            merged += [(i, self._waiting(cands[i].action, r, view, capacity)) for i in held]
            merged.sort(key=lambda x: x[0])
            waiting = [w for _, w in merged]
        return total + estimate_waiting(
            busy, free, now, waiting + tail, self.depth, capacity, presorted=True
        )

    def _waiting(self, a: Action, r: str, view: ClusterView, capacity: int) -> Waiting:
        if a.options and a.key == r:
            if a.options[-1][0] <= capacity:
                return Waiting(a.options)
            return Waiting(tuple(o for o in a.options if o[0] <= capacity) or a.options[:1])
        return Waiting(((a.mins[r], view.estimate(a, None)),))

    def _contention(
        self,
        view: ClusterView,
        cands: list[Candidate],
        idxs: list[int],
        r: str,
        node: str | None,
        queue: Collection[Action],
        now: float,
    ):
        """What holds the group's pool besides the group: the running actions' (end, units),
        the other candidates' (index, end, units), and the queue behind the candidates."""
        running = [
            (max(ra.expected_end, now), ra.assignment.units[r]) for ra in view.running_on(r, node)
        ]
        others: list[tuple[int, float, int]] = []
        group = set(idxs)
        cand_ids = set()
        for i, c in enumerate(cands):
            cand_ids.add(c.action.id)
            if i in group or r not in c.units:
                continue
            if node is None or c.placement[r].node == node:
                a = c.action
                d = view.estimate(a, c.units[a.key] if a.key else None)
                others.append((i, now + d, c.units[r]))
        capacity = view.pools[r].capacity(node)
        tail: list[Waiting] = []
        if self.lookahead:
            # only the queue's classes that wait on this pool (and node): an indexed queue
            # walks just those, a plain one is filtered
            walk = (
                queue.scan(_never, only=((r, node), (r, None)))
                if isinstance(queue, ActionQueue)
                else queue
            )
            for a in walk:
                if a.id in cand_ids or r not in a.mins:
                    continue
                bound = view.node_for(a, r)
                if node is not None and bound is not None and bound != node:
                    continue
                tail.append(self._waiting(a, r, view, capacity))
                if len(tail) >= self.lookahead:
                    break
        return running, others, tail


def _tasks(cands: list[Candidate], idxs: list[int], cap: int) -> list[tuple]:
    """The DP's tasks: each candidate's (amounts, durations), cut to what `cap` can hold."""
    tasks = []
    for i in idxs:
        am, du = cands[i].action.option_arrays  # type: ignore[misc]
        if am[-1] > cap:
            keep = am <= cap
            am, du = am[keep], du[keep]
        tasks.append((am, du))
    return tasks

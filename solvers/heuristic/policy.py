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
from solvers.heuristic.putoff import elsewhere, hold_back, keep_place, start_now, wait_target
from tangram.actions import Action
from tangram.allocation import Assignment, ClusterView
from tangram.errors import Infeasible, ValidationError
from tangram.pools import Pool
from tangram.queue import ActionQueue

EPS = 1e-9


def _never(_: object) -> bool:
    return False


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
        for (r, node), group in groups.items():
            # a candidate an earlier group held back (it needs that group's pool too) waits
            # already, every unit it had given back: it is not arranged again
            idxs = [i for i in group if i not in evicted]
            if not idxs:
                continue
            gone = self._arrange(view, pools[r], cands, idxs, r, node, queue, now, evicted)
            while gone:
                first = gone[0]
                reservation, held = keep_place(
                    view, cands, evicted | set(gone), first, r, node, now
                )
                if reservation <= now + EPS:
                    # what it waits for is free now (once the later candidates it holds back
                    # give way): it starts now with them, the first of the rest waits next
                    late = start_now(view, pools, cands, first, held, r, node)
                    if late is not None:
                        evicted.update(late)
                        gone = gone[1:]
                        continue
                elif elsewhere(view, pools[r], cands[first], r, node):
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

    # -- one group -----------------------------------------------------------------------------
    def _arrange(
        self,
        view: ClusterView,
        pool: Pool,
        cands: list[Candidate],
        idxs: list[int],
        r: str,
        node: str | None,
        queue: Collection[Action],
        now: float,
        evicted: Collection[int] = (),
    ) -> list[int]:
        for i in idxs:
            pool.release(cands[i].placement[r], cands[i].units[r])
        cap = pool.free(node)
        if self._alone(view, pool, cands, idxs, r, node, cap):
            return []
        table = dp_table(_tasks(cands, idxs, cap), pool.operator(node))
        running, others, rest_tail, base_all = self._contention(
            view, cands, idxs, r, node, queue, now, evicted
        )
        capacity = pool.capacity(node)
        waiting_evicted = [self._waiting(cands[i].action, r, view, capacity) for i in idxs]
        best_t, best_obj, best_units = None, None, None
        # waiting for more units is allowed only against units some running (or starting)
        # action in this group will give back: its completion re-runs the decision. With
        # nothing busy in the group, at least one candidate starts (no idle strand).
        last = 0 if self.allow_wait and (running or others) else 1
        ends: dict[tuple[int, int], float] = {}  # (candidate, units) -> its end if it starts
        for t in range(len(idxs), last - 1, -1):
            try:
                arr = table.best(t)
            except Infeasible:
                continue
            starting = _starting(view, cands, idxs, arr.units, ends, now)
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
        self,
        view: ClusterView,
        pool: Pool,
        cands: list[Candidate],
        idxs: list[int],
        r: str,
        node: str | None,
        cap: int,
    ) -> bool:
        """A group of one candidate on a per-node pool that cannot get more units by waiting:
        placed at its fastest amount that fits, no split to search (True); False where waiting
        could get it more, or the group is not one candidate on a per-node pool."""
        if len(idxs) != 1 or not pool.per_node:
            return False
        c = cands[idxs[0]]
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
            target = wait_target(a, r, capacity)
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
        evicted: Collection[int] = (),
    ):
        """What holds the group's pool besides the group: the running actions' (end, units),
        the other candidates' (index, end, units), the queue behind the candidates, and what
        holds the pool when every other candidate starts (sorted once for every prefix) with
        those candidates' estimated completion sum."""
        running = [
            (max(ra.expected_end, now), ra.assignment.units[r]) for ra in view.running_on(r, node)
        ]
        others: list[tuple[int, float, int]] = []
        group = set(idxs)
        cand_ids = set()
        for i, c in enumerate(cands):
            if i in evicted:  # an earlier group's wait: it holds nothing, the tail counts it
                continue
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
        base_all = (
            sorted(running + [(e, u) for _, e, u in others]),
            sum(e - now for _, e, _ in others),
        )
        return running, others, tail, base_all


def _starting(
    view: ClusterView,
    cands: list[Candidate],
    idxs: list[int],
    units: tuple[int, ...],
    ends: dict[tuple[int, int], float],
    now: float,
) -> list[tuple[float, int]]:
    """(estimated end, units) of the group's candidates `idxs` starting now at `units`; `ends`
    keeps each (candidate, units) end across the prefixes of one group."""
    starting = []
    for i, u in zip(idxs, units):
        end = ends.get((i, u))
        if end is None:
            end = ends[i, u] = now + view.estimate(cands[i].action, u)
        starting.append((end, u))
    return starting


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

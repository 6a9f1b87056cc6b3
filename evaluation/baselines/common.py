"""Shared pieces of the baselines: FCFS at fixed amounts, and lifecycles that do nothing."""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from evaluation.params import src
from solvers.fcfs import ScratchPools, _prefer
from tangram.actions import Action
from tangram.allocation import Assignment, ClusterView, IdleByDesign
from tangram.errors import Infeasible
from tangram.pools import Placement, Pool

ALL = None


def fcfs_fixed(view: ClusterView, queue: Collection[Action],
               amounts: Callable[[Action], dict[str, int]],
               exclude: Callable[[Action, str], Collection[str]] | None = None,
               pools: Mapping[str, Pool] | None = None) -> list[Assignment]:
    """Start queued actions in order at exactly `amounts(action)`; an action that does not fit
    blocks its pools (its node, when bound) for every action behind it, as `solvers.fcfs`."""
    work = pools if pools is not None else ScratchPools(view.pools)
    blocked: dict[str, set[str] | None] = {}
    out = []
    for a in queue:
        units = amounts(a)
        ok = True
        for r in units:
            if r in blocked:
                b = blocked[r]
                node = view.node_for(a, r)
                if b is ALL or (node is not None and node in b):
                    ok = False
                    break
        placed: dict[str, Placement] = {}
        if ok:
            for r, k in units.items():
                skip = set(blocked.get(r) or ())
                if exclude is not None:
                    skip |= set(exclude(a, r))
                try:
                    placed[r] = work[r].place(k, view.node_for(a, r), skip, _prefer(view, a, r))
                except Infeasible:
                    ok = False
                    break
        if ok:
            out.append(Assignment(a, units, placed))
            continue
        for r, p in placed.items():
            work[r].release(p, units[r])
        for r in units:
            node = view.node_for(a, r)
            if node is None or not view.pools[r].per_node:
                blocked[r] = ALL
            elif blocked.get(r, set()) is not ALL:
                blocked.setdefault(r, set()).add(node)  # type: ignore[union-attr]
    return out


def at_most(action: Action, r: str, dop: int) -> int:
    """The largest allowed amount of r not above `dop` (the minimum when none is)."""
    fit = [m for m in action.demands[r].amounts if m <= dop]
    return fit[-1] if fit else action.demands[r].min


@dataclass
class NoLifecycle(IdleByDesign):
    """Baselines without trajectory-level state: environments start in `env_start_s` (the same
    container start as Tangram's, docs/calibration.md §2), nothing to release, no timers."""

    env_start_s: float = field(default=0.5, metadata=src(
        "docs/calibration.md §2: container start 0.25-0.57 s", 0.25, 0.57))

    def attach(self, pools, executors) -> None:
        pass

    def start(self, traj, now: float) -> float | None:
        return self.env_start_s

    def end(self, traj, now: float) -> None:
        pass

    def wakeup(self, now: float) -> float | None:
        return None


@dataclass
class Lifecycles:
    """Several lifecycles as one: the latest ready time, the earliest wake-up."""

    parts: Sequence

    def attach(self, pools, executors) -> None:
        for p in self.parts:
            p.attach(pools, executors)

    def start(self, traj, now):
        delays = [p.start(traj, now) for p in self.parts]
        return None if any(d is None for d in delays) else max(delays, default=0.0)

    def end(self, traj, now) -> None:
        for p in self.parts:
            p.end(traj, now)

    def wakeup(self, now):
        ws = [w for p in self.parts if (w := p.wakeup(now)) is not None]
        return min(ws, default=None)

"""Shared pieces of the baselines: the scheduler's FCFS scan at fixed amounts, and lifecycles
that do nothing."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from evaluation.params import src
from solvers.fcfs import ScratchPools, scan_candidates
from tangram.actions import Action
from tangram.allocation import Assignment, ClusterView, IdleByDesign


def fcfs_fixed(
    view: ClusterView,
    queue: Collection[Action],
    amounts: Callable[[Action], dict[str, int]],
    exclude: Callable[[Action, str], Collection[str]] | None = None,
) -> list[Assignment]:
    """Start queued actions in order at exactly `amounts(action)`: the scheduler's own FCFS
    scan (`solvers.fcfs.scan_candidates`, its blocking and passing rules) at fixed amounts,
    without waiting for resident copies (a baseline does not)."""
    found = scan_candidates(
        view, queue, ScratchPools(view.pools), amounts=amounts, exclude=exclude, advised=False
    )
    return [Assignment(c.action, c.units, c.placement) for c in found]


def at_most(action: Action, r: str, dop: int) -> int:
    """The largest allowed amount of r not above `dop` (the minimum when none is)."""
    fit = [m for m in action.demands[r].amounts if m <= dop]
    return fit[-1] if fit else action.demands[r].min


@dataclass
class NoLifecycle(IdleByDesign):
    """Baselines without trajectory-level state: environments start in `env_start_s` (the same
    container start as Tangram's, docs/calibration.md §2), nothing to release, no timers."""

    env_start_s: float = field(
        default=0.5, metadata=src("docs/calibration.md §2: container start 0.25-0.57 s", 0.25, 0.57)
    )

    def attach(self, pools, executors) -> None:
        pass

    def start(self, traj, now: float) -> float | None:
        return self.env_start_s

    def nodes(self, traj, now: float) -> dict[str, str]:
        return {}  # bound where its first action is placed (the baseline places it)

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

    def nodes(self, traj, now) -> dict[str, str]:
        out: dict[str, str] = {}
        for p in self.parts:
            out.update(p.nodes(traj, now))
        return out

    def end(self, traj, now) -> None:
        for p in self.parts:
            p.end(traj, now)

    def wakeup(self, now):
        ws = [w for p in self.parts if (w := p.wakeup(now)) is not None]
        return min(ws, default=None)

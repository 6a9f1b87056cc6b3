"""Tangram's API flow control in the simulator: the API manager's `AimdWindow`
(`managers.flow`) learning the simulated server's limit from its answers.

`LearnedLimits` wraps Tangram's policy: of the API calls the policy starts, only as many run as
the window allows (the rest stay queued, in order); the window hears every answer of the
simulated server (`evaluation.upstream`: a 429 with its `Retry-After` when a call starts over
the limit, a served call when it ends). `misconfigured` gives a workload whose API pools are
`factor` times the server's limit: Tangram started with a wrong limit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from evaluation.closedloop import EnvironmentStart, Lifecycle
from evaluation.upstream import ApiUpstream
from evaluation.workloads.base import Workload
from managers.flow import AimdWindow
from tangram.actions import Action
from tangram.allocation import Allocator, Assignment, ClusterView, IdleByDesign
from tangram.pools import FlatPool


@dataclass
class LearnedLimits(IdleByDesign):
    """An allocator and lifecycle: `inner`'s decisions, API calls held to the learned window.

    Holding a call while API units look free is this model's point (the window is below the
    pool's configured capacity), so it is marked `IdleByDesign`: the scheduler's
    work-conservation rule would start the held calls and model a Tangram without flow control.
    The runtime holds them after the grant instead (`managers.api`'s gate)."""

    inner: Allocator
    limits: Mapping[str, int]  # API resource -> the limit the window starts with
    life: Lifecycle = field(default_factory=EnvironmentStart)
    probe_after: int = 64
    windows: dict[str, AimdWindow] = field(default_factory=dict, init=False)

    def attach(self, pools, executors) -> None:
        self.life.attach(pools, executors)
        self.windows = {
            r: AimdWindow(k, self.probe_after, most=pools[r].capacity())
            for r, k in self.limits.items()
            if r in pools
        }
        for up in {id(e): e for e in executors.values() if isinstance(e, ApiUpstream)}.values():
            up.listeners.append(self._hear)

    def _hear(
        self, resource: str, refused: bool, in_flight: int, retry_after_s: float, now: float
    ) -> None:
        w = self.windows.get(resource)
        if w is None:
            return
        if refused:  # a 429 is answered at once: sent now
            w.refused_answer(now, in_flight, retry_after_s, now)
        else:
            w.answered(now)

    def allocate(
        self, view: ClusterView, queue: Collection[Action], now: float
    ) -> list[Assignment]:
        room = {
            r: w.allowed(now) - (view.pools[r].capacity() - view.pools[r].free())
            for r, w in self.windows.items()
            if r in view.pools
        }
        out = []
        for a in self.inner.allocate(view, queue, now):
            mine = [r for r in a.units if r in room]
            if any(room[r] <= 0 for r in mine):
                continue  # over the window: it stays queued
            for r in mine:
                room[r] -= 1
            out.append(a)
        return out

    def start(self, traj: Any, now: float) -> float | None:
        return self.life.start(traj, now)

    def nodes(self, traj: Any, now: float) -> dict[str, str]:
        return self.life.nodes(traj, now)

    def end(self, traj: Any, now: float) -> None:
        self.life.end(traj, now)

    def wakeup(self, now: float) -> float | None:
        """The end of a Retry-After pause: calls held by it may start then."""
        ws = [w.paused_until for w in self.windows.values() if w.paused_until > now]
        inner = self.life.wakeup(now)
        if inner is not None:
            ws.append(inner)
        return min(ws, default=None)


def misconfigured(w: Workload, factor: float) -> Workload:
    """`w` with its API pools `factor` times the server's limit (what Tangram is told)."""
    limits = dict(w.api_limits)
    base = w.make_pools

    def pools():
        out = base()
        for r, k in limits.items():
            out[r] = FlatPool(r, {"node0": max(1, round(factor * k))})
        return out

    return dataclasses.replace(w, make_pools=pools)

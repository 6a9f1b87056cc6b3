"""What a workload is: trajectories of (LLM generation, action) steps, the cluster they run on,
and the parameters that produced them, each with its source.

A trajectory is closed-loop: its next action is submitted only after its previous action has
completed plus the LLM generation time of the next turn (`Step.think_s`). The simulator in
`evaluation.closedloop` drives that loop; a generator only draws the numbers.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from evaluation.params import sources  # noqa: F401  (re-exported)
from tangram.actions import Action
from tangram.instance import ResourceSpec
from tangram.pools import Pool


@dataclass(frozen=True, slots=True)
class Step:
    """One turn: `think_s` of LLM generation, then `action` (its submit time set on arrival)."""

    think_s: float
    action: Action


@dataclass(frozen=True, slots=True)
class Trajectory:
    id: str
    task: str
    start: float
    steps: tuple[Step, ...]


@dataclass(frozen=True)
class Workload:
    """Trajectories plus a factory for the (fresh) pools they run on.

    `gpu` holds the GPU resource spec with its services when the workload calls model services
    (the simulator then models residency, LRU eviction and restore time).
    """

    name: str
    trajectories: tuple[Trajectory, ...]
    make_pools: Callable[[], dict[str, Pool]]
    params: Any
    gpu: ResourceSpec | None = None
    tasks: tuple[str, ...] = ()
    api_limits: Mapping[str, int] = field(default_factory=dict)  # per `api:*` pool: calls
    # its server allows in flight (the simulated upstream's limit; what Tangram is told too)

    @property
    def num_actions(self) -> int:
        return sum(len(t.steps) for t in self.trajectories)


def lognormal(
    rng: random.Random, median: float, sigma: float, cap: float | None = None, floor: float = 0.0
) -> float:
    """A lognormal draw given its median; clipped to [floor, cap]."""
    v = median * math.exp(rng.gauss(0.0, sigma))
    if cap is not None:
        v = min(v, cap)
    return max(v, floor)


def lognormal_mean(
    rng: random.Random, mean: float, sigma: float, cap: float | None = None
) -> float:
    """A lognormal draw given its mean (median = mean / exp(sigma^2 / 2))."""
    return lognormal(rng, mean / math.exp(sigma * sigma / 2), sigma, cap)


def sigma_from_p95(median: float, p95: float) -> float:
    return math.log(p95 / median) / 1.6449

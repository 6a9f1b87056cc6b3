"""Seeded random small instances (instance-file documents) for the bench and the gap study.

Classes: pool `flat` (8 interchangeable units) or `chunks` (GPU nodes of 8); arrivals `spread`
(uniform over a window), `bursty` (a few bursts of simultaneous arrivals) or `batch` (all at
time 0: nothing to forecast, so a policy's gap is its approximation alone). About half the
actions are elastic, with Amdahl efficiency `E(m) = 1 / (1 + s (m - 1))`
(`tangram.profiles.amdahl_efficiency`); the rest have a fixed duration and a fixed small demand.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from tangram.profiles import amdahl_efficiency

POOLS = ("flat", "chunks")
ARRIVALS = ("spread", "bursty", "batch")


@dataclass(frozen=True, slots=True)
class InstanceClass:
    pool: str
    arrivals: str
    size: int

    @property
    def name(self) -> str:
        return f"{self.pool}/{self.arrivals}"


def _arrivals(rng: random.Random, n: int, kind: str) -> list[float]:
    if kind == "batch":
        return [0.0] * n
    if kind == "spread":
        return sorted(round(rng.uniform(0, 2.0 * n), 1) for _ in range(n))
    bursts = [round(rng.uniform(0, 2.0 * n), 1) for _ in range(max(1, n // 4))]
    return sorted(rng.choice(bursts) for _ in range(n))


def _action(rng: random.Random, i: int, res: str, arrival: float) -> dict[str, Any]:
    if rng.random() < 0.5:
        amounts = [1, 2, 4, 8]
        s = rng.uniform(0.05, 0.5)
        return {
            "id": f"a{i}",
            "arrival": arrival,
            "key": res,
            "demand": {res: amounts},
            "t_ori": round(rng.uniform(2.0, 20.0), 1),
            "efficiency": {str(m): amdahl_efficiency(m, s) for m in amounts},
        }
    return {
        "id": f"a{i}",
        "arrival": arrival,
        "demand": {res: rng.choice([1, 1, 2, 4])},
        "duration": round(rng.uniform(0.5, 5.0), 1),
    }


def random_instance_doc(
    cls: InstanceClass, seed: int, units: int = 8, gpu_nodes: int = 1
) -> dict[str, Any]:
    """A reproducible instance document of class `cls` (parse with `parse_instance`)."""
    rng = random.Random(f"{cls.pool}/{cls.arrivals}/{cls.size}/{seed}")
    if cls.pool == "flat":
        resources = {"cpu": {"topology": "flat", "units": units}}
        res = "cpu"
    else:
        resources = {"gpu": {"topology": "chunks", "nodes": gpu_nodes, "gpus_per_node": units}}
        res = "gpu"
    arrivals = _arrivals(rng, cls.size, cls.arrivals)
    return {
        "resources": resources,
        "actions": [_action(rng, i, res, t) for i, t in enumerate(arrivals)],
    }

"""The four workloads of Fig. 6 and Fig. 7, each under Tangram and under its paper baseline
(§7): AI coding vs Kubernetes (a 4-core pod per trajectory), DeepSearch vs per-trajectory API
calls with retries and 5 static judge replicas, MOPD vs 9 statically deployed teachers (4 GPUs
each, SGLang), MOPD + Search vs 10 static services of 4 GPUs each."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from evaluation.closedloop import LoopResult, Policy
from evaluation.experiments.common import (
    Runner,
    kubernetes,
    search_baseline,
    static_gpu,
    static_policy,
    tangram,
    workload,
)
from evaluation.workloads import Workload

# per workload: (quick size, full size)
SIZES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "coding": ({"batch": 128, "nodes": 1, "cores_per_node": 128},
               {"batch": 1024, "nodes": 4, "cores_per_node": 256}),
    "deepsearch": ({"batch": 96}, {"batch": 384}),
    "mopd": ({"batch": 256}, {"batch": 1024}),
    "mopd+search": ({"batch": 96}, {"batch": 384}),
}

ADMISSION = "admission"  # the pseudo-kind of a trajectory's wait for its environment
# what Fig. 7 splits each trajectory's ACT into: part -> action kinds; every workload's
# trajectories also wait for their environment (`ADMISSION`), reported as its own part
PARTS = {
    "coding": {"environment": ("tool",), "reward": ("reward",)},
    "deepsearch": {"api": ("search", "browse"), "reward": ("judge",)},
    "mopd": {"teacher": ("logprob",)},
    "mopd+search": {"teacher": ("logprob",), "api": ("search", "browse"), "reward": ("judge",)},
}


@dataclass
class SuiteRun:
    workload: Workload
    policy: Policy
    result: LoopResult

    def part(self, kinds: tuple[str, ...]) -> float:
        """Seconds per trajectory of the actions of `kinds` (`ADMISSION`: the wait for its
        environment, a pod pending and starting or a container starting)."""
        r = self.result
        trajs = max(1, len(r.spans))
        total = sum(sum(r.acts(k)) for k in kinds if k != ADMISSION)
        if ADMISSION in kinds:
            total += sum(b - a for a, b in r.setups.values())
        return total / trajs

    def rejections(self) -> int:
        """429 answers counted at the simulated API server: calls over its limit, and the
        retrying clients' attempts it refused (`evaluation.upstream`)."""
        return int(self.result.counters.get("api_429", 0))


def systems(name: str, w: Workload) -> list[Policy]:
    if name == "coding":
        return [tangram(), kubernetes()]
    if name == "deepsearch":
        return [tangram(), search_baseline(w, static_gpu(["judge"], w, 1, replicas=5))]
    if name == "mopd":
        teachers = sorted(w.gpu.services) if w.gpu else []
        return [tangram(), static_policy("static", static_gpu(teachers, w, 4))]
    services = sorted(w.gpu.services) if w.gpu else []
    judge = static_gpu(services, w, 4)
    return [tangram(), search_baseline(w, judge)]


def run_one(name: str, quick: bool, runner: Runner) -> list[SuiteRun]:
    w = workload(name, **SIZES[name][0 if quick else 1])
    return [SuiteRun(w, p, runner.run(name, w, p)) for p in systems(name, w)]


def run_suite(quick: bool, runner: Runner,
              names: tuple[str, ...] = tuple(SIZES)) -> dict[str, list[SuiteRun]]:
    return {name: run_one(name, quick, runner) for name in names}


def suite_runs() -> int:
    return 2 * len(SIZES)


def breakdown_rows(suite: dict[str, list[SuiteRun]]) -> list[dict[str, Any]]:
    rows = []
    for name, runs in suite.items():
        for sr in runs:
            for part, kinds in {**PARTS[name], ADMISSION: (ADMISSION,)}.items():
                rows.append({"workload": name, "system": sr.policy.name, "part": part,
                             "seconds_per_trajectory": round(sr.part(kinds), 3)})
    return rows

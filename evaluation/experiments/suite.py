"""The four workloads of Fig. 6 and Fig. 7, each under Tangram and under its paper baseline
(§7): AI coding vs Kubernetes (a 4-core pod per trajectory), DeepSearch vs per-trajectory API
calls with retries and static judge replicas on the same 8 GPUs Tangram gets (the paper: 5 x 1
GPU), MOPD vs 9 statically deployed teachers (4 GPUs each, SGLang), MOPD + Search vs 10 static
services of 4 GPUs each. Every static replica batches concurrent calls, as SGLang does
(`evaluation.baselines.batching`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from evaluation.baselines import StaticServices
from evaluation.closedloop import LoopResult, Policy
from evaluation.experiments.common import (
    Runner,
    batching_static,
    kubernetes,
    search_baseline,
    tangram,
    workload,
)
from evaluation.workloads import Workload

# per workload: (quick size, full size)
SIZES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "coding": (
        {"batch": 128, "nodes": 1, "cores_per_node": 128},
        {"batch": 1024, "nodes": 4, "cores_per_node": 256},
    ),
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


JUDGES = 8  # DeepSearch's static judge replicas, 1 GPU each: the 8 GPUs Tangram gets


def systems(name: str, w: Workload) -> list[tuple[Workload, Policy]]:
    """(the workload each runs, Tangram's policy / the baseline's): a batching baseline runs on
    the lane copy of the GPU pool (`batching_static`)."""
    if name == "coding":
        return [(w, tangram()), (w, kubernetes())]
    if name == "mopd":
        teachers = sorted(w.gpu.services) if w.gpu else []
        return [(w, tangram()), batching_static("static", teachers, w, 4)]
    services, gpus, replicas = (
        (["judge"], 1, JUDGES)
        if name == "deepsearch"
        else (sorted(w.gpu.services) if w.gpu else [], 4, 1)
    )
    wide, judge = batching_static("static", services, w, gpus, replicas)
    assert isinstance(judge.allocator, StaticServices)
    return [(w, tangram()), (wide, search_baseline(wide, judge.allocator, judge.executors))]


def run_one(name: str, quick: bool, runner: Runner) -> list[SuiteRun]:
    w = workload(name, **SIZES[name][0 if quick else 1])
    return [SuiteRun(x, p, runner.run(name, x, p)) for x, p in systems(name, w)]


def run_suite(
    quick: bool, runner: Runner, names: tuple[str, ...] = tuple(SIZES)
) -> dict[str, list[SuiteRun]]:
    return {name: run_one(name, quick, runner) for name in names}


def suite_runs() -> int:
    return 2 * len(SIZES)


def breakdown_rows(suite: dict[str, list[SuiteRun]]) -> list[dict[str, Any]]:
    rows = []
    for name, runs in suite.items():
        for sr in runs:
            for part, kinds in {**PARTS[name], ADMISSION: (ADMISSION,)}.items():
                rows.append(
                    {
                        "workload": name,
                        "system": sr.policy.name,
                        "part": part,
                        "seconds_per_trajectory": round(sr.part(kinds), 3),
                    }
                )
    return rows

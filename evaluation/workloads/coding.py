"""AI coding (SWE-bench-like, GRPO): turns of LLM generation and short CPU tool calls in the
trajectory's sandbox, ending in an elastic test run that computes the reward (paper §7 setup).

Calibrated so that, with every action at its minimum demand and no queueing, a trajectory is
active (an action of it running) about 47% of its life, as the paper measured (§2, Fig. 3c).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from evaluation.params import assumed, setting, src
from evaluation.workloads.base import Step, Trajectory, Workload, lognormal, lognormal_mean
from tangram.actions import Action, Elasticity
from tangram.pools import CorePool
from tangram.profiles import amdahl_efficiency
from topology import CpuNode


@dataclass(frozen=True)
class CodingParams:
    batch: int = field(
        default=256,
        metadata=src("paper §7: RL batch sizes 256-2048 (Fig. 8); swept as a size", 128, 2048),
    )
    nodes: int = field(
        default=2,
        metadata=assumed(
            "paper §7 had 15 CPU nodes; scaled down with the batch; swept as a size", 1, 15
        ),
    )
    cores_per_node: int = field(default=256, metadata=src("paper §7: 256 cores per CPU node"))
    turns_mean: float = field(
        default=30.0,
        metadata=src(
            "docs/calibration.md §4: turns lognormal, mean 30 (datasets' means 16.1-64.3)",
            16.1,
            64.3,
        ),
    )
    turns_sigma: float = field(default=0.5, metadata=assumed("spread of turns", 0.3, 0.8))
    turns_cap: int = field(default=100, metadata=src("docs/calibration.md §4 defaults: cap 100"))
    tool_median_s: float = field(
        default=0.5,
        metadata=src(
            "docs/calibration.md §4: tool execution median 0.5 s (0.25-0.8 s per call)", 0.25, 0.8
        ),
    )
    tool_sigma: float = field(
        default=1.0, metadata=src("docs/calibration.md §4 defaults: sigma about 1")
    )
    tool_cap_s: float = field(default=60.0, metadata=assumed("tool-call timeout", 30.0, 300.0))
    exec_overhead_s: float = field(
        default=0.07,
        metadata=src(
            "docs/calibration.md §2: docker exec round trip p50 67 ms (64-73 ms), in every system",
            0.064,
            0.073,
        ),
    )
    reward_median_s: float = field(
        default=60.0,
        metadata=src(
            "docs/calibration.md §4: reward test run median 60 s; sympy gold patch 77 s", 45.0, 77.0
        ),
    )
    reward_sigma: float = field(default=0.8, metadata=assumed("spread of test runs", 0.5, 1.2))
    reward_cap_s: float = field(
        default=1800.0, metadata=src("docs/calibration.md §4: swebench evaluation timeout 1800 s")
    )
    serial_fraction: float = field(
        default=0.25,
        metadata=src(
            "docs/calibration.md §4: pytest-xdist Amdahl serial fraction 0.25 (fitted 0.15-0.3)",
            0.15,
            0.3,
        ),
    )
    spawn_s: float = field(
        default=0.05,
        metadata=src(
            "docs/calibration.md §4: xdist workers spawn sequentially, 0.04-0.05 s each", 0.04, 0.05
        ),
    )
    reward_dops: tuple[int, ...] = field(
        default=(1, 2, 4, 8, 16, 32),
        metadata=assumed(
            "pytest -n over powers of two, up to 16-64 workers",
            (1, 2, 4, 8, 16),  # type: ignore
            (1, 2, 4, 8, 16, 32, 64),
        ),
    )  # type: ignore[arg-type]
    output_tokens_mean: float = field(
        default=230.0,
        metadata=src(
            "docs/calibration.md §6: SWE agent output tokens per call, mean about 230 (130-430)",
            130.0,
            430.0,
        ),
    )
    output_tokens_sigma: float = field(
        default=0.5, metadata=assumed("spread of output tokens per call", 0.3, 0.8)
    )
    decode_tok_s: float = field(
        default=56.0,
        metadata=src(
            "docs/calibration.md §6 band 50-80 tok/s; 56 gives the paper's 47% active share "
            "(Fig. 3c)",
            50.0,
            80.0,
        ),
    )
    start_spread_s: float = field(
        default=0.0,
        metadata=assumed(
            "the batch's trajectories start together (one rollout step), or within 30 s", 0.0, 30.0
        ),
    )
    seed: int = field(default=0, metadata=setting("random seed"))


def reward_elasticity(p: CodingParams, t_ori: float) -> Elasticity:
    eff = {m: amdahl_efficiency(m, p.serial_fraction, t_ori, p.spawn_s) for m in p.reward_dops}
    return Elasticity("cpu", t_ori, eff)


def _trajectory(p: CodingParams, rng: random.Random, i: int) -> Trajectory:
    tid = f"code{i}"
    turns = max(1, min(p.turns_cap, round(lognormal_mean(rng, p.turns_mean, p.turns_sigma))))
    steps = []
    for j in range(turns):
        tokens = lognormal_mean(rng, p.output_tokens_mean, p.output_tokens_sigma)
        dur = lognormal(rng, p.tool_median_s, p.tool_sigma, p.tool_cap_s, floor=0.01)
        steps.append(
            Step(
                tokens / p.decode_tok_s,
                Action(
                    f"{tid}.t{j}",
                    {"cpu": 1},
                    duration=dur + p.exec_overhead_s,
                    trajectory=tid,
                    task="coding",
                    kind="tool",
                ),
            )
        )
    t_ori = lognormal(rng, p.reward_median_s, p.reward_sigma, p.reward_cap_s, floor=1.0)
    steps.append(
        Step(
            0.0,
            Action(
                f"{tid}.reward",
                {"cpu": list(p.reward_dops)},
                elasticity=reward_elasticity(p, t_ori),
                trajectory=tid,
                task="coding",
                kind="reward",
            ),
        )
    )
    return Trajectory(tid, "coding", rng.uniform(0, p.start_spread_s), tuple(steps))


def coding_pools(nodes: int, cores_per_node: int):
    def make():
        return {
            "cpu": CorePool(
                "cpu", {f"cpu{n}": CpuNode.flat(f"cpu{n}", cores_per_node) for n in range(nodes)}
            )
        }

    return make


def coding(params: CodingParams | None = None, **overrides) -> Workload:
    p = params or CodingParams(**overrides)
    rng = random.Random(p.seed)
    trajs = tuple(_trajectory(p, rng, i) for i in range(p.batch))
    return Workload("coding", trajs, coding_pools(p.nodes, p.cores_per_node), p, tasks=("coding",))

"""Workloads calling GPU model services: DeepSearch (search/browse APIs, an LLM-judge reward),
MOPD (teachers computing log-probs, bursty across teachers) and MOPD + Search on one GPU pool.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from evaluation.params import assumed, setting, src
from evaluation.workloads.base import (
    Step,
    Trajectory,
    Workload,
    lognormal,
    lognormal_mean,
    sigma_from_p95,
)
from tangram.actions import Action, Elasticity
from tangram.instance import ResourceSpec, ServiceSpec
from tangram.pools import FlatPool

GPU_DOPS = (1, 2, 4, 8)


def restore_s(memory_gb: float, bandwidth_gbps: float = 50.0, wake_s: float = 0.3) -> float:
    """docs/calibration.md §3 default: wake = bytes / 50 GB/s + 0.3 s."""
    return memory_gb / bandwidth_gbps + wake_s


def tp_elasticity(t_ori: float, eff: dict[int, float], at_8: float | None = None) -> Elasticity:
    """E(k) from the shape `eff`, bent so that E(8) = `at_8` (E(k) ** (ln at_8 / ln eff[8]))."""
    g = 1.0 if at_8 is None else math.log(at_8) / math.log(eff[8])
    return Elasticity("gpu", t_ori, {m: eff[m] ** g for m in GPU_DOPS})


@dataclass(frozen=True)
class SearchParams:
    batch: int = field(
        default=128, metadata=src("paper §7: RL batch sizes; swept as a size", 32, 2048)
    )
    calls_mean: float = field(
        default=15.0,
        metadata=src(
            "docs/calibration.md §5 defaults: 10-20 search calls per trajectory", 10.0, 20.0
        ),
    )
    calls_sigma: float = field(default=0.5, metadata=assumed("spread of calls", 0.3, 0.8))
    calls_cap: int = field(default=64, metadata=src("docs/calibration.md §5 defaults: cap 64-128"))
    browse_share: float = field(default=0.4, metadata=assumed("share of browse calls", 0.2, 0.6))
    search_median_s: float = field(
        default=0.7,
        metadata=src(
            "docs/calibration.md §5 defaults: API latency median 0.7 s (Serper p50 637 ms)"
        ),
    )
    search_p95_s: float = field(
        default=1.4, metadata=src("docs/calibration.md §5 defaults: p95 1.4 s")
    )
    browse_median_s: float = field(
        default=1.5, metadata=assumed("browse/PDF parsing about twice a search", 1.0, 3.0)
    )
    search_qps: float = field(
        default=5.0,
        metadata=src(
            "docs/calibration.md §5: rate limit 5-50 QPS per key (Serper free tier 5)", 5.0, 50.0
        ),
    )
    browse_qps: float = field(
        default=2.0, metadata=src("docs/calibration.md §5: free tiers 1-5 req/s", 1.0, 5.0)
    )
    output_tokens_mean: float = field(
        default=1500.0,
        metadata=assumed(
            "between docs/calibration.md §6's 250 (no thinking) and 3k (thinking)", 250.0, 3000.0
        ),
    )
    decode_tok_s: float = field(
        default=65.0, metadata=src("docs/calibration.md §6: 50-80 tok/s", 50.0, 80.0)
    )
    judge_s: float = field(
        default=2.0,
        metadata=assumed(
            "one judge call (prefill about 2k tokens + short answer) on 1 GPU", 1.0, 4.0
        ),
    )
    judge_eff_8: float = field(
        default=0.4,
        metadata=assumed(
            "tensor-parallel efficiency of the judge on 8 GPUs (decode-heavy)", 0.25, 0.7
        ),
    )
    judge_weights_gb: float = field(
        default=61.0,
        metadata=src(
            "paper: fine-tuned GPT-OSS-120B judge; HF openai/gpt-oss-120b: about 61 GB MXFP4"
        ),
    )
    kv_gb: float = field(
        default=8.0, metadata=assumed("KV cache reserved per GPU per resident service", 4.0, 12.0)
    )
    gpu_nodes: int = field(default=1, metadata=assumed("one 8-GPU node for the judge", 1, 2))
    gpu_memory_gb: float = field(default=80.0, metadata=src("NVIDIA H100 SXM: 80 GB"))
    start_spread_s: float = field(
        default=10.0,
        metadata=assumed("trajectories of the step admitted over the first seconds", 0.0, 60.0),
    )
    seed: int = field(default=0, metadata=setting("random seed"))

    def slots(self, qps: float, median_s: float) -> int:
        """API limit as a concurrency (Little's law: QPS x latency), an assumption."""
        return max(1, round(qps * median_s))


# shapes of tensor-parallel efficiency (assumed; E(8) is swept: judge_eff_8, teacher_eff_8)
JUDGE_EFF = {1: 1.0, 2: 0.8, 4: 0.6, 8: 0.4}  # decode-heavy
TEACHER_EFF = {1: 1.0, 2: 0.9, 4: 0.8, 8: 0.65}  # prefill


def _search_trajs(
    p: SearchParams, rng: random.Random, prefix: str = "ds", task: str = "search"
) -> list[Trajectory]:
    sig = sigma_from_p95(p.search_median_s, p.search_p95_s)
    out = []
    for i in range(p.batch):
        tid = f"{prefix}{i}"
        n = max(1, min(p.calls_cap, round(lognormal_mean(rng, p.calls_mean, p.calls_sigma))))
        steps = []
        for j in range(n):
            think = lognormal_mean(rng, p.output_tokens_mean, 0.5) / p.decode_tok_s
            if rng.random() < p.browse_share:
                act = Action(
                    f"{tid}.b{j}",
                    {"api:browse": 1},
                    duration=lognormal(rng, p.browse_median_s, sig, 30.0, 0.05),
                    trajectory=tid,
                    task=task,
                    kind="browse",
                )
            else:
                act = Action(
                    f"{tid}.s{j}",
                    {"api:search": 1},
                    duration=lognormal(rng, p.search_median_s, sig, 30.0, 0.05),
                    trajectory=tid,
                    task=task,
                    kind="search",
                )
            steps.append(Step(think, act))
        t_ori = lognormal(rng, p.judge_s, 0.3, None, 0.2)
        steps.append(
            Step(
                lognormal_mean(rng, p.output_tokens_mean, 0.5) / p.decode_tok_s,
                Action(
                    f"{tid}.judge",
                    {"gpu": list(GPU_DOPS)},
                    elasticity=tp_elasticity(t_ori, JUDGE_EFF, p.judge_eff_8),
                    trajectory=tid,
                    task=task,
                    kind="judge",
                    service="judge",
                ),
            )
        )
        out.append(Trajectory(tid, task, rng.uniform(0, p.start_spread_s), tuple(steps)))
    return out


def api_limits(p: SearchParams) -> dict[str, int]:
    """What the API servers allow in flight (the limit Tangram's API pools are given too)."""
    return {
        "api:search": p.slots(p.search_qps, p.search_median_s),
        "api:browse": p.slots(p.browse_qps, p.browse_median_s),
    }


def _pools(p_api: SearchParams | None, gpu: ResourceSpec):
    def make():
        pools = {"gpu": gpu.build_pool()}
        if p_api is not None:
            pools["api:search"] = FlatPool(
                "api:search", {"node0": p_api.slots(p_api.search_qps, p_api.search_median_s)}
            )
            pools["api:browse"] = FlatPool(
                "api:browse", {"node0": p_api.slots(p_api.browse_qps, p_api.browse_median_s)}
            )
        return pools

    return make


def _gpu_spec(
    nodes: int, memory_gb: float, services: dict[str, tuple[float, float]]
) -> ResourceSpec:
    """Each service as (weights GB, KV cache GB per GPU): a k-GPU copy holds weights / k plus
    the KV cache on each GPU and restores them in parallel (one link per GPU)."""
    return ResourceSpec(
        "gpu",
        "chunks",
        nodes=nodes,
        gpus_per_node=8,
        memory_gb=memory_gb,
        services={
            s: ServiceSpec(kv, restore_s(w + kv), weights_gb=w) for s, (w, kv) in services.items()
        },
    )


def deepsearch(params: SearchParams | None = None, **overrides) -> Workload:
    p = params or SearchParams(**overrides)
    rng = random.Random(p.seed)
    gpu = _gpu_spec(p.gpu_nodes, p.gpu_memory_gb, {"judge": (p.judge_weights_gb, p.kv_gb)})
    return Workload(
        "deepsearch",
        tuple(_search_trajs(p, rng)),
        _pools(p, gpu),
        p,
        gpu,
        api_limits=api_limits(p),
        tasks=("search",),
    )


@dataclass(frozen=True)
class MopdParams:
    batch: int = field(
        default=256,
        metadata=src("paper §7: RL batch sizes 256-2048 (Fig. 8); swept as a size", 64, 2048),
    )
    teachers: int = field(default=9, metadata=src("paper §7: 9 teacher models in the baseline"))
    burst_orders: float = field(
        default=3.0,
        metadata=src(
            "paper §2: call volume across teachers differs by up to three orders of magnitude",
            1.0,
            3.0,
        ),
    )
    phase_s: float = field(
        default=30.0,
        metadata=assumed(
            "how often the popular teachers change (the tasks' rollouts drift)", 10.0, 120.0
        ),
    )
    teacher_weights_gb: float = field(
        default=65.5,
        metadata=src(
            "Qwen3-32B (32.8B parameters) in BF16, the 32B teacher docs/calibration.md §7 "
            "calibrates prefill for",
            16.0,
            65.5,
        ),
    )
    teacher_eff_8: float = field(
        default=0.65,
        metadata=assumed("tensor-parallel prefill efficiency of a teacher on 8 GPUs", 0.45, 0.85),
    )
    kv_gb: float = field(
        default=8.0,
        metadata=assumed(
            "KV cache per GPU: a 16k-token sequence of a 32B GQA model is about 4 GB", 4.0, 12.0
        ),
    )
    seq_tokens_mean: float = field(
        default=16000.0,
        metadata=src(
            "docs/calibration.md §7: 32B teacher, 16k tokens about 2-3 s on 1 GPU", 8000.0, 32000.0
        ),
    )
    prefill_tok_s: float = field(
        default=7000.0,
        metadata=src(
            "docs/calibration.md §7 defaults: prefill 6-8k tok/s per GPU (32B)", 6000.0, 8000.0
        ),
    )
    gen_tokens_mean: float = field(
        default=3000.0,
        metadata=src("docs/calibration.md §6: reasoning about 3k output tokens per turn"),
    )
    decode_tok_s: float = field(
        default=65.0, metadata=src("docs/calibration.md §6: 50-80 tok/s", 50.0, 80.0)
    )
    turns: int = field(
        default=2,
        metadata=assumed("turns per MOPD trajectory, each ending in a log-prob call", 1, 4),
    )
    start_spread_s: float = field(
        default=60.0,
        metadata=assumed("async rollout admits trajectories over the first minute", 10.0, 120.0),
    )
    gpu_nodes: int = field(default=5, metadata=src("paper §7: 5 GPU nodes x 8 GPUs"))
    gpu_memory_gb: float = field(default=80.0, metadata=src("NVIDIA H100 SXM: 80 GB"))
    seed: int = field(default=0, metadata=setting("random seed"))


def teacher_weights(p: MopdParams, rng: random.Random) -> list[float]:
    """Popularity spanning `burst_orders` orders of magnitude, in a random order."""
    n = p.teachers
    w = [10 ** (-p.burst_orders * i / max(1, n - 1)) for i in range(n)]
    rng.shuffle(w)
    return w


def _mopd_trajs(p: MopdParams, rng: random.Random, prefix: str = "mopd") -> list[Trajectory]:
    phases: dict[int, list[float]] = {}
    out = []
    for i in range(p.batch):
        tid = f"{prefix}{i}"
        start = rng.uniform(0, p.start_spread_s)
        t = start
        steps = []
        for j in range(p.turns):
            think = lognormal_mean(rng, p.gen_tokens_mean, 0.6) / p.decode_tok_s
            t += think
            ph = int(t // p.phase_s)
            if ph not in phases:
                phases[ph] = teacher_weights(p, rng)
            teacher = rng.choices(range(p.teachers), weights=phases[ph])[0]
            t_ori = lognormal_mean(rng, p.seq_tokens_mean, 0.5) / p.prefill_tok_s
            steps.append(
                Step(
                    think,
                    Action(
                        f"{tid}.lp{j}",
                        {"gpu": list(GPU_DOPS)},
                        elasticity=tp_elasticity(t_ori, TEACHER_EFF, p.teacher_eff_8),
                        trajectory=tid,
                        task="mopd",
                        kind="logprob",
                        service=f"teacher{teacher}",
                    ),
                )
            )
            t += t_ori
        out.append(Trajectory(tid, "mopd", start, tuple(steps)))
    return out


def _teachers(p: MopdParams) -> dict[str, tuple[float, float]]:
    return {f"teacher{i}": (p.teacher_weights_gb, p.kv_gb) for i in range(p.teachers)}


def mopd(params: MopdParams | None = None, **overrides) -> Workload:
    p = params or MopdParams(**overrides)
    rng = random.Random(p.seed)
    gpu = _gpu_spec(p.gpu_nodes, p.gpu_memory_gb, _teachers(p))
    return Workload("mopd", tuple(_mopd_trajs(p, rng)), _pools(None, gpu), p, gpu, tasks=("mopd",))


def mopd_search(
    mopd_params: MopdParams | None = None,
    search_params: SearchParams | None = None,
    batch: int | None = None,
    gpu_nodes: int | None = None,
    seed: int = 0,
) -> Workload:
    """Both tasks at once on one GPU pool (paper: 10 reward services; 9 teachers + judge)."""
    mp = mopd_params or MopdParams(seed=seed)
    sp = search_params or SearchParams(seed=seed + 1)
    if batch is not None:
        mp = MopdParams(**{**mp.__dict__, "batch": batch})
        sp = SearchParams(**{**sp.__dict__, "batch": batch})
    nodes = gpu_nodes or mp.gpu_nodes
    rng = random.Random(seed)
    trajs = _mopd_trajs(mp, rng) + _search_trajs(sp, rng)
    gpu = _gpu_spec(
        nodes, mp.gpu_memory_gb, {**_teachers(mp), "judge": (sp.judge_weights_gb, sp.kv_gb)}
    )
    return Workload(
        "mopd+search",
        tuple(trajs),
        _pools(sp, gpu),
        (mp, sp),
        gpu,
        api_limits=api_limits(sp),
        tasks=("mopd", "search"),
    )

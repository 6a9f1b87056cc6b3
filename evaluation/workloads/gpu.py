"""Workloads calling GPU model services: DeepSearch (search/browse APIs, an LLM-judge reward),
MOPD (teachers computing log-probs, bursty across teachers) and MOPD + Search on one GPU pool.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from evaluation.workloads.base import (
    Step,
    Trajectory,
    Workload,
    lognormal,
    lognormal_mean,
    sigma_from_p95,
    src,
)
from evaluation.workloads.registry import register
from tangram.actions import Action, Elasticity
from tangram.instance import ResourceSpec, ServiceSpec
from tangram.pools import FlatPool

GPU_DOPS = (1, 2, 4, 8)


def restore_s(memory_gb: float, bandwidth_gbps: float = 50.0, wake_s: float = 0.3) -> float:
    """docs/calibration.md §3 default: wake = bytes / 50 GB/s + 0.3 s."""
    return memory_gb / bandwidth_gbps + wake_s


def tp_elasticity(t_ori: float, eff: dict[int, float]) -> Elasticity:
    return Elasticity("gpu", t_ori, {m: eff[m] for m in GPU_DOPS})


@dataclass(frozen=True)
class SearchParams:
    batch: int = field(default=128, metadata=src("experiment setting"))
    calls_mean: float = field(default=15.0, metadata=src(
        "docs/calibration.md §5 defaults: 10-20 search calls per trajectory"))
    calls_sigma: float = field(default=0.5, metadata=src("assumption"))
    calls_cap: int = field(default=64, metadata=src("docs/calibration.md §5 defaults: cap 64-128"))
    browse_share: float = field(default=0.4, metadata=src("assumption: share of browse calls"))
    search_median_s: float = field(default=0.7, metadata=src(
        "docs/calibration.md §5 defaults: API latency median 0.7 s"))
    search_p95_s: float = field(default=1.4, metadata=src("docs/calibration.md §5: p95 1.4 s"))
    browse_median_s: float = field(default=1.5, metadata=src(
        "assumption: browse/PDF parsing twice a search"))
    search_qps: float = field(default=5.0, metadata=src(
        "docs/calibration.md §5: rate limit 5-50 QPS per key (Serper free tier 5)"))
    browse_qps: float = field(default=2.0, metadata=src("docs/calibration.md §5: free tiers 1-5/s"))
    output_tokens_mean: float = field(default=1500.0, metadata=src(
        "assumption between docs/calibration.md §6's 250 (no thinking) and 3k (thinking)"))
    decode_tok_s: float = field(default=65.0, metadata=src("docs/calibration.md §6: 50-80 tok/s"))
    judge_s: float = field(default=2.0, metadata=src(
        "assumption: one judge call (prefill about 2k tokens + short answer) on 1 GPU"))
    judge_memory_gb: float = field(default=60.0, metadata=src(
        "paper: fine-tuned GPT-OSS-120B judge; about 61 GB MXFP4 weights"))
    gpu_nodes: int = field(default=1, metadata=src("assumption: one 8-GPU node for the judge"))
    gpu_memory_gb: float = field(default=80.0, metadata=src("H100 80 GB"))
    start_spread_s: float = field(default=10.0, metadata=src("assumption"))
    seed: int = field(default=0, metadata=src("experiment setting"))

    def slots(self, qps: float, median_s: float) -> int:
        """API limit as a concurrency (Little's law: QPS x latency), an assumption."""
        return max(1, round(qps * median_s))


JUDGE_EFF = {1: 1.0, 2: 0.8, 4: 0.6, 8: 0.4}  # assumption: tensor-parallel decode efficiency
TEACHER_EFF = {1: 1.0, 2: 0.9, 4: 0.8, 8: 0.65}  # assumption: tensor-parallel prefill


def _search_trajs(p: SearchParams, rng: random.Random, prefix: str = "ds",
                  task: str = "search") -> list[Trajectory]:
    sig = sigma_from_p95(p.search_median_s, p.search_p95_s)
    out = []
    for i in range(p.batch):
        tid = f"{prefix}{i}"
        n = max(1, min(p.calls_cap, round(lognormal_mean(rng, p.calls_mean, p.calls_sigma))))
        steps = []
        for j in range(n):
            think = lognormal_mean(rng, p.output_tokens_mean, 0.5) / p.decode_tok_s
            if rng.random() < p.browse_share:
                act = Action(f"{tid}.b{j}", {"api:browse": 1},
                             duration=lognormal(rng, p.browse_median_s, sig, 30.0, 0.05),
                             trajectory=tid, task=task, kind="browse")
            else:
                act = Action(f"{tid}.s{j}", {"api:search": 1},
                             duration=lognormal(rng, p.search_median_s, sig, 30.0, 0.05),
                             trajectory=tid, task=task, kind="search")
            steps.append(Step(think, act))
        t_ori = lognormal(rng, p.judge_s, 0.3, None, 0.2)
        steps.append(Step(lognormal_mean(rng, p.output_tokens_mean, 0.5) / p.decode_tok_s,
                          Action(f"{tid}.judge", {"gpu": list(GPU_DOPS)},
                                 elasticity=tp_elasticity(t_ori, JUDGE_EFF), trajectory=tid,
                                 task=task, kind="judge", service="judge")))
        out.append(Trajectory(tid, task, rng.uniform(0, p.start_spread_s), tuple(steps)))
    return out


def _pools(p_api: SearchParams | None, gpu: ResourceSpec):
    def make():
        pools = {"gpu": gpu.build_pool()}
        if p_api is not None:
            pools["api:search"] = FlatPool("api:search", {"node0": p_api.slots(
                p_api.search_qps, p_api.search_median_s)})
            pools["api:browse"] = FlatPool("api:browse", {"node0": p_api.slots(
                p_api.browse_qps, p_api.browse_median_s)})
        return pools
    return make


def _gpu_spec(nodes: int, memory_gb: float, services: dict[str, float]) -> ResourceSpec:
    return ResourceSpec("gpu", "chunks", nodes=nodes, gpus_per_node=8, memory_gb=memory_gb,
                        services={s: ServiceSpec(m, restore_s(m)) for s, m in services.items()})


@register("deepsearch")
def deepsearch(params: SearchParams | None = None, **overrides) -> Workload:
    p = params or SearchParams(**overrides)
    rng = random.Random(p.seed)
    gpu = _gpu_spec(p.gpu_nodes, p.gpu_memory_gb, {"judge": p.judge_memory_gb})
    return Workload("deepsearch", tuple(_search_trajs(p, rng)), _pools(p, gpu), p, gpu,
                    tasks=("search",))


@dataclass(frozen=True)
class MopdParams:
    batch: int = field(default=256, metadata=src("experiment setting"))
    teachers: int = field(default=9, metadata=src("paper §7: 9 teacher models in the baseline"))
    burst_orders: float = field(default=3.0, metadata=src(
        "paper: call volume across teachers differs by up to three orders of magnitude"))
    phase_s: float = field(default=30.0, metadata=src(
        "assumption: the popular teachers change every 30 s (tasks' rollouts drift)"))
    teacher_memory_gb: float = field(default=30.0, metadata=src(
        "assumption: 8B-32B teachers plus KV cache, per GPU"))
    seq_tokens_mean: float = field(default=16000.0, metadata=src(
        "docs/calibration.md §7: 32B teacher, 16k tokens about 2-3 s on 1 GPU"))
    prefill_tok_s: float = field(default=7000.0, metadata=src(
        "docs/calibration.md §7 defaults: prefill 7k tok/s per GPU (32B)"))
    gen_tokens_mean: float = field(default=3000.0, metadata=src(
        "docs/calibration.md §6: reasoning about 3k output tokens per turn"))
    decode_tok_s: float = field(default=65.0, metadata=src("docs/calibration.md §6: 50-80 tok/s"))
    turns: int = field(default=2, metadata=src("assumption: turns per MOPD trajectory, each "
                                               "ending in a log-prob call"))
    start_spread_s: float = field(default=60.0, metadata=src(
        "assumption: async rollout admits trajectories over the first minute"))
    gpu_nodes: int = field(default=5, metadata=src("paper §7: 5 GPU nodes x 8 GPUs"))
    gpu_memory_gb: float = field(default=80.0, metadata=src("H100 80 GB"))
    seed: int = field(default=0, metadata=src("experiment setting"))


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
            steps.append(Step(think, Action(
                f"{tid}.lp{j}", {"gpu": list(GPU_DOPS)}, elasticity=tp_elasticity(
                    t_ori, TEACHER_EFF), trajectory=tid, task="mopd", kind="logprob",
                service=f"teacher{teacher}")))
            t += t_ori
        out.append(Trajectory(tid, "mopd", start, tuple(steps)))
    return out


def _teachers(p: MopdParams) -> dict[str, float]:
    return {f"teacher{i}": p.teacher_memory_gb for i in range(p.teachers)}


@register("mopd")
def mopd(params: MopdParams | None = None, **overrides) -> Workload:
    p = params or MopdParams(**overrides)
    rng = random.Random(p.seed)
    gpu = _gpu_spec(p.gpu_nodes, p.gpu_memory_gb, _teachers(p))
    return Workload("mopd", tuple(_mopd_trajs(p, rng)), _pools(None, gpu), p, gpu,
                    tasks=("mopd",))


@register("mopd+search")
def mopd_search(mopd_params: MopdParams | None = None,
                search_params: SearchParams | None = None, batch: int | None = None,
                gpu_nodes: int | None = None, seed: int = 0) -> Workload:
    """Both tasks at once on one GPU pool (paper: 10 reward services; 9 teachers + judge)."""
    mp = mopd_params or MopdParams(seed=seed)
    sp = search_params or SearchParams(seed=seed + 1)
    if batch is not None:
        mp = MopdParams(**{**mp.__dict__, "batch": batch})
        sp = SearchParams(**{**sp.__dict__, "batch": batch})
    nodes = gpu_nodes or mp.gpu_nodes
    rng = random.Random(seed)
    trajs = _mopd_trajs(mp, rng) + _search_trajs(sp, rng)
    gpu = _gpu_spec(nodes, mp.gpu_memory_gb, {**_teachers(mp), "judge": sp.judge_memory_gb})
    return Workload("mopd+search", tuple(trajs), _pools(sp, gpu), (mp, sp), gpu,
                    tasks=("mopd", "search"))

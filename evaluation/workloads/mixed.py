"""Mixed CPU + GPU + API rollout for the scale bench: AI coding (CPU tool calls and elastic
reward runs) beside DeepSearch (rate-limited search/browse APIs, a GPU judge) and MOPD (GPU
teachers), all sized from one batch so that the cluster grows with it."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from evaluation.workloads.base import Workload, src
from evaluation.workloads.coding import CodingParams, _trajectory, coding_pools
from evaluation.workloads.gpu import (
    MopdParams,
    SearchParams,
    _gpu_spec,
    _mopd_trajs,
    _pools,
    _search_trajs,
    _teachers,
)
from evaluation.workloads.registry import register


@dataclass(frozen=True)
class MixedParams:
    batch: int = field(default=256, metadata=src("experiment setting (all trajectories)"))
    nodes: int = field(default=2, metadata=src("CPU nodes"))
    cores_per_node: int = field(default=128, metadata=src("assumption"))
    search_share: float = field(default=0.125, metadata=src("assumption: 1/8 DeepSearch"))
    mopd_share: float = field(default=0.125, metadata=src("assumption: 1/8 MOPD, rest coding"))
    trajectories_per_gpu_node: int = field(default=256, metadata=src(
        "assumption: one 8-GPU node per 256 trajectories (64 x 8 GPUs at 16,384)"))
    qps_per_search_trajectory: float = field(default=0.25, metadata=src(
        "assumption: API keys bought in proportion to the search trajectories"))
    seed: int = field(default=0, metadata=src("experiment setting"))


@register("mixed")
def mixed(params: MixedParams | None = None, **overrides) -> Workload:
    p = params or MixedParams(**overrides)
    rng = random.Random(p.seed)
    n_search = max(1, round(p.batch * p.search_share))
    n_mopd = max(1, round(p.batch * p.mopd_share))
    n_code = max(1, p.batch - n_search - n_mopd)
    cp = CodingParams(batch=n_code, nodes=p.nodes, cores_per_node=p.cores_per_node,
                      seed=p.seed)
    qps = max(1.0, n_search * p.qps_per_search_trajectory)
    sp = SearchParams(batch=n_search, search_qps=qps, browse_qps=qps / 2, seed=p.seed + 1)
    gpu_nodes = max(1, p.batch // p.trajectories_per_gpu_node)
    mp = MopdParams(batch=n_mopd, gpu_nodes=gpu_nodes, seed=p.seed + 2)
    trajs = ([_trajectory(cp, rng, i) for i in range(n_code)] + _search_trajs(sp, rng)
             + _mopd_trajs(mp, rng))
    gpu = _gpu_spec(gpu_nodes, mp.gpu_memory_gb, {**_teachers(mp), "judge": sp.judge_memory_gb})
    cpu, rest = coding_pools(p.nodes, p.cores_per_node), _pools(sp, gpu)
    return Workload("mixed", tuple(trajs), lambda: {**cpu(), **rest()}, p, gpu,
                    tasks=("coding", "search", "mopd"))

"""Mixed CPU + GPU + API rollout for the scale bench: AI coding (CPU tool calls and elastic
reward runs) beside DeepSearch (rate-limited search/browse APIs, a GPU judge) and MOPD (GPU
teachers), all sized from one batch so that the cluster grows with it."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from evaluation.params import assumed, setting
from evaluation.workloads.base import Workload
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


@dataclass(frozen=True)
class MixedParams:
    batch: int = field(default=256, metadata=setting("all trajectories of the scale bench"))
    nodes: int = field(default=2, metadata=setting("CPU nodes, sized with the batch"))
    cores_per_node: int = field(default=128, metadata=setting("the scale bench's node size"))
    search_share: float = field(default=0.125, metadata=assumed("1/8 DeepSearch", 0.0, 0.5))
    mopd_share: float = field(default=0.125, metadata=assumed("1/8 MOPD, rest coding", 0.0, 0.5))
    trajectories_per_gpu_node: int = field(
        default=256,
        metadata=assumed("one 8-GPU node per 256 trajectories (64 x 8 GPUs at 16,384)", 128, 512),
    )
    qps_per_search_trajectory: float = field(
        default=0.25,
        metadata=assumed("API keys bought in proportion to the search trajectories", 0.1, 1.0),
    )
    seed: int = field(default=0, metadata=setting("seed"))


def mixed(params: MixedParams | None = None, **overrides) -> Workload:
    p = params or MixedParams(**overrides)
    rng = random.Random(p.seed)
    n_search = max(1, round(p.batch * p.search_share))
    n_mopd = max(1, round(p.batch * p.mopd_share))
    n_code = max(1, p.batch - n_search - n_mopd)
    cp = CodingParams(batch=n_code, nodes=p.nodes, cores_per_node=p.cores_per_node, seed=p.seed)
    qps = max(1.0, n_search * p.qps_per_search_trajectory)
    sp = SearchParams(batch=n_search, search_qps=qps, browse_qps=qps / 2, seed=p.seed + 1)
    gpu_nodes = max(1, p.batch // p.trajectories_per_gpu_node)
    mp = MopdParams(batch=n_mopd, gpu_nodes=gpu_nodes, seed=p.seed + 2)
    trajs = (
        [_trajectory(cp, rng, i) for i in range(n_code)]
        + _search_trajs(sp, rng)
        + _mopd_trajs(mp, rng)
    )
    gpu = _gpu_spec(
        gpu_nodes, mp.gpu_memory_gb, {**_teachers(mp), "judge": (sp.judge_weights_gb, sp.kv_gb)}
    )
    cpu, rest = coding_pools(p.nodes, p.cores_per_node), _pools(sp, gpu)
    return Workload(
        "mixed",
        tuple(trajs),
        lambda: {**cpu(), **rest()},
        p,
        gpu,
        tasks=("coding", "search", "mopd"),
    )

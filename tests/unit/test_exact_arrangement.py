"""The exact arrangement against DPArrange.

Where they agree: flat units of one node, and GPU chunk pools (the DP's pooled free-chunk
counts with buddy splitting lose nothing, since a chunk never spans nodes and aligned
power-of-two chunks pack best-fit). Where they differ: a core pool with NUMA domains. The exact
model keeps each action inside one NUMA domain; the DP counts the node's cores as one pool, so
it may give an action cores of two domains and can be strictly better on paper.
"""

import random

import pytest

from solvers.exact.arrangement import solve_arrangement
from solvers.heuristic.dparrange import dp_arrange
from tangram.errors import Infeasible
from tangram.pools import ChunkPool, CorePool, FlatPool, Placement
from topology import ChunkTree, CpuNode

BACKENDS = ["cpsat", "pulp-cbc", "pulp-highs"]


def elastic_task(rng: random.Random, amounts: list[int]) -> dict[int, float]:
    t_ori = rng.uniform(1, 20)
    return {m: t_ori / (rng.uniform(0.5, 1.0) * m) for m in amounts}


def random_tasks(rng: random.Random, choices: list[list[int]], n: int) -> list[dict[int, float]]:
    return [elastic_task(rng, rng.choice(choices)) for _ in range(n)]


def assert_placements_valid(pool, result):
    work = pool.copy()
    for p, k in zip(result.placements, result.units):
        work.take(p, k)  # raises on any overlap, unaligned chunk or core in use


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("backend", BACKENDS)
def test_flat_node_equals_dp(seed, backend):
    rng = random.Random(seed)
    units = rng.choice([4, 8, 12])
    pool = FlatPool("cpu", {"n0": units})
    tasks = random_tasks(rng, [[1], [1, 2], [1, 2, 4], [2, 3, 4]], rng.randint(1, 4))
    exact = solve_arrangement(tasks, pool, backend)
    dp = dp_arrange(tasks, pool.operator("n0"))
    assert exact.total == pytest.approx(dp.total, rel=1e-6)
    assert sum(exact.units) <= units
    assert_placements_valid(pool, exact)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("backend", BACKENDS)
def test_chunk_pool_with_busy_gpus_equals_dp(seed, backend):
    rng = random.Random(100 + seed)
    trees = {f"g{i}": ChunkTree(8, f"g{i}") for i in range(rng.randint(1, 2))}
    pool = ChunkPool("gpu", trees)
    for _ in range(rng.randint(0, 3)):  # some GPUs already busy, fragmenting the trees
        k = rng.choice([1, 1, 2, 4])
        if pool.fits(k):
            pool.place(k)
    tasks = random_tasks(rng, [[1], [1, 2], [1, 2, 4], [2, 4, 8]], rng.randint(1, 4))
    try:
        dp = dp_arrange(tasks, pool.operator())
    except Infeasible:
        with pytest.raises(Infeasible):
            solve_arrangement(tasks, pool, backend)
        return
    exact = solve_arrangement(tasks, pool, backend)
    assert exact.total == pytest.approx(dp.total, rel=1e-6)
    assert_placements_valid(pool, exact)


def numa_pool() -> CorePool:
    return CorePool("cpu", {"n0": CpuNode("n0", {0: range(4), 1: range(4, 8)})})


def test_numa_strict_differs_from_dp_when_an_action_would_span_domains():
    pool = numa_pool()
    tasks = [{4: 2.0, 8: 1.0}]
    assert dp_arrange(tasks, pool.operator("n0")).total == pytest.approx(1.0)  # spans domains
    strict = solve_arrangement(tasks, pool)
    assert strict.total == pytest.approx(2.0) and strict.units == (4,)
    assert len({c // 4 for c in strict.placements[0].cores}) == 1  # one NUMA domain
    assert solve_arrangement(tasks, pool, numa_strict=False).total == pytest.approx(1.0)


@pytest.mark.parametrize("seed", range(6))
def test_numa_relaxed_equals_dp_and_strict_is_never_better(seed):
    rng = random.Random(200 + seed)
    pool = numa_pool()
    pool.place(rng.randint(1, 3), node="n0")
    tasks = random_tasks(rng, [[1], [1, 2], [1, 2, 4]], rng.randint(1, 3))
    dp = dp_arrange(tasks, pool.operator("n0"))
    relaxed = solve_arrangement(tasks, pool, numa_strict=False)
    strict = solve_arrangement(tasks, pool)
    assert relaxed.total == pytest.approx(dp.total, rel=1e-6)
    assert strict.total >= dp.total - 1e-9
    assert_placements_valid(pool, strict)
    assert_placements_valid(pool, relaxed)


@pytest.mark.parametrize("backend", BACKENDS)
def test_busy_gpu_is_never_placed_on(backend):
    pool = ChunkPool("gpu", {"g0": ChunkTree(4, "g0")})
    pool.take(Placement("g0", chunk=(1, 2)), 1)
    result = solve_arrangement([{2: 1.0}, {1: 1.0}], pool, backend)
    assert result.placements[0].chunk == (2, 4)
    assert result.placements[1].chunk == (0, 1)  # GPU 1 busy, GPUs 2-3 taken by the 2-chunk


@pytest.mark.parametrize("backend", BACKENDS)
def test_tasks_that_cannot_fit_together_are_infeasible(backend):
    pool = ChunkPool("gpu", {"g0": ChunkTree(4, "g0")})
    with pytest.raises(Infeasible):
        solve_arrangement([{4: 1.0}, {1: 1.0}], pool, backend)
    with pytest.raises(Infeasible):
        solve_arrangement([{8: 1.0}], pool, backend)

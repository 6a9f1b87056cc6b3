"""Tangram over a real multi-node Ray cluster on this machine (`ray.cluster_utils.Cluster`).

One cluster for the module (a CPU-less head and two worker nodes of 2 and 4 logical CPUs); each
node's agent runs the `sim` CPU backend (`sleep X` takes X seconds), so the nodes have disjoint
modelled core sets. The last test adds a node and then kills it.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import defaultdict

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'arl-tangram[ray]')")

from tangram.runtime.facade import Tangram
from tangram.runtime.ray import RayCpuManager, local_cluster, node_name

POLL_S = 0.2


@pytest.fixture(scope="module")
def cluster():
    with local_cluster(nodes=2, cpus_per_node=[2, 4]) as c:
        yield c


def tangram(cluster) -> Tangram:
    return Tangram.ray(cluster.address, cpu_backend="sim", poll_s=POLL_S)


def cpu_nodes(tg: Tangram) -> dict[str, int]:
    pool = tg.scheduler.pools["cpu"]
    return {n: pool.capacity(n) for n in pool.nodes()}


def record_runs(tg: Tangram) -> list[tuple[float, float, object]]:
    """(entry, exit, placement) of each run the CPU manager is handed: a run lies inside its
    action's grant, so two runs on one core that overlap are a core granted twice (times taken
    around the caller's `exec` would also hold its wait for the loop and the GIL, which under
    load made spans overlap that never did)."""
    runs: list[tuple[float, float, object]] = []
    run = tg.cpu.run

    async def timed(assignment):
        t0 = time.monotonic()
        try:
            return await run(assignment)
        finally:
            runs.append((t0, time.monotonic(), assignment.placement["cpu"]))

    tg.cpu.run = timed
    return runs


def test_pool_is_the_nodes_agents(cluster):
    tg = tangram(cluster)
    try:
        alive = {
            node_name(n["NodeID"]): int(n["Resources"].get("CPU", 0))
            for n in ray.nodes()
            if n["Alive"]
        }
        assert cpu_nodes(tg) == {n: c for n, c in alive.items() if c}
        assert sorted(cpu_nodes(tg).values()) == [2, 4]
        assert isinstance(tg.cpu, RayCpuManager)
        assert tg.status().cpu_backend == "ray:sim"
    finally:
        asyncio.run(tg.shutdown())


def test_placement_across_nodes_never_oversubscribes_a_node(cluster):
    """Six trajectories, two cores per action: both nodes serve, and on every node the cores in
    use at any instant stay within its capacity, each core held by one action at a time."""
    tg = tangram(cluster)

    async def main():
        async with tg:
            spans = record_runs(tg)
            envs = [await tg.open_env(f"t{i}", memory_mb=256) for i in range(6)]
            results = await asyncio.gather(
                *(tg.exec(e, "sleep 0.3", cpu=2) for e in envs for _ in range(2))
            )
            return results, spans

    results, spans = asyncio.run(main())
    caps = cpu_nodes(tg)
    assert all(r.ok for r in results), [r.detail for r in results]
    assert len(spans) == len(results)
    per_node = defaultdict(list)
    for s, e, pl in spans:
        assert len(pl.cores) == 2 and set(pl.cores) <= set(range(caps[pl.node]))
        per_node[pl.node].append((s, e, pl.cores))
    assert set(per_node) == set(caps), "both nodes take work"
    for node, runs in per_node.items():
        for s, _, _ in runs:  # at each start: who else holds cores on this node
            held = [c for s2, e2, cs in runs if s2 <= s < e2 for c in cs]
            assert len(held) <= caps[node]
            assert len(held) == len(set(held)), f"{node}: a core granted twice at {s}"


def test_trajectory_stays_on_its_node(cluster):
    tg = tangram(cluster)

    async def main():
        async with tg:
            envs = {f"s{i}": await tg.open_env(f"s{i}", memory_mb=128) for i in range(4)}
            bound = {t: tg.cpu.binding(t) for t in envs}
            results = await asyncio.gather(
                *(
                    tg.exec(e, "sleep 0.05", cpu=(1, 2), elastic=True)
                    for e in envs.values()
                    for _ in range(4)
                )
            )
            return envs, bound, results

    envs, bound, results = asyncio.run(main())
    env_node = {e: bound[t] for t, e in envs.items()}
    assert len(set(bound.values())) == 2
    for i, r in enumerate(results):
        assert r.ok, r.detail
        assert r.placement["cpu"].node == env_node[list(envs.values())[i // 4]]


def test_node_joins_then_dies_mid_run(cluster):
    """A new node's cores join the pool; killing it fails its running action naming the node,
    its environment is lost for later execs, and the other nodes keep serving their queue."""
    tg = tangram(cluster)

    async def wait_for(cond, what, limit=30.0):
        t0 = time.monotonic()
        while not cond():
            assert time.monotonic() - t0 < limit, f"timed out waiting for {what}"
            await asyncio.sleep(0.05)

    async def main():
        async with tg:
            before = dict(cpu_nodes(tg))
            others = [await tg.open_env(f"o{i}", memory_mb=64) for i in range(3)]
            new = cluster.add_node(num_cpus=2, object_store_memory=100 << 20)
            new_name = node_name(new.node_id)
            await wait_for(lambda: new_name in cpu_nodes(tg), "the new node to join")
            assert cpu_nodes(tg)[new_name] == 2
            victim = await tg.open_env("victim", memory_mb=64)  # least loaded: the new node
            assert tg.cpu.binding("victim") == new_name
            doomed = asyncio.create_task(tg.exec(victim, "sleep 30", cpu=1))
            # the surviving nodes are kept busy with a queue longer than their cores
            survivors = [
                asyncio.create_task(tg.exec(e, "sleep 0.4", cpu=2))
                for e in others
                for _ in range(3)
            ]
            await wait_for(lambda: tg.scheduler.pools["cpu"].free(new_name) < 2, "doomed start")
            cluster.remove_node(new)
            r = await asyncio.wait_for(doomed, 30)
            assert r.status == "failed"
            assert new_name in r.detail and "lost" in r.detail
            after = await tg.exec(victim, "sleep 0.1")
            assert after.status == "failed" and "lost" in after.detail and new_name in after.detail
            done = await asyncio.gather(*survivors)
            assert all(x.ok for x in done), [x.detail for x in done]
            assert all(x.placement["cpu"].node != new_name for x in done)
            assert tg.cpu.describe_nodes()[new_name]["lost"]
            await tg.close_env(victim)  # the last thing bound there: the node leaves
            assert cpu_nodes(tg) == before
            ok = await tg.exec(others[0], "sleep 0.01")
            assert ok.ok

    asyncio.run(main())


def test_gpu_services_run_on_the_agents(cluster):
    """With a GPU backend on the agents, the central GPU manager places chunks over the nodes
    and each node's agent restores and invokes the service on its own (simulated) GPUs."""
    services = {"judge": {"memory_gb": 30, "dops": [4], "infer_s": {4: 0.3}, "restore_s": 0.1}}
    tg = Tangram.ray(
        cluster.address,
        cpu_backend="sim",
        poll_s=POLL_S,
        gpu_backend="sim",
        gpus_per_node=4,
        services=services,
    )
    try:
        pool = tg.scheduler.pools["gpu"]
        assert {n: pool.capacity(n) for n in pool.nodes()} == {n: 4 for n in cpu_nodes(tg)}
        assert tg.status().gpu_backend == "ray"

        async def main():
            async with tg:
                results = await asyncio.gather(
                    *(tg.invoke("judge", {"i": i}, gpus=4) for i in range(6))
                )
                calls = {
                    n: await tg.cpu.nodes[n].agent.gpu_calls() for n in cpu_nodes(tg)
                }  # before shutdown stops the agents
                return results, calls

        results, calls_by_node = asyncio.run(main())
        assert all(r.ok for r in results), [r.detail for r in results]
        used = {r.placement["gpu"].node for r in results}
        assert used == set(cpu_nodes(tg))  # both nodes served
        assert sum(r.restore_s > 0 for r in results) == 2  # one restore per node, then resident
        for name in used:
            calls = calls_by_node[name]
            kinds = [c[0] for c in calls]
            assert kinds.count("restore") == 1 and "invoke" in kinds
            assert all(c[2] == name for c in calls)  # the agent acted on its own node
    finally:
        asyncio.run(tg.shutdown())


def test_concurrent_open_env_of_one_trajectory_is_atomic(cluster):
    """Issue 13, pattern 7: two concurrent opens of one trajectory: one environment, one clear
    refusal; closing it works and nothing is left on any agent."""
    tg = tangram(cluster)

    async def main():
        async with tg:
            got = await asyncio.gather(
                *(tg.open_env("twice", memory_mb=64) for _ in range(2)), return_exceptions=True
            )
            envs = [g for g in got if isinstance(g, str)]
            errors = [g for g in got if isinstance(g, BaseException)]
            assert len(envs) == 1 and len(errors) == 1, got
            assert "twice" in str(errors[0]) and "environment" in str(errors[0])
            await tg.close_env(envs[0])
            assert tg.cpu.envs.all() == [] and all(
                tg.cpu.envs.memory_load(n) == 0 for n in tg.cpu.nodes
            )

    asyncio.run(main())


def test_agent_cores_follow_the_ray_cpu_resource(cluster):
    """Pattern 9: a real backend's agent grants as many of the machine's cores as the Ray node
    offers CPUs (capped by the machine), not every physical core."""
    phys = len(os.sched_getaffinity(0))
    cpu = RayCpuManager.connect(cluster.address, backend="affinity", poll_s=0)
    try:
        offered = {
            node_name(n["NodeID"]): int(n["Resources"].get("CPU", 0))
            for n in ray.nodes()
            if n.get("Alive") and n["Resources"].get("CPU")
        }
        got = {n: cpu.pool.capacity(n) for n in cpu.pool.nodes()}
        assert got == {n: min(c, phys) for n, c in offered.items()}, (got, offered, phys)
    finally:
        asyncio.run(cpu.close())


def test_gpu_node_death_takes_its_chunks_and_residency_out(cluster):
    """Pattern 6: after a GPU node dies, no invoke is placed there and none comes back `error`:
    its chunks leave the pool and its resident copies are forgotten."""
    new = cluster.add_node(num_cpus=1, object_store_memory=100 << 20)
    cluster.wait_for_nodes()
    dead = node_name(new.node_id)
    services = {"judge": {"memory_gb": 30, "dops": [4], "infer_s": {4: 0.05}, "restore_s": 0.05}}
    tg = Tangram.ray(
        cluster.address,
        cpu_backend="sim",
        poll_s=POLL_S,
        gpu_backend="sim",
        gpus_per_node=4,
        services=services,
    )

    async def main():
        async with tg:
            pool = tg.scheduler.pools["gpu"]
            assert dead in pool.nodes()
            warm = await asyncio.gather(*(tg.invoke("judge", {"i": i}, gpus=4) for i in range(6)))
            assert all(r.ok for r in warm) and dead in {r.placement["gpu"].node for r in warm}
            cluster.remove_node(new)
            t0 = time.monotonic()
            while dead in pool.nodes():
                assert time.monotonic() - t0 < 30, "the dead node's chunks stayed in the pool"
                await asyncio.sleep(0.05)
            after = await asyncio.gather(*(tg.invoke("judge", {"i": i}, gpus=4) for i in range(8)))
            assert all(r.ok for r in after), [(r.status, r.detail) for r in after]
            assert dead not in {r.placement["gpu"].node for r in after}
            assert not tg.gpu.residency.entries(dead)

    asyncio.run(main())

"""Vector execs over Ray: the GPU placement travels with the assignment to the node agent of
the environment's machine, whose CPU manager runs the command with it; the central GPU manager
evicts a service copy on the chunk through that node's agent first."""

from __future__ import annotations

import asyncio
import os

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'arl-tangram[ray]')")

from tangram.runtime.facade import Tangram
from tangram.runtime.ray import local_cluster

SERVICES = {"judge": {"memory_gb": 30, "dops": [1], "infer_s": {1: 0.01}, "restore_s": 0.01}}


def test_a_vector_exec_runs_on_its_environments_node_with_a_gpu_there():
    with local_cluster(nodes=2, cpus_per_node=[2, 2]) as cluster:
        tg = Tangram.ray(
            cluster.address,
            cpu_backend="sim",
            poll_s=0.2,
            gpu_backend="sim",
            gpus_per_node=1,
            services=SERVICES,
        )

        async def main():
            async with tg:
                nodes = tg.scheduler.pools["gpu"].nodes()
                assert sorted(nodes) == sorted(tg.scheduler.pools["cpu"].nodes())
                calls = await asyncio.gather(*(tg.invoke("judge", {}, gpus=1) for _ in nodes))
                assert {r.placement["gpu"].node for r in calls} == set(nodes)  # one copy each
                envs = [await tg.open_env(f"t{i}", memory_mb=64) for i in range(2)]
                assert {tg.cpu.binding(f"t{i}") for i in range(2)} == set(nodes)
                for e in envs:  # one after the other: the GPU freed first must not draw the next
                    r = await tg.exec(e, "x", cpu=1, gpus=1)
                    assert r.ok, r.detail
                    assert r.units == {"cpu": 1, "gpu": 1}
                    assert r.placement["gpu"].node == r.placement["cpu"].node
                return {n: await tg.cpu.nodes[n].agent.gpu_calls() for n in nodes}

        for node, calls in asyncio.run(main()).items():
            assert [c[0] for c in calls] == ["restore", "invoke", "evict"], (node, calls)

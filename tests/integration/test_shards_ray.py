"""Node shards as Ray actors on the Ray backend (`tangram.runtime.shards.actors`, docs/scale.md):
a real local Ray cluster (`ray.cluster_utils.Cluster`, a CPU-less head and two worker nodes of 2
logical CPUs, the `sim` CPU backend on each node's agent). `Tangram.ray(..., shards=2)` puts one
shard actor per node; execs on both nodes are granted by their shards; a killed shard actor is
replaced from the router's copies and its queue still runs; shutdown ends the actors."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
ray = pytest.importorskip("ray", reason="Ray is not installed (pip install 'arl-tangram[ray]')")

from tangram.runtime.facade import Tangram
from tangram.runtime.ray import local_cluster
from tangram.runtime.shards.actors import RayShard


def _gone(pid: int, within_s: float = 30.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.2)
    return False


def test_shards_are_ray_actors_and_a_killed_one_is_replaced():
    with local_cluster(nodes=2, cpus_per_node=2) as cluster:
        tg = Tangram.ray(cluster.address, cpu_backend="sim", poll_s=0.2, shards=2)
        sched = tg.scheduler
        assert sched.backend == "ray" and "each a Ray actor" in sched.describe()
        assert all(isinstance(s, RayShard) for s in sched._shards)
        pids = sched.shard_pids()
        assert len(set(pids)) == 2 and os.getpid() not in pids
        assert all(c >= 0 for c in sched.shard_cpu_s())

        async def main():
            async with tg:
                envs = [await tg.open_env(f"t{i}", memory_mb=256) for i in range(4)]
                first = await asyncio.gather(*(tg.exec(e, "sleep 0.1", cpu=1) for e in envs))
                ray.kill(sched._shards[0].actor, no_restart=True)  # shard 0 dies
                second = await asyncio.gather(
                    *(tg.exec(e, "sleep 0.1", cpu=1) for e in envs for _ in range(2))
                )
                return first, second

        first, second = asyncio.run(main())
        assert all(r.ok for r in first + second), [r.detail for r in first + second]
        assert len({r.placement["cpu"].node for r in first}) == 2  # both nodes' shards grant
        assert sched.restarts[0] == 1 and sched.restarts[1] == 0
        assert sched.shard_pids()[0] != pids[0]
        assert all(_gone(p) for p in sched.shard_pids())  # shutdown ended the actors

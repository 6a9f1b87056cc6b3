"""`tangram bench ray`: short actions over a local multi-node Ray cluster vs `Tangram.local()`.

Both runs serve the same closed-loop workload: `--trajectories` environments, each issuing its
share of `--actions` one after another (as an agent does), every action a zero-time `sim` exec,
so the figures are the cost of scheduling and dispatch: in-process on one side, a Ray RPC to the
node agent on the other. ACT is queued plus run time per action.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from typing import Any

from tangram.runtime.facade import Tangram
from tangram.runtime.ray import local_cluster


async def _workload(tg: Any, actions: int, trajectories: int) -> dict[str, Any]:
    async with tg:
        envs = [await tg.open_env(f"bench-{i}", memory_mb=64) for i in range(trajectories)]
        share = [
            actions // trajectories + (i < actions % trajectories) for i in range(trajectories)
        ]
        acts: list[float] = []
        nodes: set[str] = set()

        async def agent(env: str, n: int) -> None:
            for _ in range(n):
                r = await tg.exec(env, "true", cpu=1)
                if not r.ok:
                    raise RuntimeError(f"bench action failed: {r.detail}")
                acts.append(r.queued_s + r.run_s)
                nodes.add(r.placement["cpu"].node)

        t0 = time.perf_counter()
        await asyncio.gather(*(agent(e, n) for e, n in zip(envs, share, strict=True)))
        wall = time.perf_counter() - t0
        cores = tg.scheduler.pools["cpu"].capacity()
    acts.sort()
    return {
        "actions": len(acts),
        "wall_s": wall,
        "throughput": len(acts) / wall,
        "act_p50_ms": 1e3 * statistics.median(acts),
        "act_p99_ms": 1e3 * acts[min(len(acts) - 1, int(0.99 * len(acts)))],
        "nodes": len(nodes),
        "cores": cores,
    }


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tangram bench ray", description=__doc__)
    parser.add_argument("--actions", type=int, default=2000)
    parser.add_argument("--trajectories", type=int, default=24)
    parser.add_argument("--nodes", type=int, default=3, help="Ray worker nodes (local cluster)")
    parser.add_argument("--cores", type=int, default=2, help="logical cores per Ray node")
    parser.add_argument("--json", action="store_true")
    ns = parser.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")

    rows = {
        "local": asyncio.run(
            _workload(Tangram.local(cpu_backend="sim"), ns.actions, ns.trajectories)
        )
    }
    t0 = time.perf_counter()
    with local_cluster(ns.nodes, ns.cores) as cluster:
        started = time.perf_counter() - t0
        tg = Tangram.ray(cluster.address, cpu_backend="sim")
        rows["ray"] = asyncio.run(_workload(tg, ns.actions, ns.trajectories))
    rows["ray"]["cluster_start_s"] = started
    if ns.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"{ns.actions} zero-time actions, {ns.trajectories} closed-loop trajectories")
    print(
        f"{'runtime':<8}{'nodes':>6}{'cores':>6}{'actions/s':>11}{'p50 ACT ms':>12}"
        f"{'p99 ACT ms':>12}"
    )
    for name, r in rows.items():
        print(
            f"{name:<8}{r['nodes']:>6}{r['cores']:>6}{r['throughput']:>11.0f}"
            f"{r['act_p50_ms']:>12.2f}{r['act_p99_ms']:>12.2f}"
        )
    print(f"(local Ray cluster of {ns.nodes} nodes started in {started:.1f} s)")
    return 0

"""Simulator benchmark: AI coding at batch 2048 (about 65,000 actions) on the paper's CPU
cluster (15 nodes x 256 cores), closed loop, the real scheduler with the heuristic policy.
Prints actions per second; the goal is under 60 s on a 2-core machine.

    tangram experiment bench [--batch 2048] [--nodes 15] [--engine runtime] [--json]

`--engine runtime` runs the same workload through the runtime itself (`Tangram` with the sim CPU
backend on a virtual-time loop, `evaluation.runtime_sim`): what the strongest form of "one
engine" costs against the simulator's own loop.
"""

from __future__ import annotations

import argparse
import json
import resource
import time

from evaluation.closedloop import EnvironmentStart, Policy, run
from evaluation.runtime_sim import run_on_runtime
from evaluation.workloads import get_workload
from solvers import get_allocator


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="tangram experiment bench",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--batch", type=int, default=2048)
    p.add_argument("--nodes", type=int, default=15)
    p.add_argument("--policy", default="heuristic")
    p.add_argument(
        "--engine",
        choices=("engine", "runtime"),
        default="engine",
        help="the simulator's event loop (default) or the runtime on virtual time",
    )
    p.add_argument("--json", action="store_true")
    ns = p.parse_args(argv)

    t0 = time.perf_counter()
    w = get_workload("coding", batch=ns.batch, nodes=ns.nodes, cores_per_node=256)
    gen = time.perf_counter() - t0
    t1 = time.perf_counter()
    if ns.engine == "runtime":
        r = run_on_runtime(w, ns.policy, EnvironmentStart().start_s)
    else:
        r = run(w, Policy(ns.policy, get_allocator(ns.policy)))
    wall = time.perf_counter() - t1
    doc = {
        "engine": ns.engine,
        "batch": ns.batch,
        "cores": 256 * ns.nodes,
        "actions": len(r.records),
        "decisions": int(r.counters["decisions"]),
        "generate_s": round(gen, 2),
        "simulate_s": round(wall, 2),
        "actions_per_s": round(len(r.records) / wall),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "goal": "simulate_s < 60",
    }
    if ns.json:
        print(json.dumps(doc, indent=2))
    else:
        for k, v in doc.items():
            print(f"{k:>16}: {v}")
    return 0

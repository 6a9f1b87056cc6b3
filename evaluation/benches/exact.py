"""`tangram bench exact`: exact-schedule solve times by instance size.

The default run is short: CP-SAT on 4, 6 and 8 actions (5 seeds each) on 8 flat units and on
one 8-GPU node, with the median and worst solve time and how many it proved optimal. `--sweep`
grows the size until no instance of a size is proved optimal within `--time-limit` (60 s).
"""

from __future__ import annotations

import argparse
import json
import statistics

from solvers.exact.backend import BACKENDS, SolveStatus
from solvers.exact.random_instances import InstanceClass, random_instance_doc
from solvers.exact.schedule import solve_schedule
from tangram.errors import TangramError
from tangram.instance import parse_instance


def measure(pool: str, size: int, seeds: int, backend: str, time_limit: float) -> dict:
    """Solve `seeds` random instances of one size; times in seconds."""
    times, proved = [], 0
    for seed in range(seeds):
        doc = random_instance_doc(InstanceClass(pool, "bursty", size), seed)
        try:
            s = solve_schedule(parse_instance(doc), backend, time_limit)
        except TangramError:  # nothing found within the limit
            times.append(time_limit)
            continue
        times.append(s.solve_s)
        proved += s.status is SolveStatus.OPTIMAL
    return {
        "pool": pool,
        "size": size,
        "backend": backend,
        "seeds": seeds,
        "proved": proved,
        "median_s": statistics.median(times),
        "max_s": max(times),
    }


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="tangram bench exact",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--backend", choices=BACKENDS, default="cpsat")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--sizes", type=int, nargs="+", default=[4, 6, 8])
    p.add_argument(
        "--sweep",
        action="store_true",
        help="grow the size from 4 until nothing is proved within the time limit",
    )
    p.add_argument("--time-limit", type=float, default=60.0)
    p.add_argument("--json", action="store_true")
    ns = p.parse_args(argv)
    rows = []
    for pool in ("flat", "chunks"):
        sizes = iter(range(4, 1000, 2)) if ns.sweep else iter(ns.sizes)
        for size in sizes:
            row = measure(pool, size, ns.seeds, ns.backend, ns.time_limit)
            rows.append(row)
            if not ns.json:
                print(
                    f"{pool:<7}{size:>4} actions  {row['backend']:<11}"
                    f"median {row['median_s']:8.3f} s  max {row['max_s']:8.3f} s  "
                    f"proved optimal {row['proved']}/{row['seeds']}",
                    flush=True,
                )
            if ns.sweep and row["proved"] == 0:
                break
    if ns.json:
        print(json.dumps(rows))
    return 0

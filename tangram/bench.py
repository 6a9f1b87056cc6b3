"""`tangram bench NAME`: benchmarks that print figures (never timed assertions in tests)."""

from __future__ import annotations

import argparse
import importlib

BENCHES: dict[str, tuple[str, str]] = {
    "dparrange": ("solvers.heuristic.bench:dparrange", "dp_arrange median time, flat and chunk"),
    "scheduler": ("solvers.heuristic.bench:scheduler", "decision time and simulator throughput"),
    "exact": ("solvers.exact.bench:main", "CP-SAT / PuLP solve times by size"),
    "exec": ("managers.cpu.bench:main", "exec overhead of the cgroup and docker backends"),
    "gpu": ("managers.gpu.bench:main", "restore/evict time, placement time, restores avoided"),
    "runtime": ("tangram.runtime_bench:main", "in-process and HTTP throughput"),
    "ray": ("tangram.ray_bench:main", "multi-node Ray throughput"),
}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tangram bench", description=__doc__)
    parser.add_argument("name", choices=sorted(BENCHES),
                        help="; ".join(f"{k}: {v[1]}" for k, v in BENCHES.items()))
    parser.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    module, func = BENCHES[ns.name][0].split(":")
    return int(getattr(importlib.import_module(module), func)(ns.args) or 0)

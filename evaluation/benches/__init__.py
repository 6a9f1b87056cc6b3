"""`tangram bench NAME`: benchmarks that print figures (never timed assertions in tests).
Each bench module of this package is imported only when its bench is asked for."""

from __future__ import annotations

import argparse
import importlib

from evaluation.output import Heartbeat

BENCHES: dict[str, tuple[str, str]] = {
    "dparrange": (
        "evaluation.benches.heuristic:dparrange",
        "dp_arrange median time, flat and chunk",
    ),
    "scheduler": (
        "evaluation.benches.heuristic:scheduler",
        "decision time and simulator throughput",
    ),
    "scale": (
        "evaluation.benches.scale:main",
        "scheduler CPU share per simulated second, batch 2,048 to 16,384",
    ),
    "exact": ("evaluation.benches.exact:main", "CP-SAT / PuLP solve times by size"),
    "exec": ("evaluation.benches.cpu_exec:main", "exec overhead of the cgroup and docker backends"),
    "gpu": ("evaluation.benches.gpu:main", "restore/evict time, placement time, restores avoided"),
    "runtime": ("evaluation.benches.runtime:main", "in-process and HTTP throughput"),
    "decisions": (
        "evaluation.benches.decision_offload:main",
        "a client's wait while a slow policy decides: off the loop vs inline",
    ),
    "ray": ("evaluation.benches.ray_cluster:main", "multi-node Ray throughput"),
    "sessions": (
        "evaluation.benches.sessions:main",
        "a shell session's command latency and 100 sessions' throughput vs swerex-remote",
    ),
    "emfit": ("evaluation.benches.emfit:main", "E(m) learned online on a real elastic pytest"),
    "env": (
        "evaluation.benches.env_layers:main",
        "open from an image, fork and snapshot vs cp -a of the same files",
    ),
    "sandboxfusion": (
        "evaluation.benches.sandboxfusion:main",
        "a /run_code burst: elastic and fixed grants vs a one-core pool; "
        "--latency: latency and throughput vs a minimal no-sandbox server",
    ),
}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="tangram bench", description=__doc__)
    parser.add_argument(
        "name", choices=sorted(BENCHES), help="; ".join(f"{k}: {v[1]}" for k, v in BENCHES.items())
    )
    parser.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    module, func = BENCHES[ns.name][0].split(":")
    with Heartbeat(f"bench {ns.name}"):
        return int(getattr(importlib.import_module(module), func)(ns.args) or 0)

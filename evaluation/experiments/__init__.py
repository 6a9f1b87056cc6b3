"""`tangram experiment NAME [--quick] [--out DIR] [--json] [--oracle] [--no-range]
[--engine engine|runtime]`: the paper's experiments, and `sensitivity`.

The paper's experiments print our ratios beside the paper's, each with its range over the
one-at-a-time sweep of every parameter that has a range (`evaluation.experiments.sweep`), and
write the files WRITES names under --out (listed by `--help`). `--quick` runs small sizes
(CI); `--oracle` hands the scheduler each action's sampled duration instead of learned
means; `--engine runtime` runs Tangram's CPU workloads through the runtime's own facade on
virtual time
(`evaluation.experiments.common._run`); `bench` is the simulator benchmark.
"""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path

from evaluation.bench import main as bench
from evaluation.experiments.common import (
    RUNNING,
    _set,
    engine,
    oracle_estimates,
    print_table,
    tangram_policy,
    timed,
    to_json,
    write,
)
from evaluation.experiments.sensitivity import main as sensitivity
from evaluation.experiments.sweep import attach_ranges
from evaluation.output import Heartbeat
from evaluation.twin import main as twin
from solvers import available

EXPERIMENTS: dict[str, tuple[str, str]] = {
    "fig6": ("evaluation.experiments.fig6", "ACT per workload vs its baseline"),
    "fig7": ("evaluation.experiments.fig7", "ACT breakdown per workload"),
    "fig8-cpu": ("evaluation.experiments.fig8cpu", "CPU scalability vs Kubernetes"),
    "fig8-gpu": ("evaluation.experiments.fig8gpu", "GPU scalability vs SGLang, ServerlessLLM"),
    "fig9": ("evaluation.experiments.fig9", "elastic scheduling vs fixed DoP"),
    "table1": ("evaluation.experiments.table1", "ACT breakdown: queue, overhead, execution"),
}


# the files each writes under --out (NAME.<suffix>); `tests/integration/test_experiments.py`
# runs each and compares what it wrote with this, and `--help` is built from it
WRITES: dict[str, tuple[str, ...]] = {
    **{name: ("csv", "json", "png") for name in EXPERIMENTS},
    "sensitivity": ("json",),
    "twin": (),
    "bench": (),
}


def _writes_help() -> str:
    said = []
    for name, suffixes in WRITES.items():
        files = ", ".join(f"{name}.{s}" for s in suffixes) or "no file (it prints; --json)"
        said.append(f"{name}: {files}")
    return "files under --out: " + "; ".join(said) + "."


def run_experiment(
    name: str, quick: bool = True, quiet: bool = True, ranges: bool = False, oracle: bool = False
):
    mod = importlib.import_module(EXPERIMENTS[name][0])

    def go():
        with oracle_estimates(oracle), _set(RUNNING, name):
            o = mod.main(quick, quiet)
            if ranges:
                attach_ranges(o, lambda: mod.measure(quick), mod.TARGETS)
        return o

    return timed(go)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tangram experiment",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "name",
        choices=[*EXPERIMENTS, "bench", "sensitivity", "twin", "all"],
        help="; ".join(f"{k}: {v[1]}" for k, v in EXPERIMENTS.items())
        + "; bench: simulator throughput; sensitivity: every ranged parameter "
        "swept; twin: the simulator's prediction against a real run of "
        "Tangram.local(); all: every experiment",
    )
    p.add_argument("--quick", action="store_true", help="small sizes (CI)")
    p.add_argument(
        "--out", default="results", help="output folder (default: results); " + _writes_help()
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument(
        "--oracle",
        action="store_true",
        help="the scheduler sees sampled durations, not learned means",
    )
    p.add_argument("--no-range", action="store_true", help="skip the sensitivity sweep")
    p.add_argument(
        "--engine",
        choices=("engine", "runtime"),
        default="engine",
        help="Tangram's CPU runs on the simulator's event loop (default) or through "
        "the runtime itself (the Tangram facade, the CPU manager, a sim backend) on "
        "a virtual-time loop; baselines and GPU/API workloads stay on the engine",
    )
    p.add_argument(
        "--policy",
        default="heuristic",
        help="Tangram's policy (default: heuristic, the paper's; e.g. backfill-srpt)",
    )
    return p


def main(argv: list[str]) -> int:
    p = _parser()
    ns, rest = p.parse_known_args(argv)
    if ns.policy not in available():
        p.error(f"--policy {ns.policy!r}: unknown (known: {available()})")
    if ns.name == "bench":
        with Heartbeat("experiment bench"):
            return bench(rest + (["--json"] if ns.json else []))
    if ns.name == "twin":
        with Heartbeat("experiment twin"):
            return twin(rest + [a for a, on in (("--quick", ns.quick), ("--json", ns.json)) if on])
    if ns.name == "sensitivity":
        return sensitivity(
            rest
            + [
                a
                for a, on in (("--quick", ns.quick), ("--json", ns.json), ("--oracle", ns.oracle))
                if on
            ]
            + ["--out", ns.out]
        )
    if rest:
        p.error(f"unrecognised arguments: {' '.join(rest)}")

    names = list(EXPERIMENTS) if ns.name == "all" else [ns.name]
    docs = []
    for name in names:
        with tangram_policy(ns.policy), engine(ns.engine):
            outcome = run_experiment(
                name,
                ns.quick,
                quiet=ns.json,
                ranges=not ns.no_range,
                oracle=ns.oracle,
            )
        paths = write(outcome, Path(ns.out))
        if ns.json:
            docs.append({**to_json(outcome), "files": [str(x) for x in paths]})
        else:
            print_table(outcome)
            print("wrote " + ", ".join(str(x) for x in paths))
    if ns.json:
        print(json.dumps(docs[0] if len(docs) == 1 else docs, indent=2))
    return 0

"""`tangram experiment NAME [--quick] [--out DIR] [--json]`: the paper's experiments.

Each writes NAME.csv, NAME.json and NAME.png under --out and prints our ratios beside the
paper's. `--quick` runs each in under a minute (CI); `bench` is the simulator benchmark.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

from evaluation.bench import main as bench
from evaluation.experiments.common import print_table, timed, to_json, write

EXPERIMENTS: dict[str, tuple[str, str]] = {
    "fig6": ("evaluation.experiments.fig6", "ACT per workload vs its baseline"),
    "fig7": ("evaluation.experiments.fig7", "ACT breakdown per workload"),
    "fig8-cpu": ("evaluation.experiments.fig8cpu", "CPU scalability vs Kubernetes"),
    "fig8-gpu": ("evaluation.experiments.fig8gpu", "GPU scalability vs SGLang, ServerlessLLM"),
    "fig9": ("evaluation.experiments.fig9", "elastic scheduling vs fixed DoP"),
    "table1": ("evaluation.experiments.table1", "ACT breakdown: queue, overhead, execution"),
}


def run_experiment(name: str, quick: bool = True, quiet: bool = True):
    mod = importlib.import_module(EXPERIMENTS[name][0])
    return timed(lambda: mod.main(quick, quiet))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tangram experiment", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", choices=[*EXPERIMENTS, "bench", "all"],
                   help="; ".join(f"{k}: {v[1]}" for k, v in EXPERIMENTS.items())
                   + "; bench: simulator throughput; all: every experiment")
    p.add_argument("--quick", action="store_true", help="small sizes (under a minute each)")
    p.add_argument("--out", default="results", help="output folder (default: results)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    ns, rest = p.parse_known_args(argv)
    if ns.name == "bench":
        return bench(rest + (["--json"] if ns.json else []))
    if rest:
        p.error(f"unrecognised arguments: {' '.join(rest)}")

    names = list(EXPERIMENTS) if ns.name == "all" else [ns.name]
    docs = []
    for name in names:
        outcome = run_experiment(name, ns.quick, quiet=ns.json or not sys.stderr.isatty())
        paths = write(outcome, Path(ns.out))
        if ns.json:
            docs.append({**to_json(outcome), "files": [str(x) for x in paths]})
        else:
            print_table(outcome)
            print("wrote " + ", ".join(str(x) for x in paths))
    if ns.json:
        print(json.dumps(docs[0] if len(docs) == 1 else docs, indent=2))
    return 0

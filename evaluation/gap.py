"""`tangram gap`: how far the heuristic (and `min`) are from the exact optimum.

Generates `--instances` random small instances per class from `--seed` (flat units or one 8-GPU
node; spread or bursty arrivals; about half the actions elastic), simulates each policy on them,
solves the whole-instance schedule exactly (CP-SAT), and prints per instance and per class the
total ACT of each policy and its gap to the optimum, `100 * (policy - exact) / exact`.

The exact schedule knows every arrival in advance; the policies do not. So the gap mixes two
things: the heuristic's approximation and the value of clairvoyance. A gap is against a proven
optimum when the status says `optimal`, else against the best schedule found in the time limit.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import dataclass

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from evaluation.simulator import simulate
from solvers import get_allocator
from solvers.exact.random_instances import ARRIVALS, POOLS, InstanceClass, random_instance_doc
from solvers.exact.schedule import solve_schedule
from tangram.instance import parse_instance

POLICIES: dict[str, tuple[str, dict]] = {
    "heuristic-d1": ("heuristic", {"depth": 1}),
    "heuristic-d2": ("heuristic", {"depth": 2}),
    "heuristic-d3": ("heuristic", {"depth": 3}),
    "min": ("min", {}),
}


@dataclass(frozen=True, slots=True)
class GapRow:
    cls: str
    size: int
    seed: int
    exact: float
    status: str
    exact_s: float
    policies: dict[str, float]
    policy_s: dict[str, float]

    def gap(self, name: str) -> float:
        return 100.0 * (self.policies[name] - self.exact) / self.exact


def run_one(cls: InstanceClass, seed: int, policies: dict[str, tuple[str, dict]],
            time_limit: float) -> GapRow:
    inst = parse_instance(random_instance_doc(cls, seed))
    exact = solve_schedule(inst, "cpsat", time_limit)
    acts, secs = {}, {}
    for label, (name, options) in policies.items():
        t0 = time.perf_counter()
        acts[label] = simulate(inst, get_allocator(name, **options)).total_act
        secs[label] = time.perf_counter() - t0
    return GapRow(cls.name, cls.size, seed, exact.total_act, exact.status, exact.solve_s,
                  acts, secs)


def _table(rows: list[GapRow], labels: list[str]) -> Table:
    t = Table(title="total ACT (s) and gap to the exact optimum")
    for col in ["class", "size", "seed", "exact", "status", "solve s"]:
        t.add_column(col, justify="right" if col not in ("class", "status") else "left")
    for lb in labels:
        t.add_column(lb, justify="right")
    for r in rows:
        t.add_row(r.cls, str(r.size), str(r.seed), f"{r.exact:.2f}", r.status,
                  f"{r.exact_s:.2f}",
                  *[f"{r.policies[lb]:.2f} ({r.gap(lb):+.1f}%)" for lb in labels])
    t.add_section()
    for cls in sorted({r.cls for r in rows}):
        group = [r for r in rows if r.cls == cls]
        t.add_row(f"[b]{cls} mean[/b]", "", "", "", "", "",
                  *[f"[b]{statistics.mean(r.gap(lb) for r in group):+.1f}%[/b]"
                    for lb in labels])
    return t


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tangram gap", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--instances", type=int, default=3, help="instances per class (default 3)")
    p.add_argument("--seed", type=int, default=0, help="first seed (default 0)")
    p.add_argument("--size", type=int, default=6, help="actions per instance (default 6)")
    p.add_argument("--time-limit", type=float, default=30.0,
                   help="CP-SAT time limit per instance (default 30 s)")
    p.add_argument("--with-cpsat-policy", action="store_true",
                   help="also simulate the receding-horizon exact policy `cpsat`")
    p.add_argument("--json", action="store_true")
    ns = p.parse_args(argv)
    policies = dict(POLICIES)
    if ns.with_cpsat_policy:
        policies["cpsat"] = ("cpsat", {})
    jobs = [(InstanceClass(pool, arr, ns.size), ns.seed + i)
            for pool in POOLS for arr in ARRIVALS for i in range(ns.instances)]
    rows = []
    console = Console(stderr=ns.json, width=max(150, Console().width))
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task("solving", total=len(jobs))
        for cls, seed in jobs:
            rows.append(run_one(cls, seed, policies, ns.time_limit))
            bar.advance(task)
    if ns.json:
        print(json.dumps([{"class": r.cls, "size": r.size, "seed": r.seed, "exact": r.exact,
                           "status": r.status, "exact_s": r.exact_s, "total_act": r.policies,
                           "gap_pct": {lb: r.gap(lb) for lb in r.policies},
                           "policy_s": r.policy_s} for r in rows]))
    else:
        console.print(_table(rows, list(policies)))
    return 0

"""`tangram replay FILE`: simulate an instance file through any allocator.

`--check` also replays the schedule through the work-conservation checker
(`tangram.conservation.check_schedule`) and prints every interval in which an action waited
while units it could use were free; the exit status is 1 when there is one. `--alone` runs the
policy without the scheduler's work-conservation rule, so `--check` judges the policy itself.
"""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.table import Table

from evaluation.simulator import SimResult, simulate
from solvers import available, get_allocator
from tangram.conservation import ConservationReport, check_schedule
from tangram.instance import Instance, load_instance
from tangram.trace import write_trace


def check_result(instance: Instance, result: SimResult) -> ConservationReport:
    """The work-conservation check of a simulated schedule of `instance`."""
    recs = result.records  # in the instance's order: the queue's, among equal arrivals
    schedule = [recs[a.id] for a in instance.actions]
    return check_schedule(instance.build_pools(), schedule, instance.bindings)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tangram replay",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("file", help="instance JSON (docs/architecture.md §5)")
    p.add_argument(
        "--allocator", default="heuristic", help="policy name (heuristic, min, cpsat, pulp, ...)"
    )
    p.add_argument("--depth", type=int, default=None, help="heuristic depth (default 2)")
    p.add_argument(
        "--check",
        action="store_true",
        help="check work conservation; exit 1 when an action waited beside free units it could use",
    )
    p.add_argument(
        "--alone",
        action="store_true",
        help="without the scheduler's work-conservation rule (the policy alone)",
    )
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.add_argument(
        "--trace",
        metavar="FILE",
        help="also write the schedule as a trace (Chrome's trace-event JSON, which "
        "ui.perfetto.dev opens): each action on the units it held, each trajectory's waits",
    )
    return p


def main(argv: list[str]) -> int:
    ns = build_parser().parse_args(argv)

    instance = load_instance(ns.file)
    options = {} if ns.depth is None else {"depth": ns.depth}
    allocator = get_allocator(ns.allocator, **options)
    result = simulate(instance, allocator, conserve=not ns.alone)
    report = check_result(instance, result) if ns.check else None
    status = 1 if report else 0
    if ns.trace:
        write_trace(result.records.values(), ns.trace)
    if ns.json:
        doc = result.to_json()
        if report is not None:
            doc["conservation"] = report.to_json()
        print(json.dumps(doc, indent=None))
        return status
    table = Table(title=f"{ns.file} through {ns.allocator}")
    for col in ("action", "arrival", "start", "end", "units"):
        table.add_column(col)
    services = any(r.restored is not None for r in result.records.values())
    if services:
        table.add_column("restored")
    for aid, r in sorted(result.records.items(), key=lambda kv: (kv[1].start, kv[0])):
        row = [
            aid,
            f"{r.arrival:g}",
            f"{r.start:g}",
            f"{r.end:g}",
            ", ".join(f"{k}={v}" for k, v in r.units.items()),
        ]
        if services:
            row.append("" if r.restored is None else str(r.restored).lower())
        table.add_row(*row)
    console = Console()
    console.print(table)
    console.print(
        f"total ACT: {result.total_act:g}   makespan: {result.makespan:g}   "
        f"(allocators: {', '.join(available())})"
    )
    if report is not None:
        if not report:
            console.print("work conservation: no action waited beside free units it could use")
        for w in report.intervals:
            units = ", ".join(f"{k}={v}" for k, v in w.units.items())
            console.print(
                f"work conservation: {w.action_id} waited {w.start:g} to {w.end:g} "
                f"while {units} it could use were free"
            )
        if report:
            console.print(f"idle unit-seconds while work waited: {report.idle_unit_seconds:g}")
    return status

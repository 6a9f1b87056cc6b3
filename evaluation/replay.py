"""`tangram replay FILE`: simulate an instance file through any allocator."""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.table import Table

from evaluation.simulator import simulate
from solvers import available, get_allocator
from tangram.instance import load_instance


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tangram replay", description=__doc__)
    p.add_argument("file", help="instance JSON (docs/architecture.md §5)")
    p.add_argument("--allocator", default="heuristic",
                   help="policy name (heuristic, min, cpsat, pulp, ...)")
    p.add_argument("--depth", type=int, default=None, help="heuristic depth (default 2)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    return p


def main(argv: list[str]) -> int:
    ns = build_parser().parse_args(argv)

    instance = load_instance(ns.file)
    options = {} if ns.depth is None else {"depth": ns.depth}
    allocator = get_allocator(ns.allocator, **options)
    result = simulate(instance, allocator)
    if ns.json:
        print(json.dumps(result.to_json(), indent=None))
        return 0
    table = Table(title=f"{ns.file} through {ns.allocator}")
    for col in ("action", "arrival", "start", "end", "units"):
        table.add_column(col)
    services = any(r.restored is not None for r in result.records.values())
    if services:
        table.add_column("restored")
    for aid, r in sorted(result.records.items(), key=lambda kv: (kv[1].start, kv[0])):
        row = [aid, f"{r.arrival:g}", f"{r.start:g}", f"{r.end:g}",
               ", ".join(f"{k}={v}" for k, v in r.units.items())]
        if services:
            row.append("" if r.restored is None else str(r.restored).lower())
        table.add_row(*row)
    console = Console()
    console.print(table)
    console.print(f"total ACT: {result.total_act:g}   makespan: {result.makespan:g}   "
                  f"(allocators: {', '.join(available())})")
    return 0

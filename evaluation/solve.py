"""`tangram solve FILE --backend {cpsat,pulp-cbc,pulp-highs} [--time-limit S] [--json]`.

Prints the exact schedule of an instance file: `tangram replay`'s JSON (`total_act`, per action
`start`, `end`, `units`) plus `status` (optimal, feasible at the time limit, or infeasible) and
`bound`, or a table for people.
"""

from __future__ import annotations

import argparse
import json
import sys

from solvers.exact.backend import BACKENDS, SolveStatus
from solvers.exact.model import DEFAULT_RESOLUTION
from solvers.exact.schedule import solve_schedule
from tangram.errors import Infeasible
from tangram.instance import load_instance


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tangram solve",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("file", help="instance JSON file (docs/architecture.md §5)")
    p.add_argument("--backend", choices=BACKENDS, default="cpsat")
    p.add_argument(
        "--time-limit",
        type=float,
        default=60.0,
        metavar="S",
        help="solver time limit in seconds (default 60)",
    )
    p.add_argument(
        "--resolution",
        type=float,
        default=DEFAULT_RESOLUTION,
        metavar="S",
        help=f"seconds per time tick; durations round up to it (default {DEFAULT_RESOLUTION})",
    )
    p.add_argument("--json", action="store_true", help="print JSON for machines")
    return p


def _table(doc: dict) -> str:
    lines = [
        f"status {doc['status']}  total ACT {doc['total_act']:.4f} s  bound "
        f"{'-' if doc['bound'] is None else format(doc['bound'], '.4f')}  "
        f"({doc['backend']}, {doc['solve_s']:.2f} s, resolution {doc['resolution']} s)",
        f"{'action':<12}{'start':>10}{'end':>10}  units",
    ]
    for aid, a in sorted(doc["actions"].items(), key=lambda kv: (kv[1]["start"], kv[0])):
        units = " ".join(f"{r}={u}" for r, u in a["units"].items())
        lines.append(f"{aid:<12}{a['start']:>10.3f}{a['end']:>10.3f}  {units}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ns = _parser().parse_args(argv)

    instance = load_instance(ns.file)
    try:
        doc = solve_schedule(instance, ns.backend, ns.time_limit, ns.resolution).to_json()
    except Infeasible as exc:
        doc = {
            "total_act": None,
            "actions": {},
            "status": SolveStatus.INFEASIBLE,
            "bound": None,
            "backend": ns.backend,
            "resolution": ns.resolution,
            "reason": str(exc),
        }
        print(json.dumps(doc) if ns.json else f"infeasible: {exc}")
        return 1
    print(json.dumps(doc, indent=2) if ns.json else _table(doc))
    sys.stdout.flush()
    return 0

"""Decision recording: what a policy granted, decision by decision, as plain strings.

Optimisations of the scheduler must not change a single grant. `Recording` wraps any allocator
and keeps one line per decision (`now` and every assignment's action id, units, node, cores or
chunk, in the policy's order); `record_cases` runs the fixed seeded cases that
`tests/golden/decisions.json` was recorded from, so a test can replay them and compare.

    python -m evaluation.grant_recording tests/golden/decisions.json   # re-record (only on purpose)
    python -m evaluation.grant_recording --scoped-vs-global coding 512  # scoped vs global grants
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable, Collection
from dataclasses import dataclass, field

from evaluation.closedloop import Policy, run
from evaluation.simulator import simulate
from evaluation.workloads import get_workload
from solvers import get_allocator
from tangram.actions import Action
from tangram.allocation import Allocator, Assignment, ClusterView
from tangram.instance import parse_instance


def describe(a: Assignment) -> str:
    """`id:r=units@node[cores|chunk]` for every resource of one assignment."""
    parts = []
    for r in sorted(a.units):
        p = a.placement[r]
        where = p.node
        if p.cores:
            where += "/" + ".".join(map(str, p.cores))
        if p.chunk is not None:
            where += f"/c{p.chunk[0]}+{p.chunk[1]}"
        parts.append(f"{r}={a.units[r]}@{where}")
    return f"{a.action.id}:{','.join(parts)}"


@dataclass
class Recording:
    """An allocator that answers what `inner` answers and writes each decision down."""

    inner: Allocator
    lines: list[str] = field(default_factory=list)

    def allocate(
        self, view: ClusterView, queue: Collection[Action], now: float
    ) -> list[Assignment]:
        out = self.inner.allocate(view, queue, now)
        self.lines.append(f"{now:.9g} " + " ".join(describe(a) for a in out))
        return out


def granting(lines: list[str]) -> list[str]:
    """The decisions of a recording that grant something (a line is the time, then one word
    per grant). The scheduler does not ask the policy when no unit a queued action needs is
    free (`Scheduler._nothing_free`), so how many decisions grant nothing is not compared."""
    return [line for line in lines if " " in line.strip()]


def open_instance(n: int, units: int, seed: int):
    """Open-loop arrivals on one flat node: a quarter elastic (1..16 units), the rest 1 unit."""
    rng = random.Random(seed)
    acts, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(1 / 0.02)
        if i % 4 == 0:
            amounts = [1, 2, 4, 8, 16]
            acts.append(
                {
                    "id": f"a{i}",
                    "arrival": t,
                    "key": "cpu",
                    "demand": {"cpu": amounts},
                    "t_ori": rng.uniform(1, 8),
                    "efficiency": {str(m): 1 / (m * (0.1 + 0.9 / m)) for m in amounts},
                }
            )
        else:
            acts.append(
                {
                    "id": f"a{i}",
                    "arrival": t,
                    "demand": {"cpu": [1]},
                    "duration": rng.uniform(0.05, 1.0),
                }
            )
    return parse_instance(
        {"resources": {"cpu": {"topology": "flat", "units": units}}, "actions": acts}
    )


Driver = Callable[[Allocator, bool], None]  # (allocator, scoped) -> runs the case


def _closed(workload: str, **params) -> Driver:
    return lambda alloc, scoped: (
        run(get_workload(workload, **params), Policy(workload, alloc, scoped=scoped)) and None
    )


def _open(n: int, units: int, seed: int) -> Driver:
    return lambda alloc, scoped: (
        simulate(open_instance(n, units, seed), alloc, scoped=scoped) and None
    )


# name -> (policy, driver); small and contended so that groups hold several elastic candidates
CASES: dict[str, tuple[str, Driver]] = {
    "coding-heuristic": (
        "heuristic",
        _closed("coding", batch=48, nodes=2, cores_per_node=8, seed=3),
    ),
    "coding-backfill": ("backfill", _closed("coding", batch=32, nodes=2, cores_per_node=8, seed=4)),
    "mopd+search-heuristic": ("heuristic", _closed("mopd+search", batch=24, gpu_nodes=1, seed=5)),
    "open-heuristic": ("heuristic", _open(1500, 24, 6)),
    "open-light-heuristic": ("heuristic", _open(1500, 96, 7)),
}


def record_case(name: str, scoped: bool = False) -> list[str]:
    """The case's decisions; `scoped` runs it with `Scheduler(scoped=True)`."""
    policy, drive = CASES[name]
    rec = Recording(get_allocator(policy))
    drive(rec, scoped)
    return rec.lines


def record_cases() -> dict[str, list[str]]:
    return {name: record_case(name) for name in CASES}


def compare_scoped(workload: str, batch: int, policy: str = "heuristic") -> tuple[int, int]:
    """(decisions, how many differ) between the global and the scoped scheduler on the scale
    bench's cluster for `workload` at `batch` (docs/scale.md)."""
    params = dict(batch=batch, nodes=max(1, batch // 128), cores_per_node=128)
    lines = []
    for scoped in (False, True):
        rec = Recording(get_allocator(policy))
        run(get_workload(workload, **params), Policy(policy, rec, scoped=scoped))
        lines.append(rec.lines)
    a, b = lines
    return len(a), sum(x != y for x, y in zip(a, b)) + abs(len(a) - len(b))


if __name__ == "__main__":
    if sys.argv[1] == "--scoped-vs-global":  # WORKLOAD BATCH
        n, bad = compare_scoped(sys.argv[2], int(sys.argv[3]))
        print(f"{sys.argv[2]} batch {sys.argv[3]}: {n} decisions, {bad} differ")
    else:
        with open(sys.argv[1], "w") as f:
            json.dump(record_cases(), f, indent=0)
            f.write("\n")

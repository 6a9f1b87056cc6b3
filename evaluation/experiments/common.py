"""What every experiment shares: its result type, the systems under test, running one
simulation with a progress bar, and writing CSV + JSON + PNG with a table beside the paper's.
"""

from __future__ import annotations

import csv
import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from evaluation.baselines import (
    ByResource,
    Kubernetes,
    Lifecycles,
    StaticServices,
    pin_services,
)
from evaluation.baselines.api import ApiRetry
from evaluation.closedloop import LoopResult, Policy, run
from evaluation.workloads import Workload
from solvers import get_allocator


@dataclass(frozen=True)
class Compare:
    """One headline figure: ours beside the paper's (None where the paper gives none)."""

    metric: str
    ours: float | None
    paper: float | None
    unit: str = "x"
    note: str = ""


@dataclass
class Outcome:
    name: str
    rows: list[dict[str, Any]]
    compares: list[Compare]
    plot: Callable[[list[dict[str, Any]], Any], None]
    notes: list[str] = field(default_factory=list)
    wall_s: float = 0.0


# -- systems ---------------------------------------------------------------------------------

def tangram() -> Policy:
    """The paper's configuration: the heuristic with depth 2."""
    return Policy("tangram", get_allocator("heuristic", depth=2))


def kubernetes(pod_cores: int = 4, seed: int = 0) -> Policy:
    k = Kubernetes(pod_cores=pod_cores, seed=seed)
    return Policy("k8s", k, k)


def plain(name: str, **options) -> Policy:
    label = name if not options else name + "".join(f"-{v}" for v in options.values())
    return Policy(label, get_allocator(name, **options))


def static_gpu(services: Sequence[str], workload: Workload, gpus_each: int,
               replicas: int = 1) -> StaticServices:
    spec = workload.gpu
    assert spec is not None
    return StaticServices(pins=pin_services(services, spec.node_names(), spec.gpus_per_node,
                                            gpus_each, replicas))


def static_policy(name: str, static: StaticServices) -> Policy:
    """Static services are deployed before the run: the allocator is its own lifecycle."""
    return Policy(name, static, static)


def search_baseline(workload: Workload, judge: StaticServices) -> Policy:
    """DeepSearch's baseline: per-trajectory API calls with retries, static judge replicas."""
    api = ApiRetry()
    return Policy("api-retry+static", ByResource((("api:", api), ("gpu", judge))),
                  Lifecycles((api, judge)))


# -- running ---------------------------------------------------------------------------------

class Runner:
    """Runs simulations under one rich progress bar (or silently)."""

    def __init__(self, total_runs: int, quiet: bool = False) -> None:
        self.quiet = quiet
        self.total = total_runs
        self._progress: Any = None
        self._task: Any = None

    def __enter__(self) -> Runner:
        if not self.quiet:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                      MofNCompleteColumn(), TimeElapsedColumn(), transient=True)
            self._progress.start()
            self._task = self._progress.add_task("runs", total=self.total)
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()

    def run(self, label: str, workload: Workload, policy: Policy) -> LoopResult:
        if self._progress is not None:
            self._progress.update(self._task, description=f"{label}: {policy.name}")
        res = run(workload, policy)
        if self._progress is not None:
            self._progress.advance(self._task)
        return res


def ratio(baseline: float, ours: float) -> float | None:
    return baseline / ours if ours > 0 else None


# -- output ----------------------------------------------------------------------------------

def write(outcome: Outcome, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    base = out / outcome.name
    paths = [base.with_suffix(".csv"), base.with_suffix(".json"), base.with_suffix(".png")]
    keys: list[str] = []
    for r in outcome.rows:
        keys.extend(k for k in r if k not in keys)
    with paths[0].open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(outcome.rows)
    paths[1].write_text(json.dumps(to_json(outcome), indent=2))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(10, 4.2))
    outcome.plot(outcome.rows, fig)
    fig.suptitle(outcome.name)
    fig.tight_layout()
    fig.savefig(paths[2], dpi=110)
    plt.close(fig)
    return paths


def to_json(outcome: Outcome) -> dict[str, Any]:
    return {"experiment": outcome.name, "wall_s": round(outcome.wall_s, 2),
            "rows": outcome.rows, "compare": [asdict(c) for c in outcome.compares],
            "notes": outcome.notes}


def print_table(outcome: Outcome) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{outcome.name}: ours vs the paper ({outcome.wall_s:.1f} s)")
    for c in ("figure", "ours", "paper", "note"):
        t.add_column(c)
    fmt = lambda v, u: "-" if v is None else f"{v:.2f}{u}"
    for c in outcome.compares:
        t.add_row(c.metric, fmt(c.ours, c.unit), fmt(c.paper, c.unit), c.note)
    con = Console()
    con.print(t)
    for n in outcome.notes:
        con.print(f"- {n}")


def timed(fn: Callable[[], Outcome]) -> Outcome:
    t0 = time.perf_counter()
    o = fn()
    o.wall_s = time.perf_counter() - t0
    return o

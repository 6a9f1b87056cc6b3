"""`tangram bench scale`: can one scheduler process keep up with a frontier-size rollout?

Per batch size, the workload runs closed-loop on a cluster sized with it (one core per
trajectory: batch / 128 nodes of 128 cores; the mixed workload adds one 8-GPU node per 256
trajectories and API slots in proportion), through the real scheduler on the virtual clock,
once with `heuristic` and once with `min` (FCFS at minimum amounts, the cheapest policy) as the
same-run reference. Each run is a fresh process, so its peak RSS is its own.

Reported per size: the scheduler's CPU seconds per simulated second (the share of one core it
needs to keep up in real time), decisions per simulated second and per CPU second, p50/p99
decision CPU time, and peak RSS; beside them the CPU time of one plain numpy DP of
64 tasks x 16 amounts x 256 units in the same run (the issue-18 goal: share <= 0.10 and decision
p99 under that DP, at batch 16,384). CPU times are this thread's (`time.thread_time`), so a
loaded machine slows them less than wall time.

    tangram bench scale                    # 2,048 .. 16,384 (long: run it with a few cores)
    tangram bench scale --quick            # batch 64 and 128, well under a minute
    tangram bench scale --jobs 8 --json out.json --plot scale.png
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import random
import resource
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from evaluation.benches.heuristic import plain_numpy_dp, reference_tasks
from evaluation.closedloop import Policy, run
from evaluation.workloads import get_workload
from solvers import get_allocator
from tangram.scheduler import Scheduler

FULL = (2048, 4096, 8192, 16384)
QUICK = (64, 128)
CORES_PER_NODE = 128
GOAL_SHARE = 0.10


@dataclass(frozen=True, slots=True)
class RunFigures:
    """One (workload, batch, policy) run."""

    workload: str
    batch: int
    policy: str
    nodes: int
    actions: int
    decisions: int
    simulated_s: float  # the rollout's makespan on the virtual clock
    cpu_s: float  # scheduler CPU seconds over all decisions
    p50_ms: float
    p99_ms: float
    peak_rss_mb: float
    wall_s: float  # the whole simulation, generator excluded
    # scoped runs only: the decisions' CPU split as if each of SHARDS processes decided for its
    # own nodes and a coordinator for the rest (docs/scale.md)
    shard_max_cpu_s: float = 0.0  # the busiest shard
    coordinator_cpu_s: float = 0.0  # decisions touching pooled classes or several shards
    cross_decisions: int = 0  # of those, the ones a shard could not have made alone

    @property
    def share(self) -> float:
        """CPU seconds per simulated second: the share of one core needed in real time."""
        return self.cpu_s / self.simulated_s if self.simulated_s else 0.0


def workload_for(name: str, batch: int):
    nodes = max(1, batch // CORES_PER_NODE)
    if name == "coding":
        return get_workload("coding", batch=batch, nodes=nodes, cores_per_node=CORES_PER_NODE)
    return get_workload("mixed", batch=batch, nodes=nodes, cores_per_node=CORES_PER_NODE)


SHARDS = 8


class ShardAccount:
    """Attributes each scoped decision's CPU to the shard owning the nodes it touched (node i
    of a pool to shard i mod SHARDS); a decision touching a pooled class (an unbound action,
    a GPU or API pool) or nodes of two shards goes to the coordinator."""

    def __init__(self, shards: int = SHARDS) -> None:
        self.cpu = [0.0] * shards
        self.coordinator = 0.0
        self.cross = 0
        self._shard: dict[str, int] = {}

    def __call__(self, sched: Scheduler, cpu_s: float) -> None:
        scope = sched.last_scope or ()
        owners = set()
        pooled = False
        for r, node in scope:
            if node is None:
                pooled = True
                continue
            i = self._shard.get(node)
            if i is None:
                nodes = sched.pools[r].nodes()
                i = self._shard[node] = nodes.index(node) % len(self.cpu)
            owners.add(i)
        if len(owners) == 1 and not pooled:
            self.cpu[owners.pop()] += cpu_s
            return
        self.coordinator += cpu_s
        self.cross += bool(owners)


def run_one(job: tuple[str, int, str]) -> RunFigures:
    """One run, meant for a fresh process (its peak RSS is then this run's). A policy name
    ending in `/scoped` runs with `Scheduler(scoped=True)` (decide only what events touched)."""
    name, batch, label = job
    policy, _, mode = label.partition("/")
    w = workload_for(name, batch)
    t0 = time.perf_counter()
    account = ShardAccount() if mode == "scoped" else None
    r = run(w, Policy(label, get_allocator(policy), scoped=account is not None),
            on_decision=account)
    wall = time.perf_counter() - t0
    times = sorted(r.decision_cpu_s)
    pick = lambda q: times[int(q * (len(times) - 1))] * 1e3 if times else 0.0
    return RunFigures(name, batch, label, max(1, batch // CORES_PER_NODE), len(r.records),
                      len(times), r.makespan, sum(times), pick(0.5), pick(0.99),
                      resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, wall,
                      max(account.cpu) if account else 0.0,
                      account.coordinator if account else 0.0, account.cross if account else 0)


def reference_dp_ms(reps: int = 30) -> float:
    """CPU time of one plain numpy DP, 64 x 16 x 256 (median), in this process."""
    tasks = reference_tasks(random.Random(1))
    plain_numpy_dp(tasks, 256)
    out = []
    for _ in range(reps):
        c0 = time.thread_time()
        plain_numpy_dp(tasks, 256)
        out.append(time.thread_time() - c0)
    return statistics.median(out) * 1e3


def run_all(jobs: list[tuple[str, int, str]], parallel: int) -> list[RunFigures]:
    ctx = multiprocessing.get_context("fork")
    out = []
    with ctx.Pool(parallel, maxtasksperchild=1) as pool:
        for f in pool.imap_unordered(run_one, jobs, chunksize=1):
            print(f"  done: {f.workload} {f.batch} {f.policy}: {f.decisions:,} decisions, "
                  f"{f.cpu_s:.1f} CPU s over {f.simulated_s:,.0f} simulated s = "
                  f"{f.share:.4f}, p99 {f.p99_ms:.3f} ms, wall {f.wall_s:.0f} s", flush=True)
            out.append(f)
    return sorted(out, key=lambda f: (f.workload, f.batch, f.policy))


def _table(figs: list[RunFigures], ref_ms: float, policy: str, baseline: str) -> Table:
    t = Table(title=f"scheduler at scale: {policy} (reference: {baseline} in the same run; "
                    f"plain numpy DP 64x16x256 = {ref_ms:.3f} ms CPU)")
    for c in ("workload", "batch", "cluster", "actions", "decisions", "sim s",
              "CPU s/sim s", f"{baseline} CPU s/sim s", "dec/sim s", "dec/CPU s", "p50 ms",
              "p99 ms (x DP)", "RSS MB", f"split {SHARDS}: shard/coord CPU s/sim s"):
        t.add_column(c)
    ref = {(f.workload, f.batch): f for f in figs if f.policy == baseline}
    for f in figs:
        if f.policy != policy:
            continue
        b = ref.get((f.workload, f.batch))
        t.add_row(f.workload, f"{f.batch:,}", f"{f.nodes} x {CORES_PER_NODE}", f"{f.actions:,}",
                  f"{f.decisions:,}", f"{f.simulated_s:,.0f}", f"{f.share:.4f}",
                  f"{b.share:.4f}" if b else "-",
                  f"{f.decisions / max(f.simulated_s, 1e-9):,.1f}",
                  f"{f.decisions / max(f.cpu_s, 1e-9):,.0f}", f"{f.p50_ms:.3f}",
                  f"{f.p99_ms:.3f} ({f.p99_ms / ref_ms:.2f}x)", f"{f.peak_rss_mb:,.0f}",
                  f"{f.shard_max_cpu_s / f.simulated_s:.4f} / "
                  f"{f.coordinator_cpu_s / f.simulated_s:.4f} ({f.cross_decisions} cross)"
                  if f.policy.endswith("/scoped") and f.simulated_s else "-")
    return t


def plot(figs: list[RunFigures], path: Path, ref_ms: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4.2))
    styles = itertools.cycle(("o-", "s--", "^-", "v--", "D-", "x--"))
    for (w, pol), style in zip(sorted({(f.workload, f.policy) for f in figs}), styles):
        xs = [f for f in figs if (f.workload, f.policy) == (w, pol)]
        ax.plot([f.batch for f in xs], [f.share for f in xs], style, label=f"{w} / {pol}")
        bx.plot([f.batch for f in xs], [f.p99_ms for f in xs], style, label=f"{w} / {pol}")
    ax.axhline(GOAL_SHARE, color="grey", lw=0.8, ls=":", label="goal 0.10")
    bx.axhline(ref_ms, color="grey", lw=0.8, ls=":", label="plain numpy DP 64x16x256")
    for a, yl in ((ax, "scheduler CPU s per simulated s"), (bx, "decision p99 (ms CPU)")):
        a.set_xscale("log", base=2)
        a.set_yscale("log")
        a.set_xlabel("batch (trajectories)")
        a.set_ylabel(yl)
        a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tangram bench scale", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help=f"batch {QUICK} only (CI)")
    p.add_argument("--sizes", type=int, nargs="*", help="batch sizes (overrides --quick)")
    p.add_argument("--workloads", nargs="*", default=["coding", "mixed"],
                   choices=["coding", "mixed"])
    p.add_argument("--policy", default="heuristic")
    p.add_argument("--no-scoped", action="store_true",
                   help="skip the policy's scoped run (Scheduler(scoped=True), docs/scale.md)")
    p.add_argument("--baseline", default="min", help="same-run reference policy")
    p.add_argument("--jobs", type=int, default=1, help="runs in parallel (one process each)")
    p.add_argument("--json", type=Path, help="write the figures here")
    p.add_argument("--plot", type=Path, default=Path("scale.png"), help="PNG of share vs batch")
    ns = p.parse_args(argv)
    sizes = ns.sizes or (QUICK if ns.quick else FULL)
    labels = [ns.policy, ns.baseline] + ([] if ns.no_scoped else [f"{ns.policy}/scoped"])
    jobs = [(w, b, pol) for w in ns.workloads for b in sizes for pol in labels]
    ref_before = reference_dp_ms()
    figs = run_all(jobs, max(1, ns.jobs))
    ref_ms = statistics.median([ref_before, reference_dp_ms()])
    for label in labels:
        if label != ns.baseline:
            Console(width=180).print(_table(figs, ref_ms, label, ns.baseline))
    top = [f for f in figs if f.policy != ns.baseline and f.batch == max(sizes)]
    for f in top:
        ok = f.share <= GOAL_SHARE and f.p99_ms <= ref_ms
        print(f"{f.workload} {f.policy} at batch {f.batch:,}: share {f.share:.4f} "
              f"(goal <= {GOAL_SHARE}), p99 {f.p99_ms:.3f} ms vs DP {ref_ms:.3f} ms: "
              f"{'met' if ok else 'NOT met'}")
    if ns.json:
        ns.json.write_text(json.dumps({"reference_dp_ms": ref_ms, "runs": [
            {**asdict(f), "share": f.share} for f in figs]}, indent=2))
    if ns.plot:
        plot(figs, ns.plot, ref_ms)
        print(f"plot: {ns.plot}")
    return 0

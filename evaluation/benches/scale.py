"""`tangram bench scale`: the scheduler's share of a core at frontier batch sizes, one process
against node shards (docs/scale.md).

Per batch size the workload runs closed-loop on a cluster sized with it (one core per
trajectory: batch / 128 nodes of 128 cores; the mixed workload adds GPU nodes and API slots in
proportion), on the virtual clock, in three configurations, each in a fresh process:

- `heuristic/scoped`: one scheduler process (`Scheduler(scoped=True)`);
- `heuristic/sharded`: `ShardedScheduler`, one worker process per `--nodes-per-shard` nodes and
  the global shard (GPU, APIs) in the router;
- `min`: FCFS at minimum amounts in one process, the cheapest policy, as the same-run reference;
  beside it one plain numpy DP of 64 tasks x 16 amounts x 256 units, timed in the same run.

Only a bounded window is measured: after `--warmup` simulated seconds, `--slices` slices of
`--window / --slices` simulated seconds each; the run stops at the window's end. Per slice:
the scheduler's CPU seconds per simulated second (one process: this thread's CPU in the
scheduler's `decide`, `enqueue` and `complete`; sharded: each shard process's own user + system
CPU from /proc/PID/stat, and the router's CPU in those calls apart). The window's figure is
its total over its length, the spread the slices' range. End-to-end decision latency: wall
time from an action's submission to its grant, for actions granted at the virtual instant they
arrived (both configurations, same run).

Worker processes (each run, each shard) die with the bench, however it ends (PR_SET_PDEATHSIG).

    tangram bench scale --sizes 2048 16384 --workloads coding     # minutes on 2 cores
    tangram bench scale --quick                                   # batch 256 and 512, seconds
    tangram bench scale --json                                    # the figures on stdout
    tangram bench scale --out results/                            # scale.json and scale.png
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import multiprocessing
import os
import random
import resource
import statistics
import sys
import time
from array import array
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import wait
from pathlib import Path

from rich.console import Console
from rich.table import Table

from evaluation.benches.heuristic import plain_numpy_dp, reference_tasks
from evaluation.closedloop import ClosedLoopSimulator, Policy
from evaluation.workloads import get_workload
from solvers import get_allocator
from tangram.runtime.shards import ShardedScheduler, die_with_parent, take_over
from tangram.scheduler import Scheduler

FULL = (2048, 4096, 8192, 16384)
QUICK = (256, 512)
CORES_PER_NODE = 128
GOAL_SHARE = 0.10
LABELS = ("heuristic/scoped", "heuristic/sharded", "min")


@dataclass(frozen=True, slots=True)
class Slice:
    """One slice of the window: [t0, t1) simulated seconds."""

    t0: float
    t1: float
    decisions: int
    share: float  # one process: its scheduler CPU; sharded: the router's (decide, queueing,
    # completions: this thread's CPU in those calls)
    shard_max: float = 0.0  # sharded: the busiest shard process's CPU per simulated second
    queued: int = 0  # actions queued at the slice's end


@dataclass(frozen=True)
class RunFigures:
    """One (workload, batch, configuration) run over its window."""

    workload: str
    batch: int
    policy: str
    nodes: int
    layout: str
    actions: int  # in the whole workload (the run stops at the window's end)
    window: tuple[float, float]  # simulated seconds measured
    decisions: int  # in the window
    share: float  # CPU s per simulated s over the window (one process, or the router)
    shard_shares: tuple[float, ...]  # sharded: each shard process over the window
    slices: tuple[Slice, ...]
    latency_ms: tuple[float, float, float]  # submit to grant, wall: p50, p99, max
    latency_n: int
    peak_rss_mb: float  # the run's process (sharded: the router's)
    generate_s: float
    wall_s: float  # the simulation up to the window's end
    shard_pids: tuple[int, ...] = ()
    run_cpu_s: float = 0.0  # CPU of the whole run (generation, simulation, shard processes)

    @property
    def busiest(self) -> float:
        return max(self.shard_shares, default=0.0)

    def spread(self, field_name: str = "share") -> tuple[float, float]:
        xs = [getattr(s, field_name) for s in self.slices]
        return (min(xs), max(xs)) if xs else (0.0, 0.0)


# workloads built in the bench's process, once per (workload, batch), before it forks that
# size's runs: each run reads its copy-on-write pages instead of building it again
_BUILT: dict[tuple[str, int], object] = {}
_BUILT_S: dict[tuple[str, int], float] = {}


def workload_for(name: str, batch: int):
    nodes = max(1, batch // CORES_PER_NODE)
    return get_workload("coding" if name == "coding" else "mixed", batch=batch, nodes=nodes,
                        cores_per_node=CORES_PER_NODE)


class _Timed:
    """Submit-to-grant wall latency, the virtual clock, and the scheduler's CPU in this process
    (this thread's CPU in `decide`, `enqueue` and `complete`: queueing an arrival and returning
    a completion's units are the scheduler's work too, and a shard process does them), on
    either scheduler. The CPU clock is read only in the window: on this VM a read of the thread
    clock is a system call of 10-90 us, more than most enqueues cost, and the warm-up makes
    millions of calls at 16,384."""

    clock = 0.0
    measuring = False
    cpu = 0.0
    probe: _Probe | None = None

    def _timed_init(self) -> None:
        self._t_in: dict[str, float] = {}
        self.latency = array("d")

    def enqueue(self, action) -> None:
        self._t_in[action.id] = time.perf_counter()
        if not self.measuring:
            return super().enqueue(action)  # type: ignore[misc]
        c0 = time.thread_time()
        super().enqueue(action)  # type: ignore[misc]
        self.cpu += time.thread_time() - c0

    def complete(self, *args, **kw):
        if not self.measuring:
            return super().complete(*args, **kw)  # type: ignore[misc]
        c0 = time.thread_time()
        out = super().complete(*args, **kw)  # type: ignore[misc]
        self.cpu += time.thread_time() - c0
        return out

    def decide(self, now: float):
        self.clock = now
        if self.measuring:
            c0 = time.thread_time()
            out = super().decide(now)  # type: ignore[misc]
            self.cpu += time.thread_time() - c0
        else:
            out = super().decide(now)  # type: ignore[misc]
        t = time.perf_counter()
        t_in = self._t_in
        for a in out:
            t0 = t_in.pop(a.action.id)
            if self.measuring and a.action.submit_time == now:
                self.latency.append(t - t0)
        if self.probe is not None:
            self.probe.after(self, now)
        return out


class TimedScheduler(_Timed, Scheduler):
    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self._timed_init()


class Handoff:
    """The sharded configuration's scheduler: one scoped `Scheduler` through the warm-up, then
    node shards that continue its state (`take_over`: its pools, bindings, profiles, running
    actions and queue) from the window's start on. The warm-up decides as the shards would
    (their grants equal the one process's on this workload: docs/scale.md, "Same decisions")
    at a fraction of the cost: a round trip per shard per decision on a loaded machine waits
    for the shard to be scheduled."""

    def __init__(self, pools, allocator, *, shards: int, kinds, scoped: bool = True,
                 **kw) -> None:
        self.inner: Scheduler | ShardedScheduler = Scheduler(pools, allocator, scoped=True,
                                                             **kw)
        self._shards, self._kinds = shards, kinds

    @property
    def sharded(self) -> bool:
        return isinstance(self.inner, ShardedScheduler)

    def switch(self) -> None:
        if not self.sharded:
            self.inner = take_over(self.inner, shards=self._shards, kinds=self._kinds,
                                   backend="process")
            for i in range(self._shards):  # each built and answering before its CPU is read
                self.inner.state(i)

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    def enqueue(self, action) -> None:
        self.inner.enqueue(action)

    def complete(self, *args, **kw):
        return self.inner.complete(*args, **kw)

    def decide(self, now: float):
        return self.inner.decide(now)

    def close(self) -> None:
        if self.sharded:
            self.inner.close()


class TimedSharded(_Timed, Handoff):
    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self._timed_init()


class WindowDone(Exception):
    """Raised from the decision hook once the window is measured: the run stops there."""


@dataclass
class _Probe:
    """Marks the slice boundaries of the window (simulated time): the scheduler's CPU so far,
    each shard's, the decisions, the queue."""

    sched: _Timed
    bounds: list[float]
    marks: list[tuple[float, float, list[float], int, int]] = field(default_factory=list)

    def after(self, sched: _Timed, now: float) -> None:
        if now < self.bounds[len(self.marks)]:
            return
        self.mark(now)
        sched.measuring = True
        if len(self.marks) == len(self.bounds):
            raise WindowDone

    def mark(self, now: float) -> None:
        if isinstance(self.sched, Handoff):
            self.sched.switch()  # the shards take over at the window's start
        shards = self.sched.shard_cpu_s() if isinstance(self.sched, Handoff) else []
        self.marks.append((now, self.sched.cpu, shards, self.sched.decisions,
                           len(self.sched.queue)))


def run_one(job: tuple[str, int, str, int, float, float, int]) -> RunFigures:
    name, batch, label, per_shard, warmup, window, slices = job
    policy, _, mode = label.partition("/")
    c0 = os.times()
    t0 = time.perf_counter()
    w = _BUILT.get((name, batch)) or workload_for(name, batch)
    gen = _BUILT_S.get((name, batch), time.perf_counter() - t0)
    nodes = max(1, batch // CORES_PER_NODE)
    make = TimedScheduler
    if mode == "sharded":
        make = functools.partial(TimedSharded, shards=max(1, nodes // per_shard),
                                 kinds={s.action.kind for t in w.trajectories for s in t.steps})
    sim = ClosedLoopSimulator(w, Policy(label, get_allocator(policy), scoped=bool(mode),
                                        make_scheduler=make))
    sched = sim.scheduler
    bounds = [warmup + window * i / slices for i in range(slices + 1)]
    probe = sched.probe = _Probe(sched, bounds)
    t1 = time.perf_counter()
    try:
        sim.run()
        probe.mark(sched.clock)  # the run ended inside the window: measure what there was
    except WindowDone:
        pass
    finally:
        wall = time.perf_counter() - t1
        sharded = isinstance(sched, Handoff) and sched.sharded
        pids = tuple(sched.shard_pids()) if sharded else ()
        layout = sched.describe() if sharded else "one process"
        if sharded:
            sched.close()  # joined: their CPU is in this process's children times now
        c1 = os.times()
    cpu = c1.user + c1.system + c1.children_user + c1.children_system - (
        c0.user + c0.system + c0.children_user + c0.children_system)
    f = _figures(name, batch, label, nodes, layout, w.num_actions, probe, sched, gen, wall,
                 pids)
    return dataclasses.replace(f, run_cpu_s=cpu)


def _figures(name, batch, label, nodes, layout, actions, probe, sched, gen, wall,
             pids) -> RunFigures:
    marks = probe.marks
    if len(marks) < 2:
        raise RuntimeError(f"{name} {batch} {label}: the run ended before the window "
                           f"({probe.bounds[0]} s of warm-up)")
    out = []
    for (a, ca, sa, da, _), (b, cb, sb, db, qb) in zip(marks, marks[1:]):
        dt = max(b - a, 1e-9)
        out.append(Slice(a, b, db - da, (cb - ca) / dt,
                         max((y - x for x, y in zip(sa, sb)), default=0.0) / dt, qb))
    (t0, c0, s0, d0, _), (t1, c1, s1, d1, _) = marks[0], marks[-1]
    span = max(t1 - t0, 1e-9)
    lat = sorted(sched.latency)
    pick = (lambda q: lat[int(q * (len(lat) - 1))] * 1e3) if lat else (lambda q: 0.0)
    return RunFigures(name, batch, label, nodes, layout, actions, (t0, t1), d1 - d0,
                      (c1 - c0) / span, tuple((y - x) / span for x, y in zip(s0, s1)),
                      tuple(out), (pick(0.5), pick(0.99), pick(1.0)), len(lat),
                      resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, gen, wall,
                      pids)


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


def _job_main(conn, parent: int, job) -> None:
    die_with_parent(parent)
    try:
        conn.send(run_one(job))
    except BaseException as exc:  # the bench reports it with the job's name
        conn.send(f"{type(exc).__name__}: {exc}")
    conn.close()
    os._exit(0)  # the figures are sent: no teardown of the simulated run's heap


def _build(key: tuple[str, int], log) -> None:
    t0 = time.perf_counter()
    _BUILT[key] = workload_for(*key)
    _BUILT_S[key] = time.perf_counter() - t0
    log(f"  built: {key[0]} {key[1]}: {_BUILT[key].num_actions:,} actions in "
        f"{_BUILT_S[key]:.1f} s (shared by its runs)")


def run_all(jobs: list, parallel: int, log=print) -> list[RunFigures]:
    """Each job in a fresh process forked from this thread (so a killed bench kills it)."""
    ctx = multiprocessing.get_context("fork")
    # the longest first (the biggest batch, shards before one process), so the short ones fill in
    rank = {"heuristic/sharded": 0, "heuristic/scoped": 1, "min": 2}
    todo = sorted(jobs, key=lambda j: (-j[1], rank.get(j[2], 9)))
    live, out = {}, []
    while todo or live:
        while todo and len(live) < parallel:
            job = todo.pop(0)
            key = (job[0], job[1])
            if key not in _BUILT:
                _build(key, log)
            ours, theirs = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_job_main, args=(theirs, os.getpid(), job),
                            name=f"scale-{job[0]}-{job[1]}-{job[2]}")
            p.start()
            theirs.close()
            live[ours] = (p, job)
            if not any((j[0], j[1]) == key for j in todo):
                _BUILT.pop(key)  # its last run is forked: this process lets go of it
        for conn in wait(list(live)):
            p, job = live.pop(conn)
            try:
                f = conn.recv()
            except EOFError:
                f = f"the run's process died (exit {p.exitcode})"
            p.join()
            if isinstance(f, str):
                raise RuntimeError(f"{job[0]} {job[1]} {job[2]}: {f}")
            log(_done_line(f))
            out.append(f)
    return sorted(out, key=lambda f: (f.workload, f.batch, f.policy))


def _done_line(f: RunFigures) -> str:
    lo, hi = f.spread("shard_max" if f.shard_shares else "share")
    head = (f"busiest shard {f.busiest:.4f} (slices {lo:.4f}-{hi:.4f}), router {f.share:.4f}"
            if f.shard_shares else f"share {f.share:.4f} (slices {lo:.4f}-{hi:.4f})")
    return (f"  done: {f.workload} {f.batch} {f.policy}: window {f.window[0]:.1f}-"
            f"{f.window[1]:.1f} sim s, {f.decisions:,} decisions, {head}, latency p50/p99 "
            f"{f.latency_ms[0]:.3f}/{f.latency_ms[1]:.3f} ms, wall {f.wall_s:.0f} s, CPU "
            f"{f.run_cpu_s:.0f} s")


def _table(figs: list[RunFigures], ref_ms: float) -> Table:
    t = Table(title=f"scheduler CPU per simulated second over the window (plain numpy DP "
                    f"64x16x256 in the same run: {ref_ms:.3f} ms CPU; min: same-run reference)")
    for c in ("workload", "batch", "config", "window sim s", "decisions", "one process / router",
              "busiest shard (slices)", "shards", "latency p50 / p99 ms", "RSS MB", "wall s",
              "run CPU s"):
        t.add_column(c)
    for f in figs:
        lo, hi = f.spread("shard_max" if f.shard_shares else "share")
        t.add_row(f.workload, f"{f.batch:,}", f.policy, f"{f.window[0]:.0f}-{f.window[1]:.0f}",
                  f"{f.decisions:,}",
                  f"{f.share:.4f}" + ("" if f.shard_shares else f" ({lo:.4f}-{hi:.4f})"),
                  f"{f.busiest:.4f} ({lo:.4f}-{hi:.4f})" if f.shard_shares else "-",
                  f"{len(f.shard_shares)}" if f.shard_shares else "-",
                  f"{f.latency_ms[0]:.3f} / {f.latency_ms[1]:.3f}", f"{f.peak_rss_mb:,.0f}",
                  f"{f.wall_s:.0f}", f"{f.run_cpu_s:.0f}")
    return t


def _doc(figs: list[RunFigures], ref_ms: float, ns) -> dict:
    runs = []
    for f in figs:
        d = asdict(f)
        d["busiest_shard"] = f.busiest
        d["spread"] = f.spread("shard_max" if f.shard_shares else "share")
        runs.append(d)
    return {"reference_dp_ms": ref_ms, "goal_share": GOAL_SHARE, "warmup_s": ns.warmup,
            "window_s": ns.window, "slices": ns.slices, "nodes_per_shard": ns.nodes_per_shard,
            "runs": runs}


def plot(figs: list[RunFigures], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for w in sorted({f.workload for f in figs}):
        for pol in sorted({f.policy for f in figs}):
            xs = [f for f in figs if (f.workload, f.policy) == (w, pol)]
            if not xs:
                continue
            ys = [f.busiest if f.shard_shares else f.share for f in xs]
            label = f"{w} / {pol}" + (" (busiest shard)" if xs[0].shard_shares else "")
            ax.plot([f.batch for f in xs], ys, "o-", label=label)
    ax.axhline(GOAL_SHARE, color="grey", lw=0.8, ls=":", label="goal 0.10")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("batch (trajectories)")
    ax.set_ylabel("scheduler CPU s per simulated s (window)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tangram bench scale", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help=f"batch {QUICK}, a short window (CI)")
    p.add_argument("--sizes", type=int, nargs="*", help="batch sizes (overrides --quick)")
    p.add_argument("--workloads", nargs="*", choices=["coding", "mixed"],
                   help="default: coding (and mixed with --quick)")
    p.add_argument("--configs", nargs="*", default=list(LABELS), choices=LABELS)
    p.add_argument("--nodes-per-shard", type=int, help="default 4 (1 with --quick)")
    p.add_argument("--warmup", type=float, help="simulated seconds before the window "
                   "(default 60; 10 with --quick)")
    p.add_argument("--window", type=float, help="simulated seconds measured (default 30; 20 "
                   "with --quick)")
    p.add_argument("--slices", type=int, default=6, help="slices of the window (the spread)")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                   help="runs in parallel, one process each (default: 2 or the cores, fewer)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON on stdout")
    p.add_argument("--out", type=Path, help="write scale.json and scale.png into this folder")
    ns = p.parse_args(argv)
    if ns.nodes_per_shard is None:
        ns.nodes_per_shard = 1 if ns.quick else 4
    if ns.nodes_per_shard < 1 or ns.slices < 1 or ns.jobs < 1:
        p.error("--nodes-per-shard, --slices and --jobs must be >= 1")
    sizes = ns.sizes or (QUICK if ns.quick else FULL)
    workloads = ns.workloads or (["coding", "mixed"] if ns.quick else ["coding"])
    ns.warmup = ns.warmup if ns.warmup is not None else (10.0 if ns.quick else 60.0)
    ns.window = ns.window if ns.window is not None else (20.0 if ns.quick else 30.0)
    if ns.warmup < 0 or ns.window <= 0:
        p.error("--warmup must be >= 0 and --window > 0")
    log = functools.partial(print, file=sys.stderr if ns.json else sys.stdout, flush=True)
    jobs = [(w, b, c, ns.nodes_per_shard, ns.warmup, ns.window, ns.slices)
            for w in workloads for b in sizes for c in ns.configs]
    ref_before = reference_dp_ms()
    figs = run_all(jobs, ns.jobs, log)
    ref_ms = statistics.median([ref_before, reference_dp_ms()])
    doc = _doc(figs, ref_ms, ns)
    if ns.json:
        print(json.dumps(doc, indent=2))
    else:
        Console(width=200).print(_table(figs, ref_ms))
        for f in figs:
            if f.shard_shares and f.batch == max(sizes):
                print(f"{f.workload} {f.policy} at batch {f.batch:,}: busiest shard "
                      f"{f.busiest:.4f} of a core (goal <= {GOAL_SHARE}): "
                      f"{'met' if f.busiest <= GOAL_SHARE else 'NOT met'}; {f.layout}")
    if ns.out:
        ns.out.mkdir(parents=True, exist_ok=True)
        (ns.out / "scale.json").write_text(json.dumps(doc, indent=2))
        plot(figs, ns.out / "scale.png")
        log(f"wrote {ns.out / 'scale.json'} and {ns.out / 'scale.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

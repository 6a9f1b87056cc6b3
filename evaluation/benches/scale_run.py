"""One run of `tangram bench scale` (the bench: `evaluation.benches.scale`): a workload closed-loop
on the virtual clock through one scheduler configuration, its CPU and latency measured over
the window's slices only."""

from __future__ import annotations

import dataclasses
import functools
import gc
import os
import resource
import time
from array import array
from dataclasses import dataclass, field

from evaluation.closedloop import ClosedLoopSimulator, Policy
from evaluation.workloads import get_workload
from solvers import get_allocator
from tangram.runtime.shards import ShardedScheduler, take_over
from tangram.scheduler import Scheduler

FULL = (2048, 4096, 8192, 16384)
QUICK = (256, 512)
CORES_PER_NODE = 128
GOAL_SHARE = 0.10  # the busiest scheduler process, CPU s per simulated s
GOAL_TOTAL_RATIO = 1.3  # the sharded scheduler's total CPU over the one process's
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
        """The busiest node shard's share (0 for one process)."""
        return max(self.shard_shares, default=0.0)

    @property
    def busiest_process(self) -> float:
        """The busiest scheduler process's share: one process's, or the larger of the
        router's and the busiest shard's."""
        return max(self.share, self.busiest)

    @property
    def total(self) -> float:
        """The whole scheduler's share: one process's, or the router's plus every shard's."""
        return self.share + sum(self.shard_shares)

    def spread(self, field_name: str = "share") -> tuple[float, float]:
        xs = [getattr(s, field_name) for s in self.slices]
        return (min(xs), max(xs)) if xs else (0.0, 0.0)


# workloads built in the bench's process, once per (workload, batch), before it forks that
# size's runs: each run reads its copy-on-write pages instead of building it again
BUILT: dict[tuple[str, int], object] = {}
BUILT_S: dict[tuple[str, int], float] = {}


def workload_for(name: str, batch: int):
    nodes = max(1, batch // CORES_PER_NODE)
    return get_workload(
        "coding" if name == "coding" else "mixed",
        batch=batch,
        nodes=nodes,
        cores_per_node=CORES_PER_NODE,
    )


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

    def _timed_init(self, target) -> None:
        self._t_in: dict[str, float] = {}
        self.latency = array("d")
        self._bind(target)

    def _bind(self, target) -> None:
        """Call `target`'s scheduler methods through bound methods taken once: neither layout
        is charged a `super()` or a forwarding frame per call (the bench's own layers, not the
        scheduler's work). `collect`, `settle`: None where the target has none."""
        self._call_enqueue, self._call_complete, self._call_decide = (
            target.enqueue,
            target.complete,
            target.decide,
        )
        self._call_collect = getattr(target, "collect", None)
        self._call_settle = getattr(target, "settle", None)

    def enqueue(self, action) -> None:
        self._t_in[action.id] = time.perf_counter()
        if not self.measuring:
            return self._call_enqueue(action)
        c0 = time.thread_time()
        self._call_enqueue(action)
        self.cpu += time.thread_time() - c0

    def complete(self, *args, **kw):
        if not self.measuring:
            return self._call_complete(*args, **kw)
        c0 = time.thread_time()
        out = self._call_complete(*args, **kw)
        self.cpu += time.thread_time() - c0
        return out

    def decide(self, now: float):
        self.clock = now
        if self.measuring:
            c0 = time.thread_time()
            out = self._call_decide(now)
            self.cpu += time.thread_time() - c0
        else:
            out = self._call_decide(now)
        t = time.perf_counter()
        t_in = self._t_in
        for a in out:
            t0 = t_in.pop(a.action.id)
            if self.measuring and a.action.submit_time == now:
                self.latency.append(t - t0)
        if self.probe is not None:
            self.probe.after(self, now)
        return out

    def collect(self):
        """The node shards' grants answered later (batched shards): CPU measured as the rest;
        the latency of each is its batch's round trip (`ShardedScheduler.wire_s`)."""
        c0 = time.thread_time() if self.measuring else 0.0
        out = self._call_collect()
        if self.measuring:
            self.cpu += time.thread_time() - c0
        wire = self.inner.wire_s
        for _, now, grants in out:
            for a in grants:
                self._t_in.pop(a.action.id, None)
                dt = wire.pop(a.action.id, None)
                if self.measuring and dt is not None and a.action.submit_time == now:
                    self.latency.append(dt)
        return out

    def settle(self) -> None:
        if self._call_settle is None:  # one process, or the shards not started yet
            return
        c0 = time.thread_time()
        self._call_settle()
        self.cpu += time.thread_time() - c0


class TimedScheduler(_Timed, Scheduler):
    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self._timed_init(super(_Timed, self))


class Handoff:
    """The sharded configuration's scheduler: one scoped `Scheduler` through the warm-up, then
    node shards that continue its state (`take_over`: its pools, bindings, profiles, running
    actions and queue) from the window's start on. The warm-up decides as the shards would
    (their grants equal the one process's on this workload: docs/scale.md, "Same decisions")
    at a fraction of the cost: a round trip per shard per decision on a loaded machine waits
    for the shard to be scheduled."""

    def __init__(self, pools, allocator, *, shards: int, kinds, scoped: bool = True, **kw) -> None:
        self.inner: Scheduler | ShardedScheduler = Scheduler(pools, allocator, scoped=True, **kw)
        self._shards, self._kinds = shards, kinds

    @property
    def sharded(self) -> bool:
        return isinstance(self.inner, ShardedScheduler)

    def switch(self) -> None:
        if not self.sharded:
            self.inner = take_over(
                self.inner,
                shards=self._shards,
                kinds=self._kinds,
                backend="process",
                batched=True,
            )
            self.inner.wire_s = {}
            for i in range(self._shards):  # each built and answering before its CPU is read
                self.inner.state(i)

    def __getattr__(self, name: str):
        """Everything else of the scheduler it stands for (`TimedSharded` calls the scheduler's
        own methods through `_Timed._bind`)."""
        return getattr(self.inner, name)

    def close(self) -> None:
        if self.sharded:
            self.inner.close()


class TimedSharded(_Timed, Handoff):
    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self._timed_init(self.inner)

    def switch(self) -> None:
        super().switch()
        self._bind(self.inner)  # the shards' router from here on


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
        if not sched.measuring:
            # the collector's passes walk the simulator's heap (its records, the workload) and
            # land in whichever call allocates at that moment: off in the run process over the
            # window, for every configuration alike (a shard process keeps its own collector)
            gc.freeze()
            gc.disable()
        sched.measuring = True
        if len(self.marks) == len(self.bounds):
            raise WindowDone

    def mark(self, now: float) -> None:
        if isinstance(self.sched, Handoff):
            self.sched.switch()  # the shards take over at the window's start
            self.sched.settle()  # what the shards owe up to here is in their CPU
        shards = self.sched.shard_cpu_s() if isinstance(self.sched, Handoff) else []
        self.marks.append(
            (now, self.sched.cpu, shards, self.sched.decisions, len(self.sched.queue))
        )


def run_one(job: tuple[str, int, str, int, float, float, int]) -> RunFigures:
    name, batch, label, per_shard, warmup, window, slices = job
    policy, _, mode = label.partition("/")
    c0 = os.times()
    t0 = time.perf_counter()
    w = BUILT.get((name, batch)) or workload_for(name, batch)
    gen = BUILT_S.get((name, batch), time.perf_counter() - t0)
    nodes = max(1, batch // CORES_PER_NODE)
    make = TimedScheduler
    if mode == "sharded":
        make = functools.partial(
            TimedSharded,
            shards=max(1, nodes // per_shard),
            kinds={s.action.kind for t in w.trajectories for s in t.steps},
        )
    sim = ClosedLoopSimulator(
        w, Policy(label, get_allocator(policy), scoped=bool(mode), make_scheduler=make)
    )
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
    cpu = (
        c1.user
        + c1.system
        + c1.children_user
        + c1.children_system
        - (c0.user + c0.system + c0.children_user + c0.children_system)
    )
    f = _figures(name, batch, label, nodes, layout, w.num_actions, probe, sched, gen, wall, pids)
    return dataclasses.replace(f, run_cpu_s=cpu)


def _figures(
    name, batch, label, nodes, layout, actions, probe, sched, gen, wall, pids
) -> RunFigures:
    marks = probe.marks
    if len(marks) < 2:
        raise RuntimeError(
            f"{name} {batch} {label}: the run ended before the window "
            f"({probe.bounds[0]} s of warm-up)"
        )
    out = []
    for (a, ca, sa, da, _), (b, cb, sb, db, qb) in zip(marks, marks[1:]):
        dt = max(b - a, 1e-9)
        out.append(
            Slice(
                a,
                b,
                db - da,
                (cb - ca) / dt,
                max((y - x for x, y in zip(sa, sb)), default=0.0) / dt,
                qb,
            )
        )
    (t0, c0, s0, d0, _), (t1, c1, s1, d1, _) = marks[0], marks[-1]
    span = max(t1 - t0, 1e-9)
    lat = sorted(sched.latency)
    pick = (lambda q: lat[int(q * (len(lat) - 1))] * 1e3) if lat else (lambda q: 0.0)
    return RunFigures(
        name,
        batch,
        label,
        nodes,
        layout,
        actions,
        (t0, t1),
        d1 - d0,
        (c1 - c0) / span,
        tuple((y - x) / span for x, y in zip(s0, s1)),
        tuple(out),
        (pick(0.5), pick(0.99), pick(1.0)),
        len(lat),
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        gen,
        wall,
        pids,
    )

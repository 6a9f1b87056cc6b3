"""Benchmarks of the heuristic: `tangram bench dparrange` and `tangram bench scheduler`."""

from __future__ import annotations

import argparse
import gc
import random
import resource
import statistics
import time

import numpy as np
from rich.console import Console
from rich.table import Table

from evaluation.closedloop import EnvironmentStart, Policy, run
from evaluation.grant_recording import open_instance
from evaluation.runtime_sim import run_on_runtime
from evaluation.simulator import simulate
from evaluation.workloads import get_workload
from solvers import get_allocator
from solvers.heuristic.dparrange import dp_arrange
from tangram import Action, ClusterView, Elasticity
from tangram.instance import parse_instance
from tangram.pools import FlatPool
from tangram.profiles import amdahl_efficiency
from topology import ChunkOperator, FlatOperator, operators


def _timeit(fn, reps: int) -> list[float]:
    """CPU seconds of this thread per call (`time.thread_time`): on a machine shared with
    other work the wall clock counts their time too."""
    fn()  # warm caches
    out = []
    for _ in range(reps):
        t0 = time.thread_time()
        fn()
        out.append(time.thread_time() - t0)
    return out


def plain_numpy_dp(tasks: list[dict[int, float]], capacity: int) -> float:
    """The same-run reference: a textbook multiple-choice knapsack DP in plain numpy (min total
    duration, every task one amount, total <= capacity), no caching, no operators. A machine
    2x slower makes this 2x slower too, so ratios to it compare across machines."""
    inf = np.inf
    best = np.full(capacity + 1, inf)
    best[0] = 0.0
    for task in tasks:
        nxt = np.full(capacity + 1, inf)
        for m, d in task.items():
            np.minimum(nxt[m:], best[: capacity + 1 - m] + d, out=nxt[m:])
        best = nxt
    return float(best.min())


def reference_tasks(rng: random.Random) -> list[dict[int, float]]:
    """64 tasks x 16 amounts over 256 units: the reference DP's input."""
    out = []
    for _ in range(64):
        amounts = sorted(rng.sample(range(1, 65), 16))
        t_ori = rng.uniform(1, 100)
        out.append({m: t_ori / (m**0.8) for m in amounts})
    return out


def _report(title: str, rows: list[tuple[str, str, str]]) -> None:
    t = Table(title=title)
    for c in ("measure", "value", "goal"):
        t.add_column(c)
    for r in rows:
        t.add_row(*r)
    Console().print(t)


def dparrange(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tangram bench dparrange")
    p.add_argument("--reps", type=int, default=200)
    ns = p.parse_args(argv)
    rng = random.Random(0)
    flat_tasks = reference_tasks(rng)
    chunk_tasks = []
    for _ in range(64):
        t_ori = rng.uniform(1, 100)
        chunk_tasks.append({m: t_ori / (m**0.8) for m in (1, 2, 4, 8)})

    flat = _timeit(lambda: dp_arrange(flat_tasks, FlatOperator(256)), ns.reps)

    def cold() -> None:
        operators._INDEX_CACHE.clear()  # as if every task's amount set were new
        dp_arrange(flat_tasks, FlatOperator(256))

    flat_cold = _timeit(cold, ns.reps)
    chunk = _timeit(lambda: dp_arrange(chunk_tasks, ChunkOperator({8: 16})), ns.reps)
    ref = _timeit(lambda: plain_numpy_dp(flat_tasks, 256), ns.reps)
    ms = lambda xs: f"{statistics.median(xs) * 1e3:.3f} ms"
    ratio = statistics.median(flat) / statistics.median(ref)
    _report(
        f"dp_arrange (median over {ns.reps} runs)",
        [
            ("reference: plain numpy DP, same 64 x 16 tasks, 256 units", ms(ref), "same run"),
            (
                "64 tasks x 16 amounts, FlatOperator(256)",
                f"{ms(flat)} ({ratio:.2f}x reference)",
                "<= 2 ms",
            ),
            (
                "  same, gather indices not cached (new amount sets)",
                f"{ms(flat_cold)} ({statistics.median(flat_cold) / statistics.median(ref):.2f}x "
                "reference)",
                "",
            ),
            (
                "64 tasks x {1,2,4,8}, ChunkOperator({8: 16})",
                f"{ms(chunk)} ({statistics.median(chunk) / statistics.median(ref):.2f}x reference)",
                "report",
            ),
            ("  chunk operator states", str(ChunkOperator({8: 16}).num_states), ""),
        ],
    )
    return 0


def _scheduler_view(rng: random.Random):
    pool = FlatPool("cpu", {"node0": 256})
    queue = []
    for i in range(1000):
        if i % 2 == 0:
            amounts = sorted({4, *rng.sample(range(5, 65), 15)})
            alpha = rng.uniform(0.0, 0.2)
            eff = {m: amdahl_efficiency(m, alpha) for m in amounts}
            queue.append(
                Action(
                    f"a{i}",
                    {"cpu": amounts},
                    elasticity=Elasticity("cpu", rng.uniform(10, 100), eff),
                )
            )
        else:
            queue.append(Action(f"a{i}", {"cpu": 4}, duration=rng.uniform(0.1, 5)))
    return ClusterView({"cpu": pool}), queue


def _scheduler_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tangram bench scheduler")
    p.add_argument("--reps", type=int, default=300)
    p.add_argument("--actions", type=int, default=100_000, help="simulated actions")
    p.add_argument("--queue", type=int, default=10_000, help="queued actions, multi-node case")
    return p


def scheduler(argv: list[str]) -> int:
    p = _scheduler_parser()
    ns = p.parse_args(argv)

    rng = random.Random(0)
    view, queue = _scheduler_view(rng)
    alloc = get_allocator("heuristic", depth=2)
    got = alloc.allocate(view, queue, 0.0)
    times = sorted(_timeit(lambda: alloc.allocate(view, queue, 0.0), ns.reps))
    med, p99 = statistics.median(times), times[int(0.99 * (len(times) - 1))]

    bf = get_allocator("backfill", depth=2)
    bf_times = sorted(_timeit(lambda: bf.allocate(view, queue, 0.0), ns.reps))
    bf_med = statistics.median(bf_times)

    ref = statistics.median(
        _timeit(lambda: plain_numpy_dp(reference_tasks(random.Random(1)), 256), 50)
    )
    cpu, wall, decisions = _simulator_run(ns.actions)
    one, two = _queue_rates(ns.queue)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    _report(
        "heuristic scheduler",
        [
            ("reference: plain numpy DP, 64 x 16 x 256", f"{ref * 1e3:.3f} ms", "same run"),
            ("decision: queue 1,000, 64 fit, 256 units, half elastic x16", "", ""),
            ("  started by the decision", str(len(got)), ""),
            ("  median decision", f"{med * 1e3:.3f} ms ({med / ref:.2f}x reference)", "<= 1 ms"),
            ("  p99 decision", f"{p99 * 1e3:.3f} ms ({p99 / ref:.2f}x reference)", "<= 5 ms"),
            (
                "  backfill: median decision",
                f"{bf_med * 1e3:.3f} ms ({bf_med / med:.2f}x)",
                "<= 1.5x heuristic",
            ),
            (f"simulator, {ns.actions:,} actions on 256 units", "", ""),
            (
                "  throughput",
                f"{ns.actions / cpu:,.0f} actions/CPU s ({ns.actions / wall:,.0f} a wall s)",
                ">= 50,000 actions/s",
            ),
            ("  CPU s / decisions", f"{cpu:.1f} s / {decisions:,.0f}", ""),
            (
                "  per decision",
                f"{cpu / max(decisions, 1) * 1e3:.3f} ms CPU "
                f"({cpu / max(decisions, 1) / ref:.2f}x reference)",
                "",
            ),
            ("  peak RSS of this process", f"{rss:,.0f} MB", "< 1 GB"),
            (f"queue of {ns.queue:,} bound to one busy node, 4 units", "", ""),
            ("  one node", f"{one:,.0f} actions/CPU s (median of 3)", ""),
            (
                "  two nodes, the other idle",
                f"{two:,.0f} actions/CPU s ({one / two:.2f}x slower)",
                "within 2x of one node",
            ),
            *_closed_loop_rows(ref),
        ],
    )
    return 0


def _closed_loop_rows(ref: float) -> list[tuple[str, str, str]]:
    """The closed loop (AI coding, batch 128 on 128 cores, heuristic depth 2) on the engine and
    through the runtime's own facade on virtual time (`evaluation.runtime_sim`): what running
    production code end to end costs. CPU seconds of this process (the wall clock swings with
    a shared machine's load); an action's time beside the reference DP's."""
    w = get_workload("coding", batch=128, nodes=1, cores_per_node=128)
    t0 = time.process_time()
    eng = run(w, Policy("tangram", get_allocator("heuristic", depth=2)))
    t1 = time.process_time()
    rt = run_on_runtime(w, "heuristic", EnvironmentStart().start_s, {"depth": 2})
    t2 = time.process_time()
    n = len(eng.records)
    same = all(
        abs(rt.records[a].start - r.start) < 1e-6 and dict(rt.records[a].units) == dict(r.units)
        for a, r in eng.records.items()
    )
    rate_e, rate_r = n / (t1 - t0), n / (t2 - t1)
    return [
        (f"closed loop, AI coding batch 128 on 128 cores ({n:,} actions)", "", ""),
        (
            "  engine (evaluation.engine)",
            f"{rate_e:,.0f} actions/CPU s "
            f"({(t1 - t0) / n * 1e6:.0f} us an action, reference DP {ref * 1e6:.0f} us)",
            "",
        ),
        (
            "  runtime facade on virtual time",
            f"{rate_r:,.0f} actions/CPU s ({rate_e / rate_r:.2f}x the engine's cost)",
            "grants identical",
        ),
        ("  grants identical", str(same), "True"),
    ]


def _simulator_run(actions: int) -> tuple[float, float, int]:
    """The open-loop simulator over `actions` actions on 256 units: (CPU s, wall s, decisions).
    What lives before the run is frozen out of the collector's passes, and the run's records
    are dropped after it, so the queue runs that follow do not walk them."""
    inst = open_instance(actions, 256, seed=0)
    gc.collect()
    gc.freeze()
    t0, c0 = time.perf_counter(), time.process_time()
    res = simulate(inst, get_allocator("heuristic"))
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    decisions = int(res.counters["decisions"])
    del res
    gc.unfreeze()
    return cpu, wall, decisions


def _queue_rates(n: int, reps: int = 3) -> tuple[float, float]:
    """`_queue_rate` on one node and on two, alternated `reps` times: the medians."""
    one, two = [], []
    for _ in range(reps):
        one.append(_queue_rate(n, 1))
        two.append(_queue_rate(n, 2))
    return statistics.median(one), statistics.median(two)


def _queue_rate(n: int, nodes: int) -> float:
    """Actions per second through the simulator when `n` actions arrive at once, all bound to
    node `busy`; with `nodes` = 2 an idle node sits beside it (the case a plain FCFS scan walks
    the whole queue for, on every decision)."""
    sizes = {"busy": 4, "idle": 4} if nodes == 2 else {"busy": 4}
    acts = [
        {"id": f"q{i}", "arrival": 0.0, "node": "busy", "demand": {"cpu": [1]}, "duration": 0.01}
        for i in range(n)
    ]
    inst = parse_instance(
        {"resources": {"cpu": {"topology": "flat", "nodes": sizes}}, "actions": acts}
    )
    gc.collect()
    t0 = time.process_time()
    simulate(inst, get_allocator("heuristic"))
    return n / (time.process_time() - t0)

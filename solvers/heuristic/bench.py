"""Benchmarks of the heuristic: `tangram bench dparrange` and `tangram bench scheduler`."""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import time

from rich.console import Console
from rich.table import Table

from solvers.heuristic.dparrange import dp_arrange
from topology import ChunkOperator, FlatOperator


def _timeit(fn, reps: int) -> list[float]:
    fn()  # warm caches
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
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
    flat_tasks = []
    for _ in range(64):
        amounts = sorted(rng.sample(range(1, 65), 16))
        t_ori = rng.uniform(1, 100)
        flat_tasks.append({m: t_ori / (m ** 0.8) for m in amounts})
    chunk_tasks = []
    for _ in range(64):
        t_ori = rng.uniform(1, 100)
        chunk_tasks.append({m: t_ori / (m ** 0.8) for m in (1, 2, 4, 8)})
    from topology import operators

    flat = _timeit(lambda: dp_arrange(flat_tasks, FlatOperator(256)), ns.reps)

    def cold() -> None:
        operators._INDEX_CACHE.clear()  # as if every task's amount set were new
        dp_arrange(flat_tasks, FlatOperator(256))

    flat_cold = _timeit(cold, ns.reps)
    chunk = _timeit(lambda: dp_arrange(chunk_tasks, ChunkOperator({8: 16})), ns.reps)
    ms = lambda xs: f"{statistics.median(xs) * 1e3:.3f} ms"
    _report(f"dp_arrange (median over {ns.reps} runs)", [
        ("64 tasks x 16 amounts, FlatOperator(256)", ms(flat), "<= 2 ms"),
        ("  same, gather indices not cached (new amount sets)", ms(flat_cold), ""),
        ("64 tasks x {1,2,4,8}, ChunkOperator({8: 16})", ms(chunk), "report"),
        ("  chunk operator states", str(ChunkOperator({8: 16}).num_states), ""),
    ])
    return 0


def _scheduler_view(rng: random.Random):
    from tangram import Action, ClusterView, Elasticity
    from tangram.pools import FlatPool

    pool = FlatPool("cpu", {"node0": 256})
    queue = []
    for i in range(1000):
        if i % 2 == 0:
            amounts = sorted({4, *rng.sample(range(5, 65), 15)})
            alpha = rng.uniform(0.0, 0.2)
            eff = {m: 1.0 / (m * (alpha + (1 - alpha) / m)) for m in amounts}
            queue.append(Action(f"a{i}", {"cpu": amounts},
                                elasticity=Elasticity("cpu", rng.uniform(10, 100), eff)))
        else:
            queue.append(Action(f"a{i}", {"cpu": 4}, duration=rng.uniform(0.1, 5)))
    return ClusterView({"cpu": pool}), queue


def _sim_instance(n: int, rng: random.Random):
    from tangram.instance import parse_instance

    acts, t = [], 0.0
    for i in range(n):
        t += rng.expovariate(1 / 0.02)
        if i % 4 == 0:
            amounts = [1, 2, 4, 8, 16]
            acts.append({"id": f"a{i}", "arrival": t, "key": "cpu", "demand": {"cpu": amounts},
                         "t_ori": rng.uniform(1, 8),
                         "efficiency": {str(m): 1 / (m * (0.1 + 0.9 / m)) for m in amounts}})
        else:
            acts.append({"id": f"a{i}", "arrival": t, "demand": {"cpu": [1]},
                         "duration": rng.uniform(0.05, 1.0)})
    return parse_instance({"resources": {"cpu": {"topology": "flat", "units": 256}},
                           "actions": acts})


def scheduler(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tangram bench scheduler")
    p.add_argument("--reps", type=int, default=300)
    p.add_argument("--actions", type=int, default=100_000, help="simulated actions")
    ns = p.parse_args(argv)
    from evaluation.simulator import simulate
    from solvers import get_allocator

    rng = random.Random(0)
    view, queue = _scheduler_view(rng)
    alloc = get_allocator("heuristic", depth=2)
    got = alloc.allocate(view, queue, 0.0)
    times = sorted(_timeit(lambda: alloc.allocate(view, queue, 0.0), ns.reps))
    med, p99 = statistics.median(times), times[int(0.99 * (len(times) - 1))]

    # -- issue 16: backfill beside heuristic, same view, same run --------------------------
    bf = get_allocator("backfill", depth=2)
    bf_times = sorted(_timeit(lambda: bf.allocate(view, queue, 0.0), ns.reps))
    bf_med = statistics.median(bf_times)
    # -- end issue 16 ------------------------------------------------------------------------

    inst = _sim_instance(ns.actions, rng)
    t0 = time.perf_counter()
    res = simulate(inst, get_allocator("heuristic"))
    wall = time.perf_counter() - t0
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    _report("heuristic scheduler", [
        ("decision: queue 1,000, 64 fit, 256 units, half elastic x16", "", ""),
        ("  started by the decision", str(len(got)), ""),
        ("  median decision", f"{med * 1e3:.3f} ms", "<= 1 ms"),
        ("  p99 decision", f"{p99 * 1e3:.3f} ms", "<= 5 ms"),
        ("  backfill: median decision", f"{bf_med * 1e3:.3f} ms ({bf_med / med:.2f}x)",
         "<= 1.5x heuristic"),  # issue 16
        (f"simulator, {ns.actions:,} actions on 256 units", "", ""),
        ("  throughput", f"{ns.actions / wall:,.0f} actions/s", ">= 50,000 actions/s"),
        ("  wall time / decisions", f"{wall:.1f} s / {res.counters['decisions']:,.0f}", ""),
        ("  peak RSS of this process", f"{rss:,.0f} MB", "< 1 GB"),
    ])
    return 0

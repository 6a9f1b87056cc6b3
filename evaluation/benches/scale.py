"""`tangram bench scale`: the scheduler's share of a core at frontier batch sizes, one process
against node shards (docs/scale.md).

Per batch size the workload runs closed-loop on a cluster sized with it (one core per
trajectory: batch / 128 nodes of 128 cores; the mixed workload adds GPU nodes and API slots in
proportion), on the virtual clock, in three configurations, each in a fresh process:

- `heuristic/scoped`: one scheduler process (`Scheduler(scoped=True)`);
- `heuristic/sharded`: `ShardedScheduler` (batched), one worker process per `--nodes-per-shard`
  nodes (default 16) and the global shard (GPU, APIs) in the router;
- `min`: FCFS at minimum amounts in one process, the cheapest policy, as the same-run reference;
  beside it one plain numpy DP of 64 tasks x 16 amounts x 256 units, timed in the same run.

Only a bounded window is measured: after `--warmup` simulated seconds, `--slices` slices of
`--window / --slices` simulated seconds each; the run stops at the window's end. Per slice:
the scheduler's CPU seconds per simulated second (one process: this thread's CPU in the
scheduler's `decide`, `enqueue` and `complete`; sharded: each shard process's own user + system
CPU from /proc/PID/stat, and the router's CPU in those calls apart). The window's figure is
its total over its length, the spread the slices' range. Per layout the JSON names the
busiest scheduler process (`busiest_process_cpu_per_s`: one process, or the larger of the
router and the busiest shard), the total (`total_cpu_per_s`) and the latency
(`submit_to_grant_p50_ms`, `submit_to_grant_p99_ms`); `layouts` sets them side by side with
the sharded total over the one process's (docs/scale.md, "The JSON"). Latency: wall time
from an action's submission to its grant (sharded: the round trip of the batch that carried
it), for actions granted at the virtual instant they arrived.

Worker processes (each run, each shard) die with the bench, however it ends (PR_SET_PDEATHSIG).

    tangram bench scale --sizes 2048 16384 --workloads coding     # minutes on 2 cores
    tangram bench scale --quick                                   # batch 256 and 512, seconds
    tangram bench scale --json                                    # the figures on stdout
    tangram bench scale --out results/                            # scale.json and scale.png
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import os
import random
import statistics
import sys
import time
from multiprocessing.connection import wait
from pathlib import Path

from rich.console import Console

from evaluation.benches.heuristic import plain_numpy_dp, reference_tasks
from evaluation.benches.scale_report import document, done_line, plot, summary_line, table
from evaluation.benches.scale_run import (
    BUILT,
    BUILT_S,
    FULL,
    LABELS,
    QUICK,
    RunFigures,
    run_one,
    workload_for,
)
from tangram.runtime.shards import die_with_parent


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
    BUILT[key] = workload_for(*key)
    BUILT_S[key] = time.perf_counter() - t0
    log(
        f"  built: {key[0]} {key[1]}: {BUILT[key].num_actions:,} actions in "
        f"{BUILT_S[key]:.1f} s (shared by its runs)"
    )


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
            if key not in BUILT:
                _build(key, log)
            ours, theirs = ctx.Pipe(duplex=False)
            p = ctx.Process(
                target=_job_main,
                args=(theirs, os.getpid(), job),
                name=f"scale-{job[0]}-{job[1]}-{job[2]}",
            )
            p.start()
            theirs.close()
            live[ours] = (p, job)
            if not any((j[0], j[1]) == key for j in todo):
                BUILT.pop(key)  # its last run is forked: this process lets go of it
        for conn in wait(list(live)):
            p, job = live.pop(conn)
            try:
                f = conn.recv()
            except EOFError:
                f = f"the run's process died (exit {p.exitcode})"
            p.join()
            if isinstance(f, str):
                raise RuntimeError(f"{job[0]} {job[1]} {job[2]}: {f}")
            log(done_line(f))
            out.append(f)
    return sorted(out, key=lambda f: (f.workload, f.batch, f.policy))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="tangram bench scale",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--quick", action="store_true", help=f"batch {QUICK}, a short window (CI)")
    p.add_argument("--sizes", type=int, nargs="*", help="batch sizes (overrides --quick)")
    p.add_argument(
        "--workloads",
        nargs="*",
        choices=["coding", "mixed"],
        help="default: coding (and mixed with --quick)",
    )
    p.add_argument("--configs", nargs="*", default=list(LABELS), choices=LABELS)
    p.add_argument("--nodes-per-shard", type=int, help="default 16 (1 with --quick)")
    p.add_argument(
        "--warmup",
        type=float,
        help="simulated seconds before the window (default 60; 10 with --quick)",
    )
    p.add_argument(
        "--window", type=float, help="simulated seconds measured (default 30; 20 with --quick)"
    )
    p.add_argument("--slices", type=int, default=6, help="slices of the window (the spread)")
    p.add_argument(
        "--jobs",
        type=int,
        default=min(2, os.cpu_count() or 1),
        help="runs in parallel, one process each (default: 2 or the cores, fewer)",
    )
    p.add_argument("--json", action="store_true", help="print the figures as JSON on stdout")
    p.add_argument("--out", type=Path, help="write scale.json and scale.png into this folder")
    return p


def main(argv: list[str]) -> int:
    p = _parser()
    ns = p.parse_args(argv)
    if ns.nodes_per_shard is None:
        ns.nodes_per_shard = 1 if ns.quick else 16
    if ns.nodes_per_shard < 1 or ns.slices < 1 or ns.jobs < 1:
        p.error("--nodes-per-shard, --slices and --jobs must be >= 1")
    sizes = ns.sizes or (QUICK if ns.quick else FULL)
    workloads = ns.workloads or (["coding", "mixed"] if ns.quick else ["coding"])
    ns.warmup = ns.warmup if ns.warmup is not None else (10.0 if ns.quick else 60.0)
    ns.window = ns.window if ns.window is not None else (20.0 if ns.quick else 30.0)
    if ns.warmup < 0 or ns.window <= 0:
        p.error("--warmup must be >= 0 and --window > 0")
    log = functools.partial(print, file=sys.stderr if ns.json else sys.stdout, flush=True)
    jobs = [
        (w, b, c, ns.nodes_per_shard, ns.warmup, ns.window, ns.slices)
        for w in workloads
        for b in sizes
        for c in ns.configs
    ]
    ref_before = reference_dp_ms()
    figs = run_all(jobs, ns.jobs, log)
    ref_ms = statistics.median([ref_before, reference_dp_ms()])
    doc = document(figs, ref_ms, ns)
    if ns.json:
        print(json.dumps(doc, indent=2))
    else:
        Console(width=200).print(table(figs, ref_ms))
        for row in doc["layouts"]:
            if row["batch"] == max(sizes) and "sharded_total_over_one_process" in row:
                print(summary_line(row))
    if ns.out:
        ns.out.mkdir(parents=True, exist_ok=True)
        (ns.out / "scale.json").write_text(json.dumps(doc, indent=2))
        plot(figs, ns.out / "scale.png")
        log(f"wrote {ns.out / 'scale.json'} and {ns.out / 'scale.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""`tangram experiment twin [--quick] [--json]`: the simulator as a digital twin, validated.

Two workloads (`coding`: tool calls then a reward; `mixed`: tool calls and calls of a real HTTP
API on loopback behind Tangram's API pool, then a reward) at two loads (`fit`: as many
trajectories as cores; `over`: twice as many), `runs` times each (3; `--quick`: 1). Each run:

1. **calibrate** (`evaluation.twin_measure.calibrate`), immediately before the run: each
   command alone, each kind beside 1..cores copies of itself, environment starts, API calls,
   the client's own latency, the background load;
2. **predict offline** (`evaluation.twin_model.predict`): the plan simulated from that
   calibration alone, nothing of the run (the headline);
3. **run for real** through `Tangram.local()`, every action traced;
4. **replay** (`evaluation.twin_model.replay_workload`): the simulator fed the run's own
   measured gaps and run times, so only the queueing is modelled (a check of the scheduler's
   model, not a prediction).

It prints, per workload and load, the offline prediction's error in mean ACT, p99 ACT, step
time (batch start to the last action's end) and core utilisation (granted core-seconds over
cores x step time), the median over the runs with their spread, then the replay's, then the
ablations (each offline term switched off). `--json` keys: docs/architecture.md, "The
digital twin".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import statistics
import time
from collections.abc import Sequence
from dataclasses import replace

from rich.console import Console
from rich.table import Table

from evaluation.closedloop import EnvironmentStart
from evaluation.twin_measure import Observed, background, calibrate, measure, serve_api
from evaluation.twin_model import ABLATIONS, predict, replay_workload, simulate
from evaluation.twin_plan import LOADS, QUICK, WORKLOADS, TwinParams, plan, twin_kind
from tangram.runtime.config import DEFAULT_POLICY
from tangram.runtime.facade import Tangram

ERRORS = {  # the JSON's error key of each figure
    "mean_act_s": "mean_act_err",
    "p99_act_s": "p99_act_err",
    "step_s": "step_time_err",
    "core_utilisation": "utilisation_err",
}
FIGURES = tuple(ERRORS)
DIAGNOSTICS = ("mean_run_s", "mean_queued_s")  # where an ACT error comes from


def p99(xs: Sequence[float]) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, math.ceil(0.99 * len(s)) - 1)]


def figures(o: Observed) -> dict[str, float]:
    return {
        "mean_act_s": statistics.mean(o.acts),
        "p99_act_s": p99(o.acts),
        "step_s": o.step_s,
        "core_utilisation": o.busy / (o.cores * o.step_s),
        "mean_run_s": statistics.mean(o.runs),
        "mean_queued_s": statistics.mean(o.acts) - statistics.mean(o.runs),
    }


def _err(predicted: float, measured: float) -> float | None:
    return (predicted - measured) / measured if measured else None


async def _cores() -> int:
    async with Tangram.local() as tg:
        return tg.scheduler.pools[tg.cpu.resource].capacity()


def one_run(p: TwinParams, trajs, seed: int) -> dict:
    """Calibrate, predict offline, run for real, replay: one run's figures."""
    load0 = os.getloadavg()[0]
    t0 = time.monotonic()
    api = p.workload == "mixed"
    with serve_api(p.api_latency_s) if api else contextlib.nullcontext() as url:
        prof = asyncio.run(calibrate(p, trajs, url))
        now = asyncio.run(background())  # the other tenants, just before the run
        t1 = time.monotonic()
        offline = figures(predict(trajs, prof, p, seed=seed, background=now))
        real = asyncio.run(measure(p, trajs, prof.dops, url))
    t2 = time.monotonic()
    w = replay_workload(real, prof, p)
    replayed = figures(simulate(w, real.cores, EnvironmentStart(0.0)))
    by_runtime = None
    if not api:  # the runtime on virtual time has no API manager for a plain pool
        by_runtime = figures(simulate(w, real.cores, EnvironmentStart(0.0), on_runtime=True))
    return {
        "measured": figures(real),
        "offline": offline,
        "replay": replayed,
        "replay_by_runtime": by_runtime,
        "ablations": {
            name: figures(predict(trajs, prof, p, terms, seed=seed, background=now))
            for name, terms in ABLATIONS.items()
        },
        "background": {
            "calibration_threads": prof.background,
            "before_run_threads": now,
            "during_run_cores": real.background,
        },
        "load_avg_1m": [load0, os.getloadavg()[0]],
        "wall_s": {"calibrate": round(t1 - t0, 2), "run": round(t2 - t1, 2)},
        "profile": {
            "open_s": sorted(prof.opens),
            "cold_open_s": prof.cold_open,
            "api_s": prof.api_s,
            "client_overhead_s": prof.overhead_s,
            "slowdown": {k: prof.slowdown(k) for k in prof.corun},
            "run_s": {
                f"{twin_kind(c)} {c if isinstance(c, str) else 'reward'} @{m}": v
                for (c, m), v in prof.run_s.items()
            },
        },
    }


def summary(runs: list[dict], side: str) -> dict:
    """The `side` prediction against the measured figures: per figure the median of the
    per-run errors (`*_err`), their spread, and the medians of the values."""
    out: dict = {}
    per = {k: [_err(r[side][k], r["measured"][k]) for r in runs] for k in FIGURES + DIAGNOSTICS}
    for k, e in ERRORS.items():
        out[e] = statistics.median(per[k])
    out["errors_per_run"] = {ERRORS.get(k, k + "_err"): v for k, v in per.items()}
    out["spread"] = {ERRORS[k]: [min(per[k]), max(per[k])] for k in FIGURES}
    out["measured"] = {k: statistics.median(r["measured"][k] for r in runs) for k in per}
    out["predicted"] = {k: statistics.median(r[side][k] for r in runs) for k in per}
    return out


def _ablation(runs: list[dict], name: str) -> dict:
    return {
        e: statistics.median(_err(r["ablations"][name][k], r["measured"][k]) for r in runs)
        for k, e in ERRORS.items()
    }


def compare(p: TwinParams, workloads=WORKLOADS, loads=tuple(LOADS)) -> dict:
    """Every workload at every load, `p.runs` runs each (calibration, offline prediction,
    real run, replay)."""
    cores = asyncio.run(_cores())
    doc: dict = {
        "experiment": "twin",
        "cores": cores,
        "policy": DEFAULT_POLICY,
        "runs": p.runs,
        "offline": {},
        "replay": {},
        "ablations": {},
        "cells": {},
    }
    for wl in workloads:
        for load in loads:
            q = replace(p, workload=wl, trajectories=cores * LOADS[load])
            trajs = plan(q)
            runs = [one_run(q, trajs, seed) for seed in range(q.runs)]
            doc["offline"].setdefault(wl, {})[load] = summary(runs, "offline")
            doc["replay"].setdefault(wl, {})[load] = summary(runs, "replay")
            doc["ablations"].setdefault(wl, {})[load] = {n: _ablation(runs, n) for n in ABLATIONS}
            doc["cells"].setdefault(wl, {})[load] = {
                "trajectories": len(trajs),
                "actions": sum(len(t.steps) for t in trajs),
                "runs": runs,
            }
    return doc


def _pct(e: float | None) -> str:
    return "-" if e is None else f"{100 * e:+.1f}%"


def _table(doc: dict, side: str, title: str) -> Table:
    t = Table(title=title)
    for c in ("workload", "load", "figure", "measured", "predicted", "error", "per run"):
        t.add_column(c)
    for wl, by_load in doc[side].items():
        for load, s in by_load.items():
            for k in FIGURES + DIAGNOSTICS:
                e = ERRORS.get(k, k + "_err")
                t.add_row(
                    wl,
                    load,
                    k,
                    f"{s['measured'][k]:.3f}",
                    f"{s['predicted'][k]:.3f}",
                    _pct(statistics.median(s["errors_per_run"][e])),
                    ", ".join(_pct(x) for x in s["errors_per_run"][e]),
                )
    return t


def _ablations(doc: dict) -> Table:
    t = Table(title="offline error with each term switched off (median over runs)")
    for c in ("workload", "load", "model", *ERRORS.values()):
        t.add_column(c)
    for wl, by_load in doc["ablations"].items():
        for load, abl in by_load.items():
            rows = {"full": doc["offline"][wl][load], **abl}
            for name, errs in rows.items():
                t.add_row(wl, load, name, *(_pct(errs[e]) for e in ERRORS.values()))
    return t


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="tangram experiment twin",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--quick", action="store_true", help="small workloads, one run each")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--runs", type=int, help="runs per workload and load")
    ap.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=list(WORKLOADS))
    ap.add_argument("--loads", nargs="+", choices=tuple(LOADS), default=list(LOADS))
    ns = ap.parse_args(argv)
    p = QUICK if ns.quick else TwinParams()
    if ns.runs is not None:
        if ns.runs < 1:
            ap.error(f"--runs {ns.runs}: must be at least 1")
        p = replace(p, runs=ns.runs)
    doc = compare(p, tuple(ns.workloads), tuple(ns.loads))
    if ns.json:
        print(json.dumps(doc, indent=2))
        return 0
    c = Console()
    n = f"{doc['cores']} cores, policy {doc['policy']}, {doc['runs']} run(s) each"
    c.print(_table(doc, "offline", f"twin, OFFLINE prediction (calibration only): {n}"))
    c.print(_table(doc, "replay", "twin, replay (the run's own run times and gaps)"))
    c.print(_ablations(doc))
    return 0

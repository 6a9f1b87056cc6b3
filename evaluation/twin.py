"""`tangram experiment twin [--quick] [--json]`: the simulator as a digital twin, validated.

One small AI-coding workload (`evaluation.twin_plan`) is

1. **calibrated**: each command timed through `Tangram.local()` with the machine full of it
   (the tools on one core, the reward at every core count), the environment start likewise;
2. **run for real** `runs` times through `Tangram.local()` (real sandboxes, real commands,
   trajectories that start as a rollout batch does and wait an LLM gap before each action),
   every action traced (`Done`: its command, cores, submission, gap, queueing, run time);
3. **predicted**, each run by the closed-loop simulator (`evaluation.engine`, and again by
   the runtime itself on virtual time, `evaluation.runtime_sim`, which must agree) replaying
   its trace (`replay_workload`: the measured gaps and run times; an elastic action's time at
   other core counts from the calibrated speed-up), the same policy (the runtime's default)
   learning by the runtime's rule; and the plan once more from the calibrated profiles alone
   (`predicted_offline`: what a twin can say before any run).

It prints predicted against measured mean ACT, p99 ACT, step time (batch start to the last
action's end) and core utilisation (granted core-seconds over cores x step time), medians over
the runs, with each error. The replay leaves out machine noise between calibration and run
(on a loaded shared machine, by far the largest source: the offline error); exec overhead and
the client's latency are inside the measured times on both sides (docs/architecture.md, "The
digital twin").
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import statistics
import time
from collections.abc import Mapping, Sequence

from rich.console import Console
from rich.table import Table

from evaluation.closedloop import EnvironmentStart, Policy, run
from evaluation.runtime_sim import run_on_runtime
from evaluation.twin_measure import Observed, Profile, calibrate, measure
from evaluation.twin_plan import (
    QUICK,
    TIMEOUT_S,
    TwinParams,
    TwinTrajectory,
    plan,
    twin_kind,
)
from evaluation.workloads.base import Step, Trajectory, Workload
from solvers import get_allocator
from tangram.actions import Action, Elasticity
from tangram.pools import CorePool
from tangram.profiles import exec_kind
from tangram.runtime.config import DEFAULT_POLICY


# -- predicting ---------------------------------------------------------------------------------
def elastic_action(aid: str, run_s: Mapping[int, float], trajectory: str, kind: str) -> Action:
    """An elastic action that runs `run_s[m]` seconds on m cores, exactly: T_ori is the least
    m x run_s[m], so no efficiency exceeds 1 even where the measured times are superlinear
    (noise), and none is clipped (a clipped one would play a longer time than measured)."""
    t_ori = min(m * t for m, t in run_s.items())
    eff = {m: min(1.0, t_ori / (m * t)) for m, t in run_s.items()}
    return Action(
        aid,
        {"cpu": sorted(run_s)},
        elasticity=Elasticity("cpu", t_ori, eff),
        trajectory=trajectory,
        kind=kind,
        timeout=TIMEOUT_S,
    )


def twin_workload(trajs: Sequence[TwinTrajectory], prof: Profile) -> Workload:
    """The same trajectories for the simulator, each action's truth its command's profile."""
    out = []
    for t in trajs:
        steps = []
        for j, s in enumerate(t.steps):
            aid, kind = f"{t.id}.{j}", exec_kind(t.id, s.command, twin_kind(s.command))
            if s.elastic and len(prof.dops) > 1:
                act = elastic_action(
                    aid, {m: prof.run_s[(s.command, m)] for m in prof.dops}, t.id, kind
                )
            else:
                act = Action(
                    aid,
                    {"cpu": 1},
                    duration=prof.run_s[(s.command, 1)],
                    trajectory=t.id,
                    kind=kind,
                    timeout=TIMEOUT_S,
                )
            steps.append(Step(s.think_s, act))
        out.append(Trajectory(t.id, "coding", t.start, tuple(steps)))

    def pools():
        return {"cpu": CorePool("cpu", {prof.node.name: prof.node.copy()})}

    return Workload("twin", tuple(out), pools, None, tasks=("coding",))


def replay_workload(real: Observed, prof: Profile) -> Workload:
    """The real run's trajectories for the simulator: each starts when its environment was
    opened, each action is submitted after its measured gap (sleep overshoot and the client's
    own latency included), and runs its own measured time at the cores it got (at other core
    counts, an elastic one's time scaled by its calibrated speed-up)."""
    assert real.trace is not None
    out = []
    for tid, (start, done) in real.trace.items():
        steps = []
        for j, d in enumerate(done):
            aid, kind = f"{tid}.{j}", exec_kind(tid, d.command, twin_kind(d.command))
            if d.elastic and len(prof.dops) > 1:
                scale = d.run_s / prof.run_s[(d.command, d.cores)]
                act = elastic_action(
                    aid, {m: scale * prof.run_s[(d.command, m)] for m in prof.dops}, tid, kind
                )
            else:
                act = Action(
                    aid, {"cpu": 1}, duration=d.run_s, trajectory=tid, kind=kind, timeout=TIMEOUT_S
                )
            steps.append(Step(d.gap, act))
        out.append(Trajectory(tid, "coding", start, tuple(steps)))

    def pools():
        return {"cpu": CorePool("cpu", {prof.node.name: prof.node.copy()})}

    return Workload("twin", tuple(out), pools, None, tasks=("coding",))


def simulate(w: Workload, cores: int, open_s: float, on_runtime: bool = False) -> Observed:
    """The simulator's figures for `w`: the closed-loop engine, or (`on_runtime`) the runtime
    itself on virtual time with the sim backend (`evaluation.runtime_sim`); the two grant
    alike."""
    if on_runtime:
        r = run_on_runtime(w, DEFAULT_POLICY, open_s)
    else:
        r = run(w, Policy("tangram", get_allocator(DEFAULT_POLICY), EnvironmentStart(open_s)))
    busy = sum(x.units["cpu"] * (x.end - x.start) for x in r.records.values())
    return Observed(
        [x.end - x.arrival for x in r.records.values()],
        [x.end - x.start for x in r.records.values()],
        busy,
        r.makespan,
        cores,
    )


def predict(trajs: Sequence[TwinTrajectory], prof: Profile, on_runtime: bool = False) -> Observed:
    """The offline prediction: the plan with the calibrated profiles alone."""
    return simulate(twin_workload(trajs, prof), prof.node.capacity, prof.open_s, on_runtime)


# -- figures ------------------------------------------------------------------------------------
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


def compare(p: TwinParams) -> dict:
    """Calibrate, then `p.runs` real runs, each predicted by replaying it (`replay_workload`);
    each figure the median over the runs of the measured and of the predicted values."""
    trajs = plan(p)
    load = [os.getloadavg()[0]]
    t0 = time.monotonic()
    prof = asyncio.run(calibrate(p, trajs))
    t1 = time.monotonic()
    runs: list[tuple[dict, dict, dict]] = []
    for _ in range(p.runs):
        real = asyncio.run(measure(p, trajs, prof.dops))
        load.append(os.getloadavg()[0])
        w = replay_workload(real, prof)
        runs.append(
            (
                figures(real),
                figures(simulate(w, real.cores, 0.0)),
                figures(simulate(w, real.cores, 0.0, on_runtime=True)),
            )
        )
    t2 = time.monotonic()
    offline = figures(predict(trajs, prof))
    t3 = time.monotonic()
    doc: dict = {
        "experiment": "twin",
        "trajectories": len(trajs),
        "actions": sum(len(t.steps) for t in trajs),
        "cores": prof.node.capacity,
        "policy": DEFAULT_POLICY,
        "runs": p.runs,
        "load_avg_1m": {"start": load[0], "after_runs": load[1:]},
        "wall_s": {
            "calibrate": round(t1 - t0, 2),
            "measure": round(t2 - t1, 2),
            "simulate_offline": round(t3 - t2, 3),
        },
        "profile": {
            "open_s": prof.open_s,
            "run_s": {
                f"{twin_kind(c)} {c if isinstance(c, str) else 'reward'} @{m}": v
                for (c, m), v in prof.run_s.items()
            },
        },
    }
    for k in offline:
        m = statistics.median(r[0][k] for r in runs)
        pr = statistics.median(r[1][k] for r in runs)
        doc[k] = {
            "predicted": pr,
            "measured": m,
            "error": _err(pr, m),
            "predicted_by_runtime": statistics.median(r[2][k] for r in runs),
            "error_per_run": [_err(r[1][k], r[0][k]) for r in runs],
            "predicted_offline": offline[k],
            "error_offline": _err(offline[k], m),
        }
    return doc


def _err(predicted: float, measured: float) -> float | None:
    return (predicted - measured) / measured if measured else None


FIGURES = ("mean_act_s", "p99_act_s", "step_s", "core_utilisation")
DIAGNOSTICS = ("mean_run_s", "mean_queued_s")  # where an ACT error comes from


def _pct(e: float | None) -> str:
    return "-" if e is None else f"{100 * e:+.1f}%"


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="tangram experiment twin",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--quick", action="store_true", help="a small workload, well under 1 min")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--trajectories", type=int, help="override the workload's size")
    ns = ap.parse_args(argv)
    p = QUICK if ns.quick else TwinParams()
    if ns.trajectories is not None:
        if ns.trajectories < 1:
            ap.error(f"--trajectories {ns.trajectories}: must be at least 1")
        p = TwinParams(**{**p.__dict__, "trajectories": ns.trajectories})
    doc = compare(p)
    if ns.json:
        print(json.dumps(doc, indent=2))
        return 0
    la = doc["load_avg_1m"]
    t = Table(
        title=f"twin: {doc['trajectories']} trajectories, {doc['actions']} actions on "
        f"{doc['cores']} cores, policy {doc['policy']}, medians of {doc['runs']} "
        f"real runs (calibrate {doc['wall_s']['calibrate']} s, runs "
        f"{doc['wall_s']['measure']} s; load average {la['start']:.1f} at start, "
        f"{', '.join(f'{x:.1f}' for x in la['after_runs'])} after each run)"
    )
    for c in ("figure", "predicted", "measured", "error", "offline", "offline error"):
        t.add_column(c)
    for k in FIGURES + DIAGNOSTICS:
        f = doc[k]
        t.add_row(
            k,
            f"{f['predicted']:.3f}",
            f"{f['measured']:.3f}",
            _pct(f["error"]),
            f"{f['predicted_offline']:.3f}",
            _pct(f["error_offline"]),
        )
    Console().print(t)
    return 0

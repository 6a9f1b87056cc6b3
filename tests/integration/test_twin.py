"""The digital twin in CI (`tangram experiment twin --quick`): both workloads (AI coding;
mixed CPU + a real loopback HTTP API) at both loads (as many trajectories as cores, twice
as many), one run each, each run calibrated immediately before it.

- The **offline** prediction (calibration only, made before the run starts): for each
  figure, the median over the four workload x load cells of |ln(predicted / measured)| within
  `POOLED` (a factor of 2 for mean ACT and step time, 2.5 for p99, 1.35 for utilisation),
  and every cell within `CELL` (a factor of 5). Defended by three quick runs on the shared
  2-core machine at load average 8-12 (docs/architecture.md, "The digital twin"): pooled
  factors 1.07-1.52 (mean ACT), 1.14-1.92 (p99), 1.07-1.35 (step time), 1.07-1.15
  (utilisation); the worst cell 2.37 (a mean ACT), and single full-size runs missed by up
  to a factor of 4.79 (a p99). One run of this test in three failed here with the cell
  bound at a factor of 3. One quick run per cell sees the other
  tenants' load move between calibration and run; the pooled median is what one run can
  hold, the goal (10%/20%, medians over 3 runs) is the full run's.
- The **replay** (the run's own run times and gaps, only the queueing modelled) within 10%,
  and through the runtime on virtual time equal to the engine's (coding; the runtime's sim
  has no plain API pool). Its p99 is held on its upper side only: a quick cell has 8 or 18
  actions, so its p99 is the largest ACT (`twin.p99`), and a stall of the host on that one action
  (this test runs beside others) is not queueing, which the replay cannot have: one CI run of
  2026-12-06 had the replay's p99 39% under the run's at `coding, over` while its mean ACT was
  2.4% under and its step time 2.3% over. A replay above the run's tail (queueing modelled
  where there was none) still fails.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import replace

import pytest

from evaluation import twin
from evaluation.twin_measure import Profile
from evaluation.twin_model import Contention, predict
from evaluation.twin_plan import LOADS, QUICK, WORKLOADS, plan
from tangram.runtime.cli import main as cli
from topology import CpuNode

REPLAY = 0.10
POOLED = {
    "mean_act_s": math.log(2.0),
    "p99_act_s": math.log(2.5),
    "step_s": math.log(2.0),
    "core_utilisation": math.log(1.35),
}
CELL = math.log(5.0)


def test_twin_quick_offline_and_replay(capsys):
    assert cli(["experiment", "twin", "--quick", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    cores = doc["cores"]
    logs: dict[str, list[float]] = {k: [] for k in twin.FIGURES}
    for wl in WORKLOADS:
        for load, per_core in LOADS.items():
            cell = doc["cells"][wl][load]
            assert cell["trajectories"] == cores * per_core
            off, rep = doc["offline"][wl][load], doc["replay"][wl][load]
            assert set(off) >= {*twin.ERRORS.values(), "measured", "predicted", "spread"}
            for k, e in twin.ERRORS.items():
                assert off["predicted"][k] > 0 and off["measured"][k] > 0, (wl, load, k)
                ratio = abs(math.log(off["predicted"][k] / off["measured"][k]))
                assert ratio <= CELL, (wl, load, k, off)
                logs[k].append(ratio)
                if k == "p99_act_s":  # the largest ACT of the cell: upper side only
                    assert -1.0 < rep[e] <= REPLAY, (wl, load, e, rep)
                else:
                    assert abs(rep[e]) <= REPLAY, (wl, load, e, rep)
            for r in cell["runs"]:
                assert 0 < r["measured"]["core_utilisation"] <= 1.0 + 1e-9
                if r["replay_by_runtime"] is not None:
                    for k in twin.FIGURES:
                        assert r["replay_by_runtime"][k] == pytest.approx(r["replay"][k], rel=1e-9)
            assert set(doc["ablations"][wl][load]) >= {"no_contention", "with_background", "none"}
    for k, bound in POOLED.items():
        assert statistics.median(logs[k]) <= bound, (k, logs[k])
    mixed = [s for t in plan(replace(QUICK, workload="mixed")) for s in t.steps]
    assert any(s.command is None for s in mixed)  # the mixed workload calls the API


def _profile(slow: float) -> tuple[list, Profile]:
    p = twin.TwinParams(trajectories=2, turns_mean=2.0, reps=1)
    trajs = plan(p)
    samples = {}
    for t in trajs:
        for s in t.steps:
            for m in (1, 2):
                samples[(s.command, m)] = [0.5 if not s.elastic else 2.0 / m]
    corun = {"head": {1: [1.0], 2: [slow]}, "python3": {1: [1.0], 2: [slow]}}
    return trajs, Profile(samples, [0.1], CpuNode.flat("n0", 2), (1, 2), corun, [], [0.0])


def test_offline_plays_the_profile_and_its_contention():
    """The simulated side alone: every action of the plan runs, tools at their calibrated
    time; a slowdown of 2 beside a neighbour makes actions run longer, none shorter."""
    trajs, alone = _profile(1.0)
    o = predict(trajs, alone, twin.TwinParams())
    assert len(o.acts) == sum(len(t.steps) for t in trajs)
    assert all(r == pytest.approx(0.5) for r in sorted(o.runs)[: len(o.runs) - 2])
    _, slowed = _profile(2.0)
    s = predict(trajs, slowed, twin.TwinParams())
    assert sum(s.runs) > sum(o.runs)
    assert min(s.runs) >= min(o.runs) - 1e-9


def test_background_shift_reads_the_curve_further():
    c = Contention({"head": (1.0, 1.5, 2.5)}, shift=1.0)
    rates = c.rates({"a": (_act("kind:head"), {"cpu": 1})})
    assert rates["a"] == pytest.approx(1 / 1.5)  # alone now, but one more tenant core busy


def _act(kind: str):
    from tangram.actions import Action

    return Action("a", {"cpu": 1}, duration=1.0, kind=kind)


def test_bad_runs_is_refused(capsys):
    with pytest.raises(SystemExit):
        twin.main(["--runs", "0"])
    assert "--runs 0" in capsys.readouterr().err

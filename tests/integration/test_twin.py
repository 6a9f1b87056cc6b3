"""The digital twin in CI (`tangram experiment twin --quick`): a small AI-coding workload run
for real through `Tangram.local()`, twice, and each run predicted by the simulator replaying
it (each action's measured run time and the client's measured gaps; the grants, the queueing,
ACT, p99, step time and utilisation are the simulator's own). Tolerance: each of mean ACT,
p99 ACT, step time and core utilisation predicted within 10% of the measured figure (the
median over the runs), and in every run. Measured on the loaded 2-core machine (load average
7-9): errors 0.0-0.2% once the replay played elastic times exactly, 3-11% before (a clipped
efficiency); 10% leaves room for a CI runner's event-loop latency. The offline prediction
(the calibrated profiles alone, `predicted_offline`) is held only to a factor of 3: a shared
2-core machine swings a command's run time by 2x between calibration and run
(docs/architecture.md, "The digital twin"). The prediction through the runtime itself on
virtual time (`predicted_by_runtime`) must equal the engine's."""

from __future__ import annotations

import json
import math

import pytest

from evaluation import twin
from tangram.runtime.cli import main as cli
from topology import CpuNode

TOLERANCE = 0.10  # replayed prediction: |predicted / measured - 1| <= 10%
OFFLINE = 3.0  # offline prediction: predicted / measured within [1/3, 3]


def test_twin_quick_predicts_within_tolerance(capsys):
    assert cli(["experiment", "twin", "--quick", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["actions"] == sum(len(t.steps) for t in twin.plan(twin.QUICK))
    for k in twin.FIGURES:
        f = doc[k]
        assert set(f) >= {"predicted", "measured"}
        assert f["predicted"] > 0 and f["measured"] > 0, k
        assert abs(f["predicted"] / f["measured"] - 1) <= TOLERANCE, (k, f)
        assert all(abs(e) <= TOLERANCE for e in f["error_per_run"]), (k, f)
        assert f["predicted_offline"] > 0, k
        assert abs(math.log(f["predicted_offline"] / f["measured"])) <= math.log(OFFLINE), (k, f)
        assert f["predicted_by_runtime"] == pytest.approx(f["predicted"], rel=1e-9), (k, f)
    assert 0 < doc["core_utilisation"]["measured"] <= 1.0 + 1e-9


def test_twin_workload_plays_the_profile():
    """The simulated side alone: every action of the plan runs, tools at their measured time
    on one core, and with no contention an action's ACT is its run time."""
    p = twin.TwinParams(trajectories=1, turns_mean=2.0, reps=1)
    trajs = twin.plan(p)
    node = CpuNode.flat("n0", 2)
    run_s = {}
    for s in trajs[0].steps:
        for m in (1, 2):
            run_s[(s.command, m)] = [0.5 if not s.elastic else 2.0 / m]
    prof = twin.Profile(run_s, [0.1], node, (1, 2))
    o = twin.predict(trajs, prof)
    assert len(o.acts) == len(trajs[0].steps)
    assert all(a == pytest.approx(r) for a, r in zip(o.acts, o.runs))
    assert sorted(o.runs)[:-1] == pytest.approx([0.5] * (len(o.runs) - 1))

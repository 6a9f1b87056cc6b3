"""The engine's processor sharing (`evaluation.engine.Sharing`, the twin's contention model
`evaluation.twin_model.Contention`), over every runtime policy the registry finds:

- each action's work is conserved: the integral over its life of the rate the model gives it
  (recomputed from every action's start and end, the busy cores at each instant) equals the
  duration it would run alone;
- a model whose rates are all 1 leaves every action's start and end where the engine without
  a model puts them.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evaluation.closedloop import EnvironmentStart, Policy, run
from evaluation.twin_model import Contention
from evaluation.workloads.base import Step, Trajectory, Workload
from solvers import get_allocator
from solvers.registry import runtime_policies
from tangram.actions import Action
from tangram.pools import CorePool
from topology import CpuNode

POLICIES = [p for p in runtime_policies() if p not in ("cpsat", "pulp")]
CORES = 4
step = st.tuples(st.integers(0, 20), st.integers(1, 30), st.integers(1, 2), st.booleans())
trajectory = st.tuples(st.integers(0, 10), st.lists(step, min_size=1, max_size=4))
slowdowns = st.lists(st.floats(1.0, 3.0), min_size=CORES - 1, max_size=CORES - 1)


def workload(raw) -> Workload:
    """Trajectories of (think, duration, cores, kind a or b) in tenths of a second."""
    out = []
    for i, (start, steps) in enumerate(raw):
        acts = [
            Step(
                think / 10,
                Action(
                    f"t{i}.{j}",
                    {"cpu": cores},
                    duration=d / 10 + 1e-4 * (i + j / 7),  # distinct end times
                    trajectory=f"t{i}",
                    kind="kind:a" if a else "kind:b",
                ),
            )
            for j, (think, d, cores, a) in enumerate(steps)
        ]
        out.append(Trajectory(f"t{i}", "coding", start / 10, tuple(acts)))

    def pools():
        return {"cpu": CorePool("cpu", {"n0": CpuNode.flat("n0", CORES)})}

    return Workload("sharing", tuple(out), pools, None, tasks=("coding",))


def _run(w: Workload, policy: str, sharing):
    return run(
        w, Policy(policy, get_allocator(policy), EnvironmentStart(0.1)), sharing=sharing
    ).records


@settings(max_examples=80, deadline=None)
@given(
    st.lists(trajectory, min_size=1, max_size=5),
    st.sampled_from(POLICIES),
    slowdowns,
    slowdowns,
)
def test_work_is_conserved(raw, policy, sa, sb):
    model = Contention({"a": (1.0, *sorted(sa)), "b": (1.0, *sorted(sb))})
    recs = _run(workload(raw), policy, model)
    edges = sorted({t for r in recs.values() for t in (r.start, r.end)})
    for r in recs.values():
        work = 0.0
        for lo, hi in zip(edges, edges[1:]):
            if r.start <= lo and hi <= r.end:
                beside = [x for x in recs.values() if x.start <= lo and hi <= x.end]
                b = sum(x.units["cpu"] for x in beside)
                f = model.factor(r.action.kind, r.units["cpu"]) / model.factor(r.action.kind, b)
                work += (hi - lo) * f
        assert work == pytest.approx(r.action.duration, rel=1e-6, abs=1e-9), r.action.id


class _Ones:
    def rates(self, running):
        return dict.fromkeys(running, 1.0)


@settings(max_examples=60, deadline=None)
@given(st.lists(trajectory, min_size=1, max_size=5), st.sampled_from(POLICIES))
def test_unit_rates_change_nothing(raw, policy):
    w = workload(raw)
    plain, shared = _run(w, policy, None), _run(w, policy, _Ones())
    assert plain.keys() == shared.keys()
    for aid, r in plain.items():
        s = shared[aid]
        assert (s.start, s.units) == (r.start, r.units), aid
        assert s.end == pytest.approx(r.end, abs=1e-9), aid


def test_factor_interpolates_and_extends():
    c = Contention({"a": (1.0, 1.5, 1.8)})
    assert c.factor("kind:a", 1) == 1.0
    assert c.factor("kind:a", 2) == pytest.approx(1.5)
    assert c.factor("kind:a", 2.5) == pytest.approx(1.65)
    assert c.factor("kind:a", 4) == pytest.approx(2.1)  # beyond the last point: its slope
    assert c.factor("kind:other", 3) == 1.0  # a kind never measured: no slowdown


def test_two_equal_commands_share_then_one_speeds_up():
    """1 s and 2 s of work on one core each, slowdown 2 beside each other: the first ends at
    2 s (half speed), the second has 1 s left and runs it alone: ends at 3 s."""
    model = Contention({"a": (1.0, 2.0)})
    acts = [
        Action(f"t{i}.0", {"cpu": 1}, duration=d, trajectory=f"t{i}", kind="kind:a")
        for i, d in enumerate((1.0, 2.0))
    ]
    w = Workload(
        "two",
        tuple(Trajectory(a.trajectory, "coding", 0.0, (Step(0.0, a),)) for a in acts),
        lambda: {"cpu": CorePool("cpu", {"n0": CpuNode.flat("n0", 2)})},
        None,
        tasks=("coding",),
    )
    recs = run(w, Policy("h", get_allocator("heuristic"), EnvironmentStart(0.0)), sharing=model)
    recs = recs.records
    assert recs["t0.0"].end - recs["t0.0"].start == pytest.approx(2.0)
    assert recs["t1.0"].end - recs["t1.0"].start == pytest.approx(3.0)

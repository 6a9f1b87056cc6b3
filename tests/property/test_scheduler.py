"""Random instances through the real scheduler loop: invariants, completion, quality."""

from pathlib import Path

from grammar import check_run
from grammar import instances as grammar_instances
from hypothesis import example, given, settings
from hypothesis import strategies as st

from evaluation.simulator import simulate
from solvers import get_allocator
from solvers.registry import runtime_policies
from tangram import ValidationError, check_assignments
from tangram.instance import load_instance, parse_instance
from tangram.profiles import amdahl_efficiency

SCEN = Path(__file__).parents[1] / "scenarios"


# every runtime policy the registry finds, the receding-horizon exact ones aside (a solve per
# decision; tests/property/test_exact_schedule_props.py covers them)
POLICIES = [p for p in runtime_policies() if p not in ("cpsat", "pulp")]


def _policy(name: str, depth: int):
    try:
        return get_allocator(name, depth=depth)
    except ValidationError:  # a policy without the heuristic's depth option
        return get_allocator(name)


@settings(max_examples=150, deadline=None)
@given(grammar_instances(), st.sampled_from(POLICIES), st.integers(1, 3))
def test_random_instances_finish_and_keep_invariants(instance, policy, depth):
    """The instance grammar (tests/grammar.py) at every depth: every action ends, after its
    arrival, with allowed units; no node over capacity, no GPU shared, liveness."""
    result = simulate(instance, _policy(policy, depth))
    assert not check_run(instance, result.records)
    for r in result.records.values():
        assert r.end > r.start


def test_checker_rejects_double_booking():
    import pytest

    from tangram import Action, Assignment, InvariantError, Placement
    from tangram.pools import ChunkPool
    from topology import ChunkTree

    pools = {"gpu": ChunkPool("gpu", {"n0": ChunkTree(4, "n0")})}
    a = Action("a", {"gpu": [2]}, duration=1)
    b = Action("b", {"gpu": [2]}, duration=1)
    ok = [
        Assignment(a, {"gpu": 2}, {"gpu": Placement("n0", chunk=(0, 2))}),
        Assignment(b, {"gpu": 2}, {"gpu": Placement("n0", chunk=(2, 4))}),
    ]
    check_assignments(pools, ok)
    clash = [ok[0], Assignment(b, {"gpu": 2}, {"gpu": Placement("n0", chunk=(0, 2))})]
    with pytest.raises(InvariantError):
        check_assignments(pools, clash)
    with pytest.raises(InvariantError):  # 3 is not an allowed amount
        check_assignments(
            pools, [Assignment(a, {"gpu": 4}, {"gpu": Placement("n0", chunk=(0, 4))})]
        )
    unaligned = [Assignment(a, {"gpu": 2}, {"gpu": Placement("n0", chunk=(1, 3))})]
    with pytest.raises(InvariantError):
        check_assignments(pools, unaligned)


@st.composite
def elastic_batch(draw):
    """Amdahl-style elastic actions that all arrive at once (no future arrivals)."""
    units = draw(st.integers(2, 16))
    acts = []
    for i in range(draw(st.integers(2, 15))):
        amounts = sorted({1, *draw(st.lists(st.integers(1, units), max_size=4))})
        alpha = draw(st.floats(0.0, 0.3))  # Amdahl serial fraction
        eff = {str(m): amdahl_efficiency(m, alpha) for m in amounts}
        acts.append(
            {
                "id": f"a{i}",
                "arrival": 0.0,
                "key": "cpu",
                "demand": {"cpu": amounts},
                "t_ori": draw(st.floats(1, 10)),
                "efficiency": eff,
            }
        )
    return parse_instance(
        {"resources": {"cpu": {"topology": "flat", "units": units}}, "actions": acts}
    )


# a quality check, not a proved bound: fresh examples every run, the worst found kept
@settings(max_examples=100, deadline=None)
@given(elastic_batch())
@example(load_instance(SCEN / "batch_idle_before_issue21.json"))
def test_heuristic_not_much_worse_than_min_on_a_batch(instance):
    """When every action is known up front, the heuristic stays close to min's total ACT.
    No bound is proved: the worst a search found is 1.08x (`python -m evaluation.quality
    search heuristic min --kind batch --budget 3000`). Before issue 21 it found 1.96x, and
    3,000 hypothesis examples of this strategy targeted at the ratio found 4.7x (the kept
    example: six of seven cores idle). 1.25x is a regression alarm.

    With online arrivals there is no constant bound, and none is asserted: an elastic action
    alone in the queue takes every unit, and short actions arriving just after wait for it.
    On average the heuristic wins clearly: see the next test."""
    h = simulate(instance, get_allocator("heuristic")).total_act
    m = simulate(instance, get_allocator("min")).total_act
    assert h <= m * 1.25 + 1e-9


def test_heuristic_beats_min_on_average():
    """Online arrivals, 60 seeded instances: the mean ratio heuristic/min is below 0.95
    (over 500: `python -m evaluation.quality ratio heuristic min --kind online`)."""
    import random

    rng = random.Random(7)
    ratios = []
    for _ in range(60):
        units = rng.randint(2, 16)
        acts, t = [], 0.0
        for i in range(rng.randint(2, 12)):
            t += rng.choice([0.0, 0.0, 0.3, 1.0])
            amounts = sorted({1, *[rng.randint(1, units) for _ in range(rng.randint(0, 4))]})
            alpha = rng.uniform(0, 0.3)
            eff = {str(m): amdahl_efficiency(m, alpha) for m in amounts}
            acts.append(
                {
                    "id": f"a{i}",
                    "arrival": t,
                    "key": "cpu",
                    "demand": {"cpu": amounts},
                    "t_ori": rng.uniform(1, 10),
                    "efficiency": eff,
                }
            )
        inst = parse_instance(
            {"resources": {"cpu": {"topology": "flat", "units": units}}, "actions": acts}
        )
        ratios.append(
            simulate(inst, get_allocator("heuristic")).total_act
            / simulate(inst, get_allocator("min")).total_act
        )
    assert sum(ratios) / len(ratios) < 0.95

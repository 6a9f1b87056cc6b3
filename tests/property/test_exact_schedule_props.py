"""Small instances of the file format's grammar: CP-SAT and PuLP agree, the exact total ACT
is never above any policy's, and every extracted schedule passes the invariant checker.

Durations and arrivals are whole multiples of the 0.1 s resolution, so the discretised model is
exact and "never above" needs no rounding slack.
"""

from grammar import instances as grammar_instances
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evaluation.simulator import simulate
from solvers import get_allocator
from solvers.exact.cpsat_schedule import solve_cpsat
from solvers.exact.model import instance_model
from solvers.exact.schedule import solve_model, solve_schedule
from solvers.exact.timeline import verify

RES = 0.1
SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def instances(max_actions: int = 5):
    """The instance grammar (tests/grammar.py) on the time grid, up to two pools, any of
    them flat or chunks, vector actions included; no services (the exact models have no
    restore times)."""
    return grammar_instances(2, max_actions, grid=RES, services=False)


@SETTINGS
@given(instances())
def test_cpsat_and_pulp_optima_agree(inst):
    model = instance_model(inst.build_pools(), inst.actions, RES)
    cp = solve_model(model, "cpsat", 20, workers=1)
    cbc = solve_model(model, "pulp-cbc", 20)
    assert cp.status == cbc.status == "optimal"
    assert cp.objective == round(cbc.objective)  # the same discretised model, in ticks


@SETTINGS
@given(instances(max_actions=4))
def test_highs_agrees_too(inst):
    model = instance_model(inst.build_pools(), inst.actions, RES)
    assert solve_model(model, "cpsat", 20, workers=1).objective == round(
        solve_model(model, "pulp-highs", 20).objective
    )


@SETTINGS
@given(instances())
def test_exact_is_never_above_any_policy_and_verifies(inst):
    exact = solve_schedule(inst, "cpsat", 20, resolution=RES, workers=1)
    assert exact.status == "optimal"
    verify(inst.build_pools(), exact.entries, {a.id: a.submit_time for a in inst.actions})
    for name, options in [
        ("heuristic", {}),
        ("heuristic", {"depth": 1}),
        ("min", {}),
        ("backfill", {}),
        ("backfill-srpt", {}),
        ("cpsat", {"resolution": RES, "workers": 1}),
    ]:
        policy = simulate(inst, get_allocator(name, **options)).total_act
        assert exact.total_act <= policy + 1e-6, (name, options)


@SETTINGS
@given(instances(), st.booleans())
def test_semi_active_dominance_keeps_the_optimum(inst, fcfs):
    """Every start at a release or another job's end (or, in order, with the job before) cuts
    no optimum: with and without it, the same optimal objective, elastic and chunks included."""
    model = instance_model(inst.build_pools(), inst.actions, RES)
    on = solve_cpsat(model, 20, 1, fcfs=fcfs, dominance=True)
    off = solve_cpsat(model, 20, 1, fcfs=fcfs, dominance=False)
    assert on.status == off.status == "optimal"
    assert on.objective == off.objective

"""Random small instances: CP-SAT and PuLP agree, the exact total ACT is never above any
policy's, and every extracted schedule passes the invariant checker.

Durations and arrivals are whole multiples of the 0.1 s resolution, so the discretised model is
exact and "never above" needs no rounding slack.
"""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evaluation.simulator import simulate
from solvers import get_allocator
from solvers.exact.cpsat_schedule import solve_cpsat
from solvers.exact.model import instance_model
from solvers.exact.schedule import solve_model, solve_schedule
from solvers.exact.timeline import verify
from tangram.instance import parse_instance

RES = 0.1
SETTINGS = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def instances(draw, max_actions=5):
    chunky = draw(st.booleans())
    res = "gpu" if chunky else "cpu"
    resources = (
        {"gpu": {"topology": "chunks", "nodes": draw(st.integers(1, 2)), "gpus_per_node": 4}}
        if chunky
        else {"cpu": {"topology": "flat", "units": draw(st.sampled_from([2, 4, 6]))}}
    )
    amounts = [[1], [2], [1, 2], [1, 2, 4]] if chunky else [[1], [2], [1, 2], [1, 2, 3]]
    actions = []
    for i in range(draw(st.integers(1, max_actions))):
        arrival = draw(st.integers(0, 20)) * RES
        demand = draw(st.sampled_from(amounts))
        if len(demand) > 1 and draw(st.booleans()):
            # elastic with every duration a multiple of RES: E(m) = t_ori / (m * d_m)
            t_ori = draw(st.integers(5, 40)) * RES
            eff = {}
            for m in demand:
                ticks = -(-round(t_ori / RES) // m)  # ceil(t_ori / m) in ticks
                d = (ticks + draw(st.integers(0, 5))) * RES
                eff[str(m)] = t_ori / (m * d)
            actions.append(
                {
                    "id": f"a{i}",
                    "arrival": arrival,
                    "key": res,
                    "demand": {res: demand},
                    "t_ori": t_ori,
                    "efficiency": eff,
                }
            )
        else:
            actions.append(
                {
                    "id": f"a{i}",
                    "arrival": arrival,
                    "demand": {res: demand[:1]},
                    "duration": draw(st.integers(1, 30)) * RES,
                }
            )
    return parse_instance({"resources": resources, "actions": actions})


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

"""The exact arrangement as a 0-1 program in PuLP (CBC or HiGHS), on the same model."""

from __future__ import annotations

import time

import pulp

from solvers.exact.arrangement_model import ArrangementModel
from solvers.exact.backend import SolveStatus, chosen, solve_pulp_problem
from tangram.errors import Infeasible


def solve_arrangement_pulp(
    model: ArrangementModel, backend: str, time_limit: float
) -> tuple[str, tuple[int, ...], float]:
    """(status, chosen candidate per task, wall seconds); raises `Infeasible`."""
    # data
    cands = model.candidates
    prob = pulp.LpProblem("tangram_arrangement", pulp.LpMinimize)

    # variables: x[t, c] = task t takes candidate c
    x = {
        (t, c): prob.add_variable(f"x_{t}_{c}", cat="Binary")
        for t, cs in enumerate(cands)
        for c in range(len(cs))
    }

    # every task takes exactly one candidate
    for t, cs in enumerate(cands):
        prob += pulp.lpSum(x[t, c] for c in range(len(cs))) == 1, f"one_{t}"
    # capacity groups: units per node / NUMA domain, one task per GPU on each root-to-leaf path
    for n, g in enumerate(model.groups):
        prob += pulp.lpSum(w * x[t, c] for t, c, w in g.members) <= g.limit, f"cap_{n}"

    # objective: the sum of the chosen durations
    prob += pulp.lpSum(
        cd.duration * x[t, c] for t, cs in enumerate(cands) for c, cd in enumerate(cs)
    )

    t0 = time.perf_counter()
    status, _ = solve_pulp_problem(prob, backend, time_limit)
    wall = time.perf_counter() - t0
    if status == SolveStatus.INFEASIBLE:
        raise Infeasible(f"{backend}: the tasks do not fit the pool together")
    return status, tuple(chosen(x, t, len(cs)) for t, cs in enumerate(cands)), wall

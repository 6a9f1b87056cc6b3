"""The exact arrangement in CP-SAT: one Boolean per (task, candidate), capacity groups."""

from __future__ import annotations

import time

from ortools.sat.python import cp_model

from solvers.exact.arrangement_model import ArrangementModel
from solvers.exact.backend import SolveStatus, default_workers
from tangram.errors import Infeasible, TangramError

COST_SCALE = 1_000_000
"""Durations enter the objective as integer microseconds-per-second units (rounded): two
arrangements closer than 1e-6 s apart may tie."""


def solve_arrangement_cpsat(
    model: ArrangementModel, backend: str, time_limit: float
) -> tuple[str, tuple[int, ...], float]:
    """(status, chosen candidate per task, wall seconds); raises `Infeasible`."""
    # data
    cands = model.candidates
    cp = cp_model.CpModel()

    # variables: x[t][c] = task t takes candidate c
    x = [[cp.new_bool_var(f"x_{t}_{c}") for c in range(len(cs))] for t, cs in enumerate(cands)]

    # every task takes exactly one candidate
    for row in x:
        cp.add_exactly_one(row)
    # capacity groups: units per node / NUMA domain, one task per GPU on each root-to-leaf path
    for g in model.groups:
        cp.add(sum(w * x[t][c] for t, c, w in g.members) <= g.limit)

    # objective: the sum of the chosen durations
    cp.minimize(
        sum(
            round(cd.duration * COST_SCALE) * x[t][c]
            for t, cs in enumerate(cands)
            for c, cd in enumerate(cs)
        )
    )

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit)
    solver.parameters.num_workers = default_workers()
    t0 = time.perf_counter()
    status = solver.solve(cp)
    wall = time.perf_counter() - t0

    if status == cp_model.INFEASIBLE:
        raise Infeasible("CP-SAT: the tasks do not fit the pool together")
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise TangramError(f"CP-SAT found no arrangement within {time_limit:g} s")
    chosen = tuple(next(c for c, v in enumerate(row) if solver.boolean_value(v)) for row in x)
    proved = SolveStatus.OPTIMAL if status == cp_model.OPTIMAL else SolveStatus.FEASIBLE
    return proved, chosen, wall

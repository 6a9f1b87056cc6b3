"""The exact schedule in OR-Tools CP-SAT: optional intervals per (job, mode), cumulative per
flat node, no-overlap per GPU. Reads only the shared `ScheduleModel`."""

from __future__ import annotations

import time

from ortools.sat.python import cp_model

from solvers.exact.backend import FEASIBLE, OPTIMAL, RawSolution, default_workers
from solvers.exact.model import ScheduleModel
from tangram.errors import Infeasible, TangramError


def solve_cpsat(model: ScheduleModel, time_limit: float, workers: int | None = None,
                hint: tuple[tuple[int, ...], tuple[int, ...]] | None = None) -> RawSolution:
    """Minimise the weighted sum of end ticks; raises when CP-SAT finds no schedule in time."""
    # data
    jobs, horizon = model.jobs, model.horizon
    cp = cp_model.CpModel()

    # variables: a start per job, a presence literal and an optional interval per mode
    starts, ends, present, intervals = [], [], [], []
    for i, job in enumerate(jobs):
        lo, hi = (0, 0) if job.pinned else (job.release, horizon)
        s = cp.new_int_var(lo, hi, f"start_{i}")
        lits = [cp.new_bool_var(f"mode_{i}_{m}") for m in range(len(job.modes))]
        ivs = [cp.new_optional_fixed_size_interval_var(s, mode.ticks, lit, f"iv_{i}_{m}")
               for m, (mode, lit) in enumerate(zip(job.modes, lits))]
        e = cp.new_int_var(lo + min(m.ticks for m in job.modes), horizon, f"end_{i}")
        starts.append(s)
        ends.append(e)
        present.append(lits)
        intervals.append(ivs)

    # each job runs in exactly one mode
    for lits in present:
        cp.add_exactly_one(lits)
    # a job ends its chosen mode's duration after it starts
    for i, job in enumerate(jobs):
        cp.add(ends[i] == starts[i] + sum(m.ticks * lit
                                          for m, lit in zip(job.modes, present[i])))
    # flat pools: the units in use on a node never exceed its capacity
    for key, users in model.flat_users.items():
        cp.add_cumulative([intervals[i][m] for i, m, _ in users], [k for _, _, k in users],
                          model.flat_capacity[key])
    # GPU pools: at most one action at a time on each GPU (its chunk's root-to-leaf path)
    for on_gpu in model.gpu_users.values():
        if len(on_gpu) > 1:
            cp.add_no_overlap([intervals[i][m] for i, m in on_gpu])
    if hint is not None:
        for i, (mode, tick) in enumerate(zip(*hint)):
            cp.add_hint(starts[i], tick)
            for m, lit in enumerate(present[i]):
                cp.add_hint(lit, m == mode)

    # objective: the weighted sum of end ticks (arrivals are constants)
    cp.minimize(sum(job.weight * ends[i] for i, job in enumerate(jobs)))

    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit)
    solver.parameters.num_workers = workers or default_workers()
    t0 = time.perf_counter()
    status = solver.solve(cp)
    wall = time.perf_counter() - t0

    if status == cp_model.INFEASIBLE:
        raise Infeasible("CP-SAT proved the schedule infeasible")
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise TangramError(f"CP-SAT found no schedule within {time_limit:g} s "
                           f"({solver.status_name(status)}); raise the time limit")
    modes = tuple(next(m for m, lit in enumerate(lits) if solver.boolean_value(lit))
                  for lits in present)
    return RawSolution(OPTIMAL if status == cp_model.OPTIMAL else FEASIBLE, modes,
                       tuple(solver.value(s) for s in starts), solver.objective_value,
                       solver.best_objective_bound, wall)


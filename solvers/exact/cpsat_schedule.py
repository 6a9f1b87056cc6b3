"""The exact schedule in OR-Tools CP-SAT: optional intervals per (job, mode), cumulative per
flat node, no-overlap per GPU. Reads only the shared `ScheduleModel`.

What makes it prove bigger instances (measured with `tangram bench exact --sweep`):

- **Semi-active dominance**: every queued job starts at its release or at the end of another
  job (or, under `fcfs`, at the start of the job before it). Exact: in a schedule where a job
  starts at neither, no job ends at its start tick, so every unit and GPU it holds in its first
  tick is also free one tick earlier (nothing that runs then stops before it starts); shifting
  it one tick left, same mode and same chunk, keeps every constraint and lowers the objective.
  So every optimal schedule already satisfies it, whatever the elastic amounts and placements.
- **One always-present interval per job** (variable size, variable demand) in a redundant
  cumulative per flat node whose jobs have all their modes on it: the propagation then sees the
  job's area before its mode is fixed.
- **`objective_lb_search`** in the portfolio when there are workers to spare: it lifts the
  reported bound when the time limit comes before the proof.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from ortools.sat.python import cp_model

from solvers.exact.backend import NoSchedule, RawSolution, SolveStatus, default_workers
from solvers.exact.model import ScheduleModel
from tangram.errors import Infeasible


def solve_cpsat(
    model: ScheduleModel,
    time_limit: float,
    workers: int | None = None,
    hint: tuple[tuple[int, ...], tuple[int, ...]] | None = None,
    fcfs: bool = False,
    dominance: bool = True,
) -> RawSolution:
    """Minimise the weighted sum of end ticks; raises when CP-SAT finds no schedule in time.

    `fcfs`: queued jobs start in arrival order (the order-constrained optimum of the gap
    study). `dominance`: add the semi-active constraint (see the module docstring)."""
    # data
    jobs = model.jobs
    cp = cp_model.CpModel()
    # variables: a start per job, a presence literal and an optional interval per mode
    v = _variables(cp, model)
    # constraints: modes and pools, then the order of starts
    _pool_constraints(cp, model, v)
    _order_constraints(cp, model, v, fcfs, dominance)
    if hint is not None:
        for i, (mode, tick) in enumerate(zip(*hint)):
            cp.add_hint(v.starts[i], tick)
            for m, lit in enumerate(v.present[i]):
                cp.add_hint(lit, m == mode)
    # objective: the weighted sum of end ticks (arrivals are constants)
    cp.minimize(sum(round(job.weight) * v.ends[i] for i, job in enumerate(jobs)))  # 0 or 1
    return _solve(cp, v, time_limit, workers)


@dataclass(slots=True)
class _Vars:
    starts: list = field(default_factory=list)
    ends: list = field(default_factory=list)
    present: list = field(default_factory=list)  # per job, a literal per mode
    intervals: list = field(default_factory=list)  # per job, an optional interval per mode


def _variables(cp: cp_model.CpModel, model: ScheduleModel) -> _Vars:
    v = _Vars()
    for i, job in enumerate(model.jobs):
        lo, hi = (0, 0) if job.pinned else (job.release, model.horizon)
        s = cp.new_int_var(lo, hi, f"start_{i}")
        lits = [cp.new_bool_var(f"mode_{i}_{m}") for m in range(len(job.modes))]
        ivs = [
            cp.new_optional_fixed_size_interval_var(s, mode.ticks, lit, f"iv_{i}_{m}")
            for m, (mode, lit) in enumerate(zip(job.modes, lits))
        ]
        e = cp.new_int_var(lo + min(m.ticks for m in job.modes), model.horizon, f"end_{i}")
        v.starts.append(s)
        v.ends.append(e)
        v.present.append(lits)
        v.intervals.append(ivs)
    return v


def _pool_constraints(cp: cp_model.CpModel, model: ScheduleModel, v: _Vars) -> None:
    # each job runs in exactly one mode
    for lits in v.present:
        cp.add_exactly_one(lits)
    # a job ends its chosen mode's duration after it starts
    for i, job in enumerate(model.jobs):
        cp.add(
            v.ends[i] == v.starts[i] + sum(m.ticks * lit for m, lit in zip(job.modes, v.present[i]))
        )
    # flat pools: the units in use on a node never exceed its capacity
    for key, users in model.flat_users.items():
        cp.add_cumulative(
            [v.intervals[i][m] for i, m, _ in users],
            [k for _, _, k in users],
            model.flat_capacity[key],
        )
    # GPU pools: at most one action at a time on each GPU (its chunk's root-to-leaf path)
    for on_gpu in model.gpu_users.values():
        if len(on_gpu) > 1:
            cp.add_no_overlap([v.intervals[i][m] for i, m in on_gpu])
    # redundant: one always-present interval per job on single-node flat pools
    for key, users in model.flat_users.items():
        _area_cumulative(cp, model, key, users, v.starts, v.ends, v.present)


def _order_constraints(
    cp: cp_model.CpModel, model: ScheduleModel, v: _Vars, fcfs: bool, dominance: bool
) -> None:
    jobs, starts, ends = model.jobs, v.starts, v.ends
    queued = [i for i, job in enumerate(jobs) if not job.pinned]
    order = sorted(queued, key=lambda i: (jobs[i].arrival, i))
    # fcfs: a queued job never starts before one that arrived earlier
    if fcfs:
        for a, b in zip(order, order[1:]):
            cp.add(starts[a] <= starts[b])
    # semi-active: a queued job starts at its release, at another job's end, or (fcfs) with
    # the job before it
    if dominance:
        prev = dict(zip(order[1:], order)) if fcfs else {}
        for j in queued:
            at = [cp.new_bool_var(f"at_release_{j}")]
            cp.add(starts[j] == jobs[j].release).only_enforce_if(at[0])
            for i in range(len(jobs)):
                if i != j:
                    lit = cp.new_bool_var(f"at_end_{j}_{i}")
                    cp.add(starts[j] == ends[i]).only_enforce_if(lit)
                    at.append(lit)
            if j in prev:
                lit = cp.new_bool_var(f"with_prev_{j}")
                cp.add(starts[j] == starts[prev[j]]).only_enforce_if(lit)
                at.append(lit)
            cp.add_bool_or(at)


def _solve(cp: cp_model.CpModel, v: _Vars, time_limit: float, workers: int | None) -> RawSolution:
    """Solve with the injected time limit, check the status, extract."""
    solver = cp_model.CpSolver()
    solver.parameters.max_time_in_seconds = float(time_limit)
    solver.parameters.num_workers = workers or default_workers()
    if solver.parameters.num_workers >= 4:
        solver.parameters.extra_subsolvers.append("objective_lb_search")
    t0 = time.perf_counter()
    status = solver.solve(cp)
    wall = time.perf_counter() - t0

    if status == cp_model.INFEASIBLE:
        raise Infeasible("CP-SAT proved the schedule infeasible")
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        raise NoSchedule(
            f"CP-SAT found no schedule within {time_limit:g} s "
            f"({solver.status_name(status)}); raise the time limit"
        )
    modes = tuple(
        next(m for m, lit in enumerate(lits) if solver.boolean_value(lit)) for lits in v.present
    )
    proved = SolveStatus.OPTIMAL if status == cp_model.OPTIMAL else SolveStatus.FEASIBLE
    return RawSolution(
        proved,
        modes,
        tuple(solver.value(s) for s in v.starts),
        # the objective is a sum of integer ticks: CP-SAT reports it as a float
        float(round(solver.objective_value)),
        solver.best_objective_bound,
        wall,
    )


def _area_cumulative(
    cp: cp_model.CpModel, model: ScheduleModel, key: tuple[str, str], users, starts, ends, present
) -> None:
    """A cumulative over one always-present interval per job whose every mode uses this flat
    node: size and demand are the chosen mode's, so the job's area counts before its mode is
    fixed. Skipped when some job could also run elsewhere (the job's interval would lie)."""
    by_job: dict[int, dict[int, int]] = {}
    for i, m, k in users:
        by_job.setdefault(i, {})[m] = k
    if any(len(modes) != len(model.jobs[i].modes) for i, modes in by_job.items()):
        return
    if len(by_job) < 2:
        return
    intervals, demands = [], []
    for i, modes in by_job.items():
        job = model.jobs[i]
        ticks = [mode.ticks for mode in job.modes]
        size = cp.new_int_var(min(ticks), max(ticks), f"size_{i}_{key}")
        cp.add(size == sum(t * lit for t, lit in zip(ticks, present[i])))
        units = [modes[m] for m in range(len(job.modes))]
        demand = cp.new_int_var(min(units), max(units), f"demand_{i}_{key}")
        cp.add(demand == sum(u * lit for u, lit in zip(units, present[i])))
        intervals.append(cp.new_interval_var(starts[i], size, ends[i], f"area_{i}_{key}"))
        demands.append(demand)
    cp.add_cumulative(intervals, demands, model.flat_capacity[key])

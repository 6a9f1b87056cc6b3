"""The exact schedule as a disjunctive big-M MILP in PuLP (CBC or HiGHS).

Reads the same `ScheduleModel` as the CP-SAT backend. Continuous time needs no time grid in the
MILP, but starts are integer ticks so both backends solve the *same* discretised problem.

Flat capacity uses the classic argument that the load of a set of intervals peaks at some
start: `b[i,j]` is a linear start order (antisymmetric and transitive), `p[i,j]` says i ends
before j starts, and at every start s_j each i with `b[i,j] - p[i,j] = 1` (started, not ended)
is counted with its amount. GPUs are per-GPU disjunctions: two jobs whose chunks share a GPU are
ordered one way or the other.
"""

from __future__ import annotations

import itertools
import time

import pulp

from solvers.exact.backend import RawSolution, SolveStatus, chosen, solve_pulp_problem
from solvers.exact.model import ScheduleModel
from tangram.errors import Infeasible


def _pairs(model: ScheduleModel) -> tuple[set, list[list[int]]]:
    """Ordered pairs that share a pool node, and the job groups of each flat pool node."""
    groups = [sorted({i for i, _, _ in users}) for users in model.flat_users.values()]
    gpu_groups = [sorted({i for i, _ in users}) for users in model.gpu_users.values()]
    pinned = {i for i, j in enumerate(model.jobs) if j.pinned}
    pairs = {
        (i, j)
        for g in groups + gpu_groups
        for i in g
        for j in g
        if i != j and not (i in pinned and j in pinned)
    }
    return pairs, groups


def solve_pulp(model: ScheduleModel, backend: str, time_limit: float) -> RawSolution:
    """Minimise the weighted sum of end ticks with `backend` (`pulp-cbc` or `pulp-highs`)."""
    # data
    jobs, big_m = model.jobs, model.horizon
    pairs, groups = _pairs(model)
    prob = pulp.LpProblem("tangram_schedule", pulp.LpMinimize)

    # variables: mode choice, integer start and end per job, end-before-start per pair, start order
    x = {
        (i, m): prob.add_variable(f"x_{i}_{m}", cat="Binary")
        for i, job in enumerate(jobs)
        for m in range(len(job.modes))
    }
    s = [
        prob.add_variable(
            f"s_{i}", 0 if j.pinned else j.release, 0 if j.pinned else big_m, cat="Integer"
        )
        for i, j in enumerate(jobs)
    ]
    e = [
        s[i] + pulp.lpSum(mode.ticks * x[i, m] for m, mode in enumerate(job.modes))
        for i, job in enumerate(jobs)
    ]
    p = {ij: prob.add_variable(f"p_{ij[0]}_{ij[1]}", cat="Binary") for ij in pairs}
    flat_pairs = {(i, j) for g in groups for i in g for j in g if i != j}
    b = {ij: prob.add_variable(f"b_{ij[0]}_{ij[1]}", cat="Binary") for ij in flat_pairs}

    # constraints: one mode per job, the two orders, then the pools
    _order_constraints(prob, model, x, s, e, p, b, groups, big_m)
    _pool_constraints(prob, model, x, p, b)

    # objective: the weighted sum of end ticks (arrivals are constants)
    prob += pulp.lpSum(job.weight * e[i] for i, job in enumerate(jobs))

    t0 = time.perf_counter()
    status, bound = solve_pulp_problem(prob, backend, time_limit)
    wall = time.perf_counter() - t0
    if status not in (SolveStatus.OPTIMAL, SolveStatus.FEASIBLE):
        raise Infeasible(f"{backend} proved the schedule infeasible")
    modes = tuple(chosen(x, i, len(job.modes)) for i, job in enumerate(jobs))
    objective = float(pulp.value(prob.objective))
    # a start in no constraint is absent from the solved problem: it sits at its lower bound
    starts = tuple(round(v.lowBound if v.value() is None else v.value()) for v in s)
    return RawSolution(status, modes, starts, objective, bound, wall)


def _order_constraints(
    prob: pulp.LpProblem,
    model: ScheduleModel,
    x: dict,
    s: list,
    e: list,
    p: dict,
    b: dict,
    groups: list[list[int]],
    big_m: int,
) -> None:
    jobs = model.jobs
    # each job runs in exactly one mode
    for i, job in enumerate(jobs):
        prob += pulp.lpSum(x[i, m] for m in range(len(job.modes))) == 1, f"one_mode_{i}"
    # p[i,j] = 1 means i ends no later than j starts; at most one of the two orders
    for (i, j), v in p.items():
        prob += e[i] <= s[j] + big_m * (1 - v), f"end_before_{i}_{j}"
        if i < j:
            prob += v + p[j, i] <= 1, f"one_order_{i}_{j}"
    # b is a linear order of starts: antisymmetric, consistent with start times, transitive
    for (i, j), v in b.items():
        prob += s[i] <= s[j] + big_m * (1 - v), f"start_order_{i}_{j}"
        if i < j:
            prob += v + b[j, i] == 1, f"start_total_{i}_{j}"
    # a triple that shares several pools (a vector action's group on each) is one constraint
    triples = {
        (i, j, k) for g in groups for i, j, k in itertools.permutations(g, 3) if i < j and i < k
    }
    for i, j, k in sorted(triples):
        prob += b[i, j] + b[j, k] + b[k, i] <= 2, f"transitive_{i}_{j}_{k}"


def _pool_constraints(
    prob: pulp.LpProblem, model: ScheduleModel, x: dict, p: dict, b: dict
) -> None:
    # flat pools: at each start, the units of every job started and not ended fit the node
    for n, (key, users) in enumerate(model.flat_users.items()):
        amount = {
            i: pulp.lpSum(k * x[i, m] for ii, m, k in users if ii == i)
            for i in {u[0] for u in users}
        }
        peak = {i: max(k for ii, _, k in users if ii == i) for i in amount}
        for j in amount:
            w = {i: prob.add_variable(f"w_{n}_{i}_{j}", 0) for i in amount if i != j}
            for i, wi in w.items():
                prob += (
                    wi >= amount[i] - peak[i] * (1 - b[i, j] + p.get((i, j), 0)),
                    f"load_{n}_{i}_{j}",
                )
            prob += amount[j] + pulp.lpSum(w.values()) <= model.flat_capacity[key], f"cap_{n}_{j}"
    # GPU pools: two jobs whose chunks share a GPU run one after the other
    for n, on_gpu in enumerate(model.gpu_users.values()):
        on: dict[int, pulp.LpAffineExpression] = {}
        for i, m in on_gpu:
            on[i] = on.get(i, 0) + x[i, m]
        for i, j in itertools.combinations(sorted(on), 2):
            if (i, j) in p:
                prob += p[i, j] + p[j, i] >= on[i] + on[j] - 1, f"gpu_{n}_{i}_{j}"

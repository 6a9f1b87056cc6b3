"""What every backend answers, and the backend names (injected, never hard-coded past here)."""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum

from tangram.errors import BackendUnavailable, TangramError

BACKENDS = ("cpsat", "pulp-cbc", "pulp-highs")


class NoSchedule(TangramError):
    """The backend found no schedule within its time limit (nothing proved either way)."""


class SolveStatus(StrEnum):
    """What an exact backend proved. The values are the `status` strings of `tangram solve`'s
    and the gap study's JSON."""

    OPTIMAL = "optimal"  # solved to proven optimality within the time limit
    FEASIBLE = "feasible"  # a solution, not proven optimal when the time limit ran out
    INFEASIBLE = "infeasible"  # proven: no solution exists


@dataclass(frozen=True, slots=True)
class RawSolution:
    """A backend's answer in model terms: chosen mode and start tick per job.

    `objective` and `bound` are in the model's own units (ticks for schedules); `bound` is None
    when the backend does not report one (CBC through PuLP).
    """

    status: SolveStatus
    modes: tuple[int, ...]
    starts: tuple[int, ...]
    objective: float
    bound: float | None
    wall_s: float


def check_backend(name: str) -> str:
    if name not in BACKENDS:
        raise TangramError(f"unknown exact backend {name!r} (choose from {', '.join(BACKENDS)})")
    return name


def default_workers() -> int:
    """CP-SAT portfolio size: all cores up to 8 (more workers than cores only slows it)."""
    return max(1, min(8, os.cpu_count() or 1))


def pulp_solver(name: str, time_limit: float):
    """The PuLP solver object for `pulp-cbc` or `pulp-highs`, with the time limit injected."""
    import pulp

    if name == "pulp-cbc":
        with warnings.catch_warnings():  # the bundled CBC binary: deprecated in PuLP 4, works
            warnings.simplefilter("ignore", DeprecationWarning)
            return pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit)
    if name == "pulp-highs":
        solver = pulp.HiGHS(msg=False, timeLimit=time_limit)
        if not solver.available():
            raise BackendUnavailable("pulp-highs needs highspy: pip install highspy")
        return solver
    raise TangramError(f"{name!r} is not a PuLP backend")


def pulp_status(prob) -> SolveStatus:
    """Map PuLP's solution status to optimal / feasible / infeasible (raise when unsolved)."""
    import pulp

    if prob.sol_status == pulp.LpSolutionOptimal:
        return SolveStatus.OPTIMAL
    if prob.sol_status == pulp.LpSolutionIntegerFeasible:
        return SolveStatus.FEASIBLE
    if prob.sol_status == pulp.LpSolutionInfeasible or prob.status == pulp.LpStatusInfeasible:
        return SolveStatus.INFEASIBLE
    raise TangramError(
        f"PuLP found no solution (status {pulp.LpStatus[prob.status]}, "
        f"solution status {prob.sol_status}); raise the time limit"
    )


@contextlib.contextmanager
def quiet_stdout() -> Iterator[None]:
    """Silence native solver banners on fd 1 (HiGHS prints one even with msg=False), so that
    `--json` output stays clean."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def solve_pulp_problem(prob, backend: str, time_limit: float) -> tuple[SolveStatus, float | None]:
    """Solve a PuLP problem quietly; (status, the backend's proven bound or None)."""
    with quiet_stdout():
        prob.solve(pulp_solver(backend, time_limit))
    status = pulp_status(prob)
    bound = None
    model = getattr(prob, "solverModel", None)
    if backend == "pulp-highs" and model is not None:
        bound = float(model.getInfo().mip_dual_bound)
    elif status is SolveStatus.OPTIMAL:
        import pulp

        bound = float(pulp.value(prob.objective))
    return status, bound


def chosen(x: dict, row: int, count: int) -> int:
    """The index c whose binary x[row, c] is set (the largest value, against solver noise)."""
    return max(range(count), key=lambda c: x[row, c].value() or 0.0)

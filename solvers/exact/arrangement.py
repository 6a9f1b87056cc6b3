"""DPArrange, exact, on a real topology (paper Appendix B, docs/architecture.md): the model
(`solvers.exact.arrangement_model`) solved by CP-SAT or PuLP."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from solvers.exact.arrangement_model import (
    ArrangementModel,
    Candidate,
    CapacityGroup,
    ExactArrangement,
    arrangement_model,
    concrete_placements,
)
from solvers.exact.backend import check_backend
from solvers.exact.cpsat_arrangement import solve_arrangement_cpsat
from solvers.exact.pulp_arrangement import solve_arrangement_pulp
from tangram.pools import Pool

__all__ = [
    "ArrangementModel",
    "Candidate",
    "CapacityGroup",
    "ExactArrangement",
    "arrangement_model",
    "concrete_placements",
    "solve_arrangement",
]


def solve_arrangement(
    tasks: Sequence[Mapping[int, float]],
    pool: Pool,
    backend: str = "cpsat",
    node: str | None = None,
    numa_strict: bool = True,
    time_limit: float = 10.0,
) -> ExactArrangement:
    """The exact arrangement of `tasks` on `pool` (not mutated). Raises `Infeasible`."""
    check_backend(backend)
    model = arrangement_model(tasks, pool, node, numa_strict)
    solve = solve_arrangement_cpsat if backend == "cpsat" else solve_arrangement_pulp
    status, chosen, wall = solve(model, backend, time_limit)
    picked = [cands[c] for cands, c in zip(model.candidates, chosen)]
    return ExactArrangement(
        status,
        sum(c.duration for c in picked),
        tuple(c.amount for c in picked),
        concrete_placements(model, chosen, pool),
        wall,
    )

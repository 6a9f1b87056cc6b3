"""Exact solvers (docs/architecture.md §4): the arrangement and the whole-instance schedule in
OR-Tools CP-SAT and PuLP (CBC, HiGHS), and the receding-horizon policies `cpsat` and `pulp`.

Importing this package registers the policies; OR-Tools and PuLP load only when a model is
solved.
"""

from solvers.exact.allocator import CpSatAllocator, ExactAllocator, PulpAllocator
from solvers.exact.arrangement import ExactArrangement, solve_arrangement
from solvers.exact.schedule import Schedule, solve_schedule

__all__ = [
    "CpSatAllocator",
    "ExactAllocator",
    "ExactArrangement",
    "PulpAllocator",
    "Schedule",
    "solve_arrangement",
    "solve_schedule",
]

"""The paper's heuristic: FCFS candidates, greedy eviction, DPArrange, ACT approximation."""

from solvers.heuristic.dparrange import Arrangement, DPTable, dp_arrange

# the policies register themselves on import (`heuristic`, `backfill`, `backfill-srpt`)
from solvers.heuristic import backfill as _backfill  # noqa: F401  isort: skip

__all__ = ["Arrangement", "DPTable", "dp_arrange"]

"""The paper's heuristic: FCFS candidates, greedy eviction, DPArrange, ACT approximation."""

from solvers.heuristic.dparrange import Arrangement, DPTable, dp_arrange

__all__ = ["Arrangement", "DPTable", "dp_arrange"]

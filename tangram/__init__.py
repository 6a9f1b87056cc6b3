"""ARL-Tangram: an action-level resource manager for agentic RL."""

from tangram.actions import Action, Elasticity
from tangram.allocation import Allocator, Assignment, ClusterView, RunningAction, check_assignments
from tangram.errors import (
    ActionFailed,
    BackendUnavailable,
    Infeasible,
    InvariantError,
    TangramError,
    ValidationError,
)
from tangram.pools import ChunkPool, CorePool, FlatPool, Placement, Pool
from tangram.resources import Demand

__all__ = [
    "Action", "ActionFailed", "Allocator", "Assignment", "BackendUnavailable", "ChunkPool",
    "ClusterView", "CorePool", "Demand", "Elasticity", "FlatPool", "Infeasible",
    "InvariantError", "Placement", "Pool", "RunningAction", "TangramError", "ValidationError",
    "check_assignments",
]

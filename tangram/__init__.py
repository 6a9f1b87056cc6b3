"""ARL-Tangram: an action-level resource manager for agentic RL."""

from tangram.actions import Action, Elasticity
from tangram.allocation import Allocator, Assignment, ClusterView, RunningAction, check_assignments
from tangram.errors import (
    ActionFailed,
    BackendUnavailable,
    Infeasible,
    InvariantError,
    NotFound,
    TangramError,
    ValidationError,
)
from tangram.pools import ChunkPool, CorePool, FlatPool, Placement, Pool
from tangram.resources import Demand
from tangram.results import Result

__all__ = [
    "Action", "ActionFailed", "Allocator", "Assignment", "BackendUnavailable", "ChunkPool",
    "ClusterView", "CorePool", "Demand", "Elasticity", "FlatPool", "Infeasible",
    "InvariantError", "NotFound", "Placement", "Pool", "Result", "RunningAction", "Tangram",
    "TangramClient", "TangramError", "ValidationError", "check_assignments",
]


def __getattr__(name: str):
    # the runtime pulls in managers and solvers: load it only when asked for
    if name == "Tangram":
        from tangram.runtime import Tangram

        return Tangram
    if name == "TangramClient":
        from tangram.client import TangramClient

        return TangramClient
    raise AttributeError(name)

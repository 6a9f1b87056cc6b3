"""ARL-Tangram: an action-level resource manager for agentic RL.

Importing `tangram` loads only the core (actions, demands, pools, the allocation interface,
errors, results). `Tangram` and `TangramClient` live in the runtime layer
(`tangram.runtime`), loaded on first use so that the core never pulls in managers or solvers.
"""

from typing import Any

from tangram.actions import Action, Elasticity
from tangram.allocation import Allocator, Assignment, ClusterView, RunningAction, check_assignments
from tangram.errors import (
    ActionFailed,
    BackendUnavailable,
    Infeasible,
    InvariantError,
    NodeLost,
    NotFound,
    QueueFull,
    ShuttingDown,
    TangramError,
    ValidationError,
)
from tangram.pools import ChunkPool, CorePool, FlatPool, Placement, Pool
from tangram.resources import Demand
from tangram.results import Result, Status

__all__ = [
    "Action",
    "ActionFailed",
    "Allocator",
    "Assignment",
    "BackendUnavailable",
    "ChunkPool",
    "ClusterView",
    "CorePool",
    "Demand",
    "Elasticity",
    "FlatPool",
    "Infeasible",
    "InvariantError",
    "NodeLost",
    "NotFound",
    "Placement",
    "Pool",
    "QueueFull",
    "Result",
    "RunningAction",
    "ShuttingDown",
    "Status",
    "Tangram",
    "TangramClient",
    "TangramError",
    "ValidationError",
    "check_assignments",
]

_RUNTIME_NAMES = ("Tangram", "TangramClient")


def __getattr__(name: str) -> Any:
    # the runtime layer sits above this package: load it only when one of its names is asked for
    if name in _RUNTIME_NAMES:
        import tangram.runtime

        return getattr(tangram.runtime, name)
    raise AttributeError(f"module 'tangram' has no attribute {name!r}")

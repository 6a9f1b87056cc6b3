"""The exact receding-horizon policy for the small sizes of Fig. 8 and Fig. 9, when importable."""

from __future__ import annotations

from evaluation.closedloop import Policy
from solvers import get_allocator


def exact_policy(time_limit: float = 0.5) -> tuple[Policy | None, str]:
    """(the `cpsat` policy, "") or (None, why it is skipped)."""
    try:
        return Policy("exact", get_allocator("cpsat", time_limit=time_limit, window=6)), ""
    except Exception as exc:
        return None, f"exact policy skipped: {type(exc).__name__}: {exc}"


# the small AI-coding instance the exact policy runs on (a few trajectories, few cores)
SMALL = {
    "batch": 4,
    "nodes": 1,
    "cores_per_node": 8,
    "turns_mean": 4.0,
    "turns_cap": 8,
    "reward_dops": (1, 2, 4, 8),
}

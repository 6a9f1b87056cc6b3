"""The router's placement of actions that wait for a node: a trajectory's first CPU action, and
every CPU action behind it (FCFS on the cores, as one scheduler's scan)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping

from tangram.actions import Action
from tangram.errors import Infeasible
from tangram.pools import Pool
from tangram.sharding import ShardLayout


def place_pending(pending: deque[Action], layout: ShardLayout, bindings: Mapping,
                  pools: Mapping[str, Pool], bind: Callable[[str, str, str], None],
                  to_shard: Callable[[int, Action], None]) -> None:
    """Route the actions waiting for a node, in arrival order, as the FCFS scan would see
    them: a trajectory's first CPU action goes to the node with the most free units that holds
    it (not counting what the shards still queue), a bound one to its shard; the first unbound
    one that fits nowhere blocks every one behind it, bound or not."""
    scratch = {r: pools[r].copy() for r in layout.resources}
    blocked: dict[str, set[str]] = {}
    while pending:
        act = pending[0]
        i = layout.route(act, bindings)
        if i is not None:  # bound: its shard decides; it holds its node for those behind
            for r, k in act.mins.items():
                node = bindings[(act.trajectory, r)]
                if node in blocked.get(r, ()) or scratch[r].fits(k, node) is None:
                    blocked.setdefault(r, set()).add(node)
                else:
                    scratch[r].place(k, node)
        else:
            nodes = {}
            for r, k in act.mins.items():
                try:
                    nodes[r] = scratch[r].place(k, None, blocked.get(r, ())).node
                except Infeasible:
                    return
            if act.trajectory is not None:  # else the shard places it on any of its nodes
                for r, n in nodes.items():
                    bind(act.trajectory, r, n)
            i = layout.shard_of(next(iter(nodes.values())))
        pending.popleft()
        to_shard(i, act)

"""The router's placement of actions that wait for a node: a trajectory's first CPU action, and
every CPU action behind it (FCFS on the cores, as one scheduler's scan)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping

from tangram.actions import Action
from tangram.errors import Infeasible
from tangram.pools import Pool
from tangram.sharding import ShardLayout


def _hold(
    act: Action, nodes: Mapping[str, str], scratch: Mapping[str, Pool], blocked: dict[str, set[str]]
) -> None:
    """An action ahead in FCFS order holds its minimum on its node, or blocks the node for
    those behind it when it does not fit there."""
    for r, k in act.mins.items():
        node = nodes[r]
        if node in blocked.get(r, ()) or scratch[r].fits(k, node) is None:
            blocked.setdefault(r, set()).add(node)
        else:
            scratch[r].place(k, node)


def place_pending(
    pending: deque[Action],
    layout: ShardLayout,
    bindings: Mapping,
    pools: Mapping[str, Pool],
    bind: Callable[[str, str, str], None],
    to_shard: Callable[[int, Action], None],
    queued: Iterable[Action] = (),
) -> None:
    """Route the actions waiting for a node, in arrival order, as the FCFS scan would see
    them, behind what the shards already queue (`queued`, each holding its minimum on its
    node, or blocking the node when it does not fit): a first action (a trajectory's, or one
    with no trajectory) goes to the node with the most free units left that holds it, and only
    when one does, so it reaches a shard that can start it now; a bound one goes to its shard;
    the first unbound one that fits nowhere blocks every one behind it, bound or not."""
    scratch = {r: pools[r].copy() for r in layout.resources}
    blocked: dict[str, set[str]] = {}
    for act in queued:
        nodes = {r: bindings.get((act.trajectory, r)) for r in act.mins}
        if all(nodes.values()):  # an unbound one in a shard: placed there at its turn
            _hold(act, nodes, scratch, blocked)
    need = _largest_minimums(pending)
    while pending:
        act = pending[0]
        i = layout.route(act, bindings)
        if i is not None:  # bound: its shard decides; it holds its node for those behind
            _hold(act, {r: bindings[(act.trajectory, r)] for r in act.mins}, scratch, blocked)
        else:
            nodes = {}
            for r, k in act.mins.items():
                # a trajectory is bound where its first action goes: a node that also holds
                # the largest minimum of the trajectory's actions waiting behind it
                big = need.get((act.trajectory, r), k)
                small = [n for n in scratch[r].nodes() if scratch[r].capacity(n) < big]
                try:
                    nodes[r] = scratch[r].place(k, None, {*blocked.get(r, ()), *small}).node
                except Infeasible:
                    return
            if act.trajectory is not None:  # else the shard places it on any of its nodes
                for r, n in nodes.items():
                    bind(act.trajectory, r, n)
            i = layout.shard_of(next(iter(nodes.values())))
        pending.popleft()
        to_shard(i, act)


def _largest_minimums(pending: Iterable[Action]) -> dict[tuple[str, str], int]:
    """(trajectory, resource) -> the largest minimum of the trajectory's waiting actions."""
    need: dict[tuple[str, str], int] = {}
    for act in pending:
        if act.trajectory is not None:
            for r, k in act.mins.items():
                key = (act.trajectory, r)
                need[key] = max(need.get(key, 0), k)
    return need

"""Which scheduler shard decides an action (pure routing; the processes are in
`tangram.runtime.shards`).

CPU is scheduled per node (paper 4.2), so the per-node core pools split into shards, each owning
a contiguous group of nodes: their queue classes, their core state and their running actions.
Everything pooled across nodes (GPU chunks, API limits) stays on one global shard. An action is
routed by its trajectory's bound node: to that node's shard when all of its resources are the
sharded core pools, to the global shard when none is. A trajectory's first CPU action has no
node yet; the router binds it first (where the pool would place it), so every action a shard sees
is bound to one of its nodes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from tangram.actions import Action
from tangram.errors import ValidationError

GLOBAL = -1  # the shard index of the global shard (pooled resources)


@dataclass(frozen=True)
class ShardLayout:
    """`groups[i]`: the nodes shard i owns (of the sharded resources `resources`)."""

    resources: tuple[str, ...]
    groups: tuple[tuple[str, ...], ...]
    _of: dict[str, int] = field(init=False, repr=False, compare=False)

    @classmethod
    def contiguous(cls, resources: Sequence[str], nodes: Sequence[str], shards: int) -> ShardLayout:
        """`shards` groups of consecutive nodes, sizes differing by at most one."""
        if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
            raise ValidationError("shards", shards, "must be an integer >= 1")
        if shards > len(nodes):
            raise ValidationError("shards", shards, f"more shards than the {len(nodes)} nodes")
        q, r = divmod(len(nodes), shards)
        groups, at = [], 0
        for i in range(shards):
            n = q + (i < r)
            groups.append(tuple(nodes[at : at + n]))
            at += n
        return cls(tuple(resources), tuple(groups))

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for g in self.groups:
            for n in g:
                if n in seen:
                    raise ValidationError("shards.groups", n, "node in two shards")
                seen.add(n)
        object.__setattr__(self, "_of", {n: i for i, g in enumerate(self.groups) for n in g})

    def shard_of(self, node: str) -> int:
        i = self._of.get(node)
        if i is None:
            raise ValidationError("node", node, "owned by no shard")
        return i

    def route(self, action: Action, node_of: Mapping[tuple[str, str], str]) -> int | None:
        """The shard deciding `action`: its bound node's shard, `GLOBAL` when it needs no
        sharded resource, None when it needs one but its trajectory is not bound yet."""
        mins = action.mins
        if len(mins) == 1:  # the common case, in O(1): one resource
            for r in mins:
                if r not in self.resources:
                    return GLOBAL
                node = node_of.get((action.trajectory, r)) if action.trajectory else None
                return None if node is None else self.shard_of(node)
        sharded = [r for r in mins if r in self.resources]
        if not sharded:
            return GLOBAL
        if len(sharded) != len(action.mins):
            raise ValidationError(
                f"action[{action.id}].demands",
                sorted(action.mins),
                "a sharded scheduler decides a node's cores and pooled "
                f"resources apart; {sharded} cannot go with the rest",
            )
        owners = set()
        for r in sharded:
            node = node_of.get((action.trajectory, r)) if action.trajectory else None
            if node is None:
                return None
            owners.add(self.shard_of(node))
        if len(owners) > 1:
            raise ValidationError(
                f"action[{action.id}].trajectory", action.trajectory, "bound to nodes of two shards"
            )
        return owners.pop()

"""What the router shows of its shards: every queued action as one read-only queue, and the
error a lost shard's actions fail with."""

from __future__ import annotations

from tangram.actions import Action
from tangram.errors import TangramError


class QueueView:
    """The queued actions of every shard, read-only, as `ActionQueue` reads: in arrival order
    per shard when iterated, by id through `keys`, `values`, `items`, `get` and `in`."""

    def __init__(self, actions: dict[str, Action]) -> None:
        self._all = actions

    def __len__(self) -> int:
        return len(self._all)

    def __bool__(self) -> bool:
        return bool(self._all)

    def __iter__(self):
        return iter(self._all.values())

    def __contains__(self, item: object) -> bool:
        return (self._all.get(item.id) is item) if isinstance(item, Action) else item in self._all

    def get(self, action_id: str) -> Action | None:
        return self._all.get(action_id)

    def keys(self):
        return self._all.keys()

    def values(self):
        return self._all.values()

    def items(self):
        return self._all.items()


class ShardLost(TangramError):
    """A shard process died and could not be replaced: its queued actions fail with this."""

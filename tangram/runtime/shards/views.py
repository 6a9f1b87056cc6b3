"""What the router shows of its shards: every queued action as one read-only queue, and the
error a lost shard's actions fail with."""

from __future__ import annotations

from collections.abc import Callable

from tangram.actions import Action
from tangram.errors import TangramError


class QueueView:
    """The queued actions of every shard, read-only, as `ActionQueue` reads: in arrival order
    per shard when iterated, by id through `keys`, `values`, `items`, `get` and `in`.
    `actions`: the actions by id, or what builds them when first read (`size`: their count,
    so that counting builds nothing)."""

    def __init__(
        self, actions: dict[str, Action] | Callable[[], dict[str, Action]], size: int | None = None
    ) -> None:
        self._build = actions if callable(actions) else None
        self._actions = None if callable(actions) else actions
        self._size = len(actions) if size is None and not callable(actions) else size

    @property
    def _all(self) -> dict[str, Action]:
        if self._actions is None:
            self._actions = self._build()
        return self._actions

    def __len__(self) -> int:
        return len(self._all) if self._size is None else self._size

    def __bool__(self) -> bool:
        return len(self) > 0

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

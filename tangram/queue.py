"""The scheduler's queue: actions in arrival order, indexed by the (resource, node) they wait on.

The FCFS scan (paper Algorithm 1, step 1) walks the queue in order and stops considering a pool
(or one node of it) once an action there does not fit: nothing behind it on that pool may
overtake it. With one queue list that walk costs the whole queue on every decision whenever some
pool is never blocked (an idle node while another node is busy): quadratic in the queue. Here
each action sits in one *class* per resource it needs, `(resource, node)` for an action bound to
a node of a per-node pool and `(resource, None)` otherwise, and `scan` merges the classes in
arrival order, dropping a class as soon as it is blocked. A decision then visits the actions that
can still start plus one per blocked class, not the queue.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator

from tangram.actions import Action

Class = tuple[str, str | None]


class ActionQueue:
    """Insertion-ordered queue of actions with per-class order kept alongside.

    `visited` counts the actions `scan` has yielded since creation (a cost measure the benches
    and tests read)."""

    __slots__ = ("_all", "_seq", "_classes", "_of", "_next", "visited")

    def __init__(self) -> None:
        self._all: dict[str, Action] = {}
        self._seq: dict[str, int] = {}
        self._classes: dict[Class, dict[str, Action]] = {}
        self._of: dict[str, tuple[Class, ...]] = {}
        self._next = 0
        self.visited = 0

    # -- the mapping the scheduler and the policies read ---------------------------------------
    def __len__(self) -> int:
        return len(self._all)

    def __bool__(self) -> bool:
        return bool(self._all)

    def __contains__(self, item: object) -> bool:
        """By id, or by the action itself."""
        if isinstance(item, Action):
            return self._all.get(item.id) is item
        return item in self._all

    def __iter__(self) -> Iterator[Action]:
        """The queued actions in arrival order (a policy's `queue` argument)."""
        return iter(self._all.values())

    def get(self, action_id: str) -> Action | None:
        return self._all.get(action_id)

    def values(self):
        return self._all.values()

    def keys(self):
        return self._all.keys()

    def items(self):
        return self._all.items()

    def classes(self) -> Iterable[Class]:
        """The classes some queued action waits in."""
        return self._classes.keys()

    def has_class(self, c: Class) -> bool:
        return c in self._classes

    def classes_of(self, action_id: str) -> tuple[Class, ...]:
        return self._of[action_id]

    def copy(self) -> ActionQueue:
        """An independent queue of the same actions in the same order (what a policy running
        off the event loop reads while the live queue changes)."""
        q = ActionQueue()
        q._all, q._seq, q._of = dict(self._all), dict(self._seq), dict(self._of)
        q._classes = {c: dict(m) for c, m in self._classes.items()}
        q._next = self._next
        return q

    # -- changes ---------------------------------------------------------------------------------
    def add(self, action: Action, classes: Iterable[Class]) -> None:
        cls = tuple(dict.fromkeys(classes))
        self._all[action.id] = action
        self._seq[action.id] = self._next
        self._next += 1
        self._of[action.id] = cls
        for c in cls:
            self._classes.setdefault(c, {})[action.id] = action

    def remove(self, action_id: str) -> Action | None:
        action = self._all.pop(action_id, None)
        if action is None:
            return None
        del self._seq[action_id]
        for c in self._of.pop(action_id):
            members = self._classes[c]
            del members[action_id]
            if not members:
                del self._classes[c]
        return action

    # -- the scan --------------------------------------------------------------------------------
    def scan(
        self, blocked: Callable[[Class], bool], only: Iterable[Class] | None = None
    ) -> Iterator[Action]:
        """Actions in arrival order, skipping every class for which `blocked(class)` holds when
        the walk reaches it (the caller blocks classes while it consumes the iterator). An action
        in several classes (a vector action) is yielded once, when the walk reaches it in a class
        that is not blocked, even if another of its classes is: it waits behind that one, and
        the caller blocks its other classes for what comes after it (FCFS on every pool it
        needs, as on a plain sequence of the same actions). `only` restricts the walk to those
        classes."""
        keys = list(self._classes) if only is None else [c for c in only if c in self._classes]
        if len(keys) == 1:  # the common case: one pool, one node; no merge needed
            c = keys[0]
            for a in self._classes[c].values():
                if blocked(c):
                    return
                self.visited += 1
                yield a
            return
        current: dict[int, Action] = {}
        heap: list[tuple[int, int, Iterator[Action]]] = []
        for i, c in enumerate(keys):
            it = iter(self._classes[c].values())
            first = next(it)  # classes are never empty
            current[i] = first
            heap.append((self._seq[first.id], i, it))
        heapq.heapify(heap)
        last_seq = -1
        while heap:
            seq, i, rest = heapq.heappop(heap)
            c = keys[i]
            if blocked(c):
                continue  # the whole class is dropped
            a = current[i]
            if seq != last_seq:  # an action of several classes comes up once per class
                last_seq = seq
                self.visited += 1
                yield a
            nxt = next(rest, None)
            if nxt is not None:
                current[i] = nxt
                heapq.heappush(heap, (self._seq[nxt.id], i, rest))

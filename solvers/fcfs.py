"""The FCFS candidate scan shared by every queue-order policy (paper Algorithm 1, step 1).

Walk the queue in order, placing each action at its minimum demands on scratch copies of the
pools (so the *topology* must hold it, not only the sums). An action that does not fit blocks
the pools it needs; a later action is passed over (may overtake) only when it shares no blocked
pool with an earlier action that did not fit. So a full GPU pool never stalls CPU actions, and no
action overtakes one it contends with (no starvation). CPU pools block per node where an
action's node is known (its trajectory's environment), otherwise the whole resource.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass

from tangram.actions import Action
from tangram.allocation import ClusterView
from tangram.errors import Infeasible
from tangram.pools import Placement, Pool
from tangram.queue import ActionQueue

ALL = None  # blocked value meaning: every node of the resource
Blocked = dict[str, set[str] | None]  # resource -> its blocked nodes, or ALL


class ScratchPools(Mapping[str, Pool]):
    """Copy-on-first-access view of the cluster's pools, so a decision copies only what it uses."""

    __slots__ = ("_src", "_copies")

    def __init__(self, src: Mapping[str, Pool]) -> None:
        self._src = src
        self._copies: dict[str, Pool] = {}

    def __getitem__(self, r: str) -> Pool:
        p = self._copies.get(r)
        if p is None:
            p = self._copies[r] = self._src[r].copy()
        return p

    def __iter__(self) -> Iterator[str]:
        return iter(self._src)

    def __len__(self) -> int:
        return len(self._src)


@dataclass(slots=True)
class Candidate:
    action: Action
    units: dict[str, int]
    placement: dict[str, Placement]


def _prefer(view: ClusterView, action: Action, resource: str):
    """The pool's advisor's preference as `Pool.place` takes it, or None."""
    adv = view.advisor(resource)
    if adv is None:
        return None
    return lambda node, chunk: adv.prefer(action, node, chunk)


def deferred(
    view: ClusterView, action: Action, placed: Mapping[str, Placement], now: float
) -> bool:
    """True when the advisor of a pool `action` was placed on would rather it waited."""
    for r, p in placed.items():
        adv = view.advisor(r)
        if adv is not None and adv.defer(action, p, view, now):
            return True
    return False


def scan_candidates(
    view: ClusterView,
    queue: Collection[Action],
    pools: Mapping[str, Pool],
    now: float = 0.0,
    *,
    amounts: Callable[[Action], Mapping[str, int]] | None = None,
    exclude: Callable[[Action, str], Collection[str]] | None = None,
    advised: bool = True,
) -> list[Candidate]:
    """Candidates at minimum demands (or at `amounts(action)`, a fixed-amount policy's),
    placed (tentatively) on `pools`, in queue order; `exclude(action, resource)` names nodes
    the action may not use (a baseline's partition).

    An action a pool's advisor defers (`PlacementAdvisor.defer`: better to wait for a busy
    resident copy of its service than to restore one now) is left queued without blocking
    anything behind it; `advised=False` ignores the advisors' waiting (a baseline that does not
    wait), not their preference.
    """
    blocked: Blocked = {}
    fully = 0
    # the scan can stop once every resource that some queued action needs is blocked
    needed = view.queued_resources if view.queued_resources is not None else view.pools
    n_res = len(needed)
    out: list[Candidate] = []

    def is_blocked(c: tuple[str, str | None]) -> bool:
        r, node = c
        if r not in blocked:
            return False
        b = blocked[r]
        return b is ALL or (node is not None and node in b)  # type: ignore[operator]

    # an indexed queue skips whole blocked (resource, node) classes; a plain one is walked
    walk = queue.scan(is_blocked, view.scope) if isinstance(queue, ActionQueue) else queue
    for a in walk:
        if fully == n_res:
            break
        mins = a.mins if amounts is None else amounts(a)
        placed = (
            None
            if blocked and _waits_behind(view, a, mins, blocked)
            else _place_all(view, a, mins, pools, blocked, exclude)
        )
        if placed is not None and advised and deferred(view, a, placed, now):
            _release(pools, placed, mins)
        elif placed is not None:
            out.append(Candidate(a, dict(mins), placed))
        else:
            fully += _block(view, a, mins, blocked, needed)
    return out


def _waits_behind(view: ClusterView, a: Action, mins: Mapping[str, int], blocked: Blocked) -> bool:
    """Whether `a` must wait behind an earlier action that did not fit (FCFS per pool)."""
    for r in mins:
        if r in blocked:
            b = blocked[r]
            if b is ALL:
                return True
            node = view.node_for(a, r)
            # unbound: may still go to an unblocked node; bound to a blocked node: wait
            if node is not None and node in b:  # type: ignore[operator]
                return True
    return False


def _place_all(
    view: ClusterView,
    a: Action,
    mins: Mapping[str, int],
    pools: Mapping[str, Pool],
    blocked: Blocked,
    exclude: Callable[[Action, str], Collection[str]] | None,
) -> dict[str, Placement] | None:
    """Place every resource of `a` at `mins` off the blocked nodes (None: some did not fit,
    and what was placed is released)."""
    placed: dict[str, Placement] = {}
    for r, k in mins.items():
        b = blocked.get(r) or ()
        if exclude is not None:
            b = {*b, *exclude(a, r)}
        try:
            placed[r] = pools[r].place(k, view.node_for(a, r), b, _prefer(view, a, r))
        except Infeasible:
            _release(pools, placed, mins)
            return None
    return placed


def _release(
    pools: Mapping[str, Pool], placed: Mapping[str, Placement], mins: Mapping[str, int]
) -> None:
    for r, p in placed.items():
        pools[r].release(p, mins[r])


def _block(
    view: ClusterView, a: Action, mins: Mapping[str, int], blocked: Blocked, needed: Collection[str]
) -> int:
    """Block what `a` waits for (its bound node, or the whole pool); returns how many of the
    `needed` resources became wholly blocked."""
    fully = 0
    for r in mins:
        if blocked.get(r, 0) is ALL:
            continue
        node = view.node_for(a, r)
        nodes = blocked.setdefault(r, set())
        if node is not None and view.pools[r].per_node:
            nodes.add(node)  # type: ignore[union-attr]
        if node is None or not view.pools[r].per_node or len(nodes) >= len(view.pools[r].nodes()):  # type: ignore[arg-type]
            blocked[r] = ALL
            fully += r in needed
    return fully

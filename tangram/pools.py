"""Pool state: the free/used units of one resource type over its nodes (pure, no side effects).

Three topologies: `FlatPool` (interchangeable units per node: API slots, memory), `CorePool`
(cores grouped by NUMA domain per node; CPU is scheduled per node) and `ChunkPool` (a buddy chunk
tree per GPU node; chunks are pooled across nodes for the DP). Policies copy a pool and try
placements on the copy; the scheduler applies the final placements with `take`, which refuses
anything that breaks an invariant.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from tangram.errors import Infeasible, ValidationError
from topology import ChunkOperator, ChunkTree, CpuNode, FlatOperator, TopologyError, is_pow2

if TYPE_CHECKING:
    from tangram.actions import Action


@dataclass(frozen=True, slots=True)
class Placement:
    """Where units were granted: the node, and the concrete cores or GPU chunk."""

    node: str
    cores: tuple[int, ...] = ()
    chunk: tuple[int, int] | None = None


class DecisionView(Protocol):
    """What a placement advisor reads of one decision: the running actions and the duration
    model. `tangram.allocation.ClusterView`, the view the policies hand an advisor, is one; it
    is named here by what is read because the allocation interface is built on the pools, so
    the pools do not import it."""

    @property
    def running(self) -> Collection[Any]:
        """The running actions (`tangram.allocation.RunningAction`)."""

    @property
    def estimate(self) -> Callable[[Action, int | None], float]:
        """The duration model: (action, units) -> seconds."""


class PlacementAdvisor(ABC):
    """What the manager of one pool advises the policy about placing on it (the GPU manager's
    residency cache: prefer a chunk where the action's service is resident, and rather wait for
    a busy resident copy than restore one). Set on the pool where the pool is built
    (`Pool.advisor`), so two pools never share or overwrite each other's advice; a pool without
    an advisor is placed by its own rule and never defers."""

    @abstractmethod
    def prefer(self, action: Action, node: str, chunk: tuple[int, int]) -> float:
        """Score of placing `action` on `chunk` of `node` among equal choices; higher wins."""

    @abstractmethod
    def defer(self, action: Action, placement: Placement, view: DecisionView, now: float) -> bool:
        """True when `action` should rather wait than start on `placement` now. A deferred
        action blocks nothing behind it (its units are free for others)."""


class Pool(ABC):
    """One resource type over its nodes."""

    resource: str
    per_node: bool  # True: the DP groups actions per node (CPU); False: pooled (GPU chunks)
    advisor: PlacementAdvisor | None = None  # the pool's manager's advice; kept by `copy`

    @abstractmethod
    def nodes(self) -> list[str]: ...
    @abstractmethod
    def capacity(self, node: str | None = None) -> int: ...
    @abstractmethod
    def free(self, node: str | None = None) -> int: ...
    @abstractmethod
    def largest_request(self) -> int:
        """The largest single amount that could ever be placed (on an empty pool)."""

    @abstractmethod
    def fits(self, k: int, node: str | None = None, exclude: Collection[str] = ()) -> str | None:
        """A node where k units fit now (`node` if given), or None."""

    @abstractmethod
    def place(
        self,
        k: int,
        node: str | None = None,
        exclude: Collection[str] = (),
        prefer: Callable[[str, tuple[int, int]], float] | None = None,
    ) -> Placement:
        """Choose and take k units; raises `Infeasible` when they do not fit."""

    @abstractmethod
    def take(self, placement: Placement, k: int) -> None:
        """Take exactly this placement; raises `TopologyError` when any part is not free."""

    @abstractmethod
    def release(self, placement: Placement, k: int) -> None: ...
    @abstractmethod
    def operator(self, node: str | None = None) -> FlatOperator | ChunkOperator: ...
    @abstractmethod
    def copy(self) -> Pool: ...

    def validate_amounts(self, field: str, amounts: Collection[int]) -> None:
        """Reject a demand no placement could ever meet (checked at submission)."""
        if min(amounts) > self.largest_request():
            raise Infeasible(
                f"{field}: needs at least {min(amounts)} {self.resource}, the "
                f"largest placement this cluster has is {self.largest_request()}"
            )


class FlatPool(Pool):
    per_node = True

    def __init__(self, resource: str, units: Mapping[str, int]) -> None:
        self.resource = resource
        for u in units.values():
            if isinstance(u, bool) or not isinstance(u, int) or u < 0:
                raise ValidationError(
                    f"resources.{resource}.units", u, "must be a non-negative integer"
                )
        self._cap = dict(units)
        self._free = dict(units)

    def nodes(self) -> list[str]:
        return list(self._cap)

    def capacity(self, node: str | None = None) -> int:
        return self._cap[node] if node is not None else sum(self._cap.values())

    def free(self, node: str | None = None) -> int:
        return self._free[node] if node is not None else sum(self._free.values())

    def largest_request(self) -> int:
        return max(self._cap.values(), default=0)

    def fits(self, k, node=None, exclude=()):
        if node is not None:
            return node if self._free.get(node, -1) >= k and node not in exclude else None
        best, best_free = None, -1
        for n, f in self._free.items():
            if f >= k and f > best_free and n not in exclude:
                best, best_free = n, f
        return best

    def place(self, k, node=None, exclude=(), prefer=None):
        n = self.fits(k, node, exclude)
        if n is None:
            raise Infeasible(f"{self.resource}: {k} units do not fit")
        self._free[n] -= k
        return Placement(n)

    def take(self, placement, k):
        f = self._free.get(placement.node)
        if f is None:
            raise TopologyError(f"{self.resource}: no node {placement.node!r}")
        if k > f:
            raise TopologyError(f"{self.resource}@{placement.node}: {k} units over the {f} free")
        self._free[placement.node] = f - k

    def release(self, placement, k):
        f = self._free[placement.node] + k
        if f > self._cap[placement.node]:
            raise TopologyError(f"{self.resource}@{placement.node}: released above capacity")
        self._free[placement.node] = f

    def operator(self, node=None):
        return FlatOperator(self.free(node))

    def copy(self):
        p = FlatPool.__new__(FlatPool)
        p.resource, p._cap, p._free = self.resource, self._cap, dict(self._free)
        p.advisor = self.advisor
        return p


class CorePool(Pool):
    per_node = True

    def __init__(self, resource: str, nodes: Mapping[str, CpuNode]) -> None:
        self.resource = resource
        self._nodes = dict(nodes)
        self._free = {n: c.free_count() for n, c in self._nodes.items()}
        self._own: set[str] = set(self._nodes)  # nodes not shared with a copy

    def _mine(self, node: str) -> CpuNode:
        """The node's core state, copied first if a copy of this pool still shares it: `copy`
        shares every node (a decision's scratch copy touches a few of a cluster's nodes) and
        whichever side changes a shared node first gets its own."""
        c = self._nodes[node]
        if node not in self._own:
            c = self._nodes[node] = c.copy()
            self._own.add(node)
        return c

    def cpu_node(self, node: str) -> CpuNode:
        return self._mine(node)

    def add_node(self, node: CpuNode) -> None:
        """Membership: a machine joined; its cores become schedulable (in place, so the
        scheduler holding this pool sees them at its next decision)."""
        if node.name in self._nodes:
            raise ValidationError(f"{self.resource}.nodes", node.name, "already in the pool")
        self._nodes[node.name] = node
        self._own.add(node.name)
        self._free[node.name] = node.free_count()

    def remove_node(self, node: str) -> None:
        """Membership: a machine left. Only an idle node goes (no core of it granted), so no
        running placement ever names a node the pool no longer has."""
        if node not in self._nodes:
            raise ValidationError(f"{self.resource}.nodes", node, "not in the pool")
        granted = self._nodes[node].capacity - self._free[node]
        if granted:
            raise ValidationError(f"{self.resource}.nodes", node, f"{granted} cores still granted")
        del self._nodes[node], self._free[node]
        self._own.discard(node)

    def nodes(self):
        return list(self._nodes)

    def capacity(self, node=None):
        if node is not None:
            return self._nodes[node].capacity
        return sum(c.capacity for c in self._nodes.values())

    def free(self, node=None):
        return self._free[node] if node is not None else sum(self._free.values())

    def largest_request(self):
        return max((c.capacity for c in self._nodes.values()), default=0)

    fits = FlatPool.fits

    def place(self, k, node=None, exclude=(), prefer=None):
        n = self.fits(k, node, exclude)
        if n is None:
            raise Infeasible(f"{self.resource}: {k} cores do not fit")
        cores = self._mine(n).allocate(k)
        self._free[n] -= k
        return Placement(n, cores=cores)

    def take(self, placement, k):
        if placement.node not in self._nodes:
            raise TopologyError(f"{self.resource}: no node {placement.node!r}")
        if len(placement.cores) != k:
            raise TopologyError(f"{self.resource}: {len(placement.cores)} cores for {k} units")
        self._mine(placement.node).take(placement.cores)
        self._free[placement.node] -= k

    def release(self, placement, k):
        self._mine(placement.node).release(placement.cores)
        self._free[placement.node] += k

    def operator(self, node=None):
        return FlatOperator(self.free(node))

    def copy(self):
        p = CorePool.__new__(CorePool)
        p.resource = self.resource
        p._nodes = dict(self._nodes)  # shared until either side changes a node (`_mine`)
        p._own = set()
        self._own = set()
        p._free = dict(self._free)
        p.advisor = self.advisor
        return p


class ChunkPool(Pool):
    per_node = False

    def __init__(self, resource: str, nodes: Mapping[str, ChunkTree]) -> None:
        self.resource = resource
        self._trees = dict(nodes)
        self._retiring: set[str] = set()

    def retire(self, node: str) -> None:
        """Membership: a machine died. Its chunks take no new placement at once; the node
        leaves the pool when its last granted chunk is released (now, if none is)."""
        if node not in self._trees:
            raise ValidationError(f"{self.resource}.nodes", node, "not in the pool")
        self._retiring.add(node)
        self._drop_if_idle(node)

    def _drop_if_idle(self, node: str) -> None:
        t = self._trees[node]
        if node in self._retiring and t.free_gpus() == t.num_gpus:
            del self._trees[node]
            self._retiring.discard(node)

    def tree(self, node: str) -> ChunkTree:
        return self._trees[node]

    def nodes(self):
        return list(self._trees)

    def capacity(self, node=None):
        if node is not None:
            return self._trees[node].num_gpus
        return sum(t.num_gpus for t in self._trees.values())

    def free(self, node=None):
        if node is not None:
            return 0 if node in self._retiring else self._trees[node].free_gpus()
        return sum(t.free_gpus() for n, t in self._trees.items() if n not in self._retiring)

    def largest_request(self):
        return max((t.num_gpus for t in self._trees.values()), default=0)

    def validate_amounts(self, field, amounts):
        for k in amounts:
            if not is_pow2(k):
                raise ValidationError(
                    field,
                    k,
                    "GPU amounts must be powers of two (an action "
                    "of k GPUs takes one aligned chunk of k)",
                )
        super().validate_amounts(field, amounts)

    def _best_level(self, k, node, exclude):
        """Smallest free chunk level >= level(k) over the allowed nodes: (level, nodes at it)."""
        best, at = None, []
        for n, t in self._trees.items():
            if (node is not None and n != node) or n in exclude or n in self._retiring:
                continue
            lv = t.smallest_free_level(k)
            if lv is None:
                continue
            if best is None or lv < best:
                best, at = lv, [n]
            elif lv == best:
                at.append(n)
        return best, at

    def fits(self, k, node=None, exclude=()):
        if not is_pow2(k):
            return None
        _, at = self._best_level(k, node, exclude)
        return at[0] if at else None

    def place(self, k, node=None, exclude=(), prefer=None):
        if not is_pow2(k):
            raise Infeasible(f"{self.resource}: {k} GPUs is not a power of two")
        _, at = self._best_level(k, node, exclude)
        if not at:
            raise Infeasible(f"{self.resource}: no free chunk of {k} GPUs")
        if prefer is None:
            n = at[0]
            return Placement(n, chunk=self._trees[n].allocate(k))
        # among equal-level choices on every node, the highest preference wins
        best = None
        for n in at:
            for chunk in self._trees[n].options(k):
                score = prefer(n, chunk)
                key = (n, chunk[0])
                if best is None or score > best[0] or (score == best[0] and key < best[1:]):
                    best = (score, *key)
        assert best is not None
        _, n, s = best
        self._trees[n].take((s, s + k))
        return Placement(n, chunk=(s, s + k))

    def take(self, placement, k):
        t = self._trees.get(placement.node)
        if t is None:
            raise TopologyError(f"{self.resource}: no node {placement.node!r}")
        if placement.chunk is None or placement.chunk[1] - placement.chunk[0] != k:
            raise TopologyError(f"{self.resource}: chunk {placement.chunk} does not hold {k} GPUs")
        t.take(placement.chunk)

    def release(self, placement, k):
        assert placement.chunk is not None
        self._trees[placement.node].release(placement.chunk)
        if self._retiring:
            self._drop_if_idle(placement.node)

    def free_chunks(self, node: str | None = None) -> dict[int, int]:
        total: dict[int, int] = {}
        for n, t in self._trees.items():
            if (node is None or n == node) and n not in self._retiring:
                for size, c in t.free_counts().items():
                    total[size] = total.get(size, 0) + c
        return total

    def operator(self, node=None):
        return ChunkOperator(self.free_chunks(node))

    def copy(self):
        p = ChunkPool.__new__(ChunkPool)
        p.resource = self.resource
        p._trees = {n: t.copy() for n, t in self._trees.items()}
        p._retiring = set(self._retiring)
        p.advisor = self.advisor
        return p
